"""The Flower run's timeline (``FEDTAB_FLOWER_TRACE``, :mod:`fedtab.engines.flower_trace`) and the server
app's preparation while the sites connect (:func:`fedtab.engines.server_apps.start_prepare`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedtab.engines import flower, flower_trace  # noqa: E402
from fedtab.engines.server_apps import prepare_of, server_app, start_prepare  # noqa: E402

from tests.builders import write_classification_sites  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("trace_sites"), 300, 8, 3, 2, table_seed=3, split_seed=0)


@pytest.fixture
def trace_dir(tmp_path, monkeypatch):
    folder = tmp_path / "trace"
    monkeypatch.setenv(flower_trace.ENV, str(folder))
    monkeypatch.setattr(flower_trace, "_TRACERS", {})  # this process's tracers, made afresh from the variable
    return folder


def test_without_the_variable_nothing_is_traced(monkeypatch, tmp_path):
    monkeypatch.delenv(flower_trace.ENV, raising=False)
    monkeypatch.setattr(flower_trace, "_TRACERS", {})
    assert flower_trace.tracer("clientapp") is None and flower_trace.tracer("serverapp") is None


def test_an_in_process_run_writes_each_exchange_on_both_sides(site_configs, trace_dir):
    app = flower.make_server_app(lambda fed, cfg: {"replies": sorted(fed.ask({s: flower.Message("__hello__")
                                                                             for s in fed.sites}))})
    assert flower.run_in_process(site_configs, {}, app=app)["replies"] == ["site-1", "site-2", "site-3"]
    events = flower_trace.read_trace(trace_dir)
    server = [e for e in events if e["role"] == "serverapp"]
    client = [e for e in events if e["role"] == "clientapp"]
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    names = [e["event"] for e in server]
    assert names[:2] == ["process_start", "main_start"] and names[-1] == "main_end"
    pushes = [e for e in server if e["event"] == "push"]
    assert len(pushes) == 2 and all(len(e["nodes"]) == 3 for e in pushes)  # the naming hello, the app's own ask
    pulled = [n for e in server if e["event"] == "pulled" for n in e["nodes"]]
    assert sorted(pulled) == sorted(pushes[0]["nodes"] * 2)  # every node answered both
    ends = [e for e in client if e["event"] == "handler_end"]
    assert len(ends) == 6 and {e["kind"] for e in ends} == {"__hello__"} and not any(e["error"] for e in ends)
    assert sum(e["event"] == "handler_start" for e in client) == 6
    assert all(e["cpu"] >= 0 and e["pid"] > 0 for e in events)


def test_an_unwritable_trace_folder_never_fails_a_message(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    tracer = flower_trace.Tracer.__new__(flower_trace.Tracer)  # a folder that cannot be created: writes are dropped
    tracer.role, tracer.path, tracer._started = "clientapp", blocker / "sub" / "c.jsonl", False
    tracer.event("handler_start")
    assert not (blocker / "sub").exists()


def test_a_server_apps_prepare_runs_once_in_a_thread_and_its_errors_are_ignored():
    seen = []

    @server_app(prepare=lambda cfg: seen.append(dict(cfg)))
    def app(federation, run_config, emit=None):
        return {}

    @server_app(prepare=lambda cfg: 1 / 0)
    def broken(federation, run_config, emit=None):
        return {}

    @server_app
    def plain(federation, run_config, emit=None):
        return {}

    start_prepare(app, {"job": "x"})()
    assert seen == [{"job": "x"}]
    start_prepare(broken, {})()  # raises nothing: the app reports a bad run config itself
    assert prepare_of(plain) is None and start_prepare(plain, {})() is None


def test_the_job_server_app_reaches_its_first_request_without_importing_once_prepared(jobs):
    """The ServerApp side of the lean path: importing the Flower engine and loading the job's server
    app imports none of pandas/scikit-learn/scipy/pyarrow/torch, nor does the job's preparation
    (:func:`start_prepare`: its step loop and its plan's checks, a named selector checked without building
    it), nor anything between the hello and the first step's request."""
    from fedtab.job.apps import engine_config

    cfg = engine_config(jobs.plan(election={"freedom_degree": 0.5}, training={"rounds": 1, "local_epochs": 1}))
    code = textwrap.dedent("""
        import json, sys
        import fedtab.engines.flower
        from fedtab.engines.server_apps import load_server_app, start_prepare
        from fedtab.federation.protocol import Federation
        HEAVY = {"pandas", "sklearn", "scipy", "pyarrow", "torch"}
        heavy = lambda: sorted({m.split(".")[0] for m in sys.modules} & HEAVY)
        cfg = json.loads(sys.argv[1])
        app = load_server_app(cfg["server-app"])
        loaded = heavy()
        start_prepare(app, cfg)()
        prepared, before = heavy(), set(sys.modules)
        class Stop(Exception):
            pass
        class Sites(Federation):
            sites = ["site-1", "site-2", "site-3"]
            def ask(self, requests):
                raise Stop(sorted({r.kind for r in requests.values()}))
        try:
            app(Sites(), cfg, None)
        except Stop as stop:
            first = stop.args[0]
        late = sorted({m.split(".")[0] for m in set(sys.modules) - before} & HEAVY)
        print(json.dumps({"loaded": loaded, "prepared": prepared, "late": late, "first": first}))
    """)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == [] and report["prepared"] == [] and report["late"] == [], report
    assert report["first"] and "ballot" in " ".join(report["first"])
