"""The analyst's side of a Flower deployment: site settings a job may give, the result carried in the run log."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_a_site_takes_only_label_and_selector_from_the_job(caplog):
    """A server may not choose which file a site reads, relax its policy or split its rows (issue 28:
    two runs with two seeds would give two test parts to difference); the node's own keys win."""
    from fedtab.engines.site_config import with_job_settings

    node = {"name": "a", "data-path": "/site/a.csv", "selector": "mutual_info"}
    settings = json.dumps({"a": {"target": "y", "na-values": '["?"]', "selector": "lasso", "test-size": 0.3,
                                 "seed": 4, "folds": 2}, "b": {"data-path": "/etc/passwd"}})
    with caplog.at_level("WARNING", logger="fedtab.site"):
        got = with_job_settings(node, settings)
    assert got == {**node, "target": "y", "na-values": '["?"]'}  # the split is not the job's
    assert "test-size, seed, folds are ignored" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedtab.site"):  # a value equal to the node's own: nothing to say
        assert with_job_settings({**node, "seed": 4}, json.dumps({"a": {"seed": 4}})) == {**node, "seed": 4}
    assert "ignored" not in caplog.text
    assert with_job_settings(node, "") == node
    for hostile in ({"a": {"data-path": "/etc/passwd"}}, {"a": {"test_path": "/x.csv"}}, {"a": {"min-rows": 1}},
                    {"a": {"policy": "{}"}}):
        with pytest.raises(ValueError, match="site 'a' refuses job settings"):
            with_job_settings(node, json.dumps(hostile))
    with pytest.raises(ValueError, match="site-settings"):
        with_job_settings(node, "[1, 2]")
    with pytest.raises(ValueError, match="site-settings"):
        with_job_settings(node, "{not json")


def test_result_log_round_trip_and_refuses_forged_or_damaged_results(monkeypatch):
    """What a hostile site could smuggle into the ServerApp's log (via an error text it logs) is refused."""
    import base64
    import hashlib
    import zlib

    from fedtab.engines import result_log
    from fedtab.engines.result_log import CHUNK, ResultLogError, decode_result, encode_result

    result = {"election": {"selected": ["age", "sex"]}, "w": list(np.random.default_rng(0).normal(size=3000))}
    lines = encode_result(result)
    assert len(lines) > 1 and all(len(line) < CHUNK + 100 for line in lines)
    assert decode_result("INFO: starting\n" + "\n".join(lines) + "\nINFO: done\n") == result
    forged = encode_result({"election": {"selected": ["age"]}})
    with pytest.raises(ResultLogError, match="2 fedtab results"):
        decode_result("\n".join(forged + lines))
    with pytest.raises(ResultLogError, match="repeats"):
        decode_result("\n".join(lines + lines[:1]))
    with pytest.raises(ResultLogError, match="chunks"):
        decode_result("\n".join(lines[1:]))
    tampered = lines[0][:-8] + ("A" if lines[0][-8] != "A" else "B") + lines[0][-7:]
    with pytest.raises(ResultLogError, match="hash"):
        decode_result("\n".join([tampered, *lines[1:]]))
    with pytest.raises(ResultLogError, match="no fedtab result"):
        decode_result("INFO: the run failed\n")
    monkeypatch.setattr(result_log, "MAX_BYTES", 10_000)  # a zip bomb: 20 kB of JSON from a few hundred bytes
    with pytest.raises(ResultLogError, match="larger than"):
        decode_result("\n".join(encode_result({"zeros": [0] * 10_000})))
    payload = base64.b64encode(zlib.compress(b"[1, 2]")).decode()
    with pytest.raises(ResultLogError, match="not a JSON object"):
        decode_result(f"fedtab-result 1/1 {hashlib.sha256(payload.encode()).hexdigest()} {payload}")


FAKE_FLWR = '''#!{python}
"""A stand-in for Flower's `flwr` CLI: run / ls / log, driven by files in its FLWR_HOME."""
import json, os, sys, time
from pathlib import Path
home = Path(os.environ["FLWR_HOME"])
args = sys.argv[1:]
with open(home / "calls.log", "a") as f:
    f.write(" ".join(args) + "\\n")
if args[0] == "run":
    print(json.dumps({{"success": True, "run-id": 7}}))
elif args[0] == "ls":
    statuses = json.loads((home / "statuses.json").read_text())
    status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
    (home / "statuses.json").write_text(json.dumps(statuses))
    print(json.dumps({{"success": True, "runs": [{{"run-id": 7, "status": status}}]}}))
elif args[0] == "stop":
    print(json.dumps({{"success": True, "run-id": 7}}))
elif args[0] == "log" and "--stream" in args:
    stream = home / "stream.log"
    if stream.exists():  # the log so far, each line as it comes (a restarted stream repeats it)
        for line in stream.read_text().splitlines():
            print(line, flush=True)
            time.sleep(0.01)
    time.sleep(float(os.environ.get("FAKE_STREAM_SECONDS", "0.05")))  # then the SuperLink ends the stream
elif args[0] == "log":
    print((home / "run.log").read_text())
'''


def _fake_client(tmp_path, statuses, log_text):
    import sys

    from fedtab.engines.flower_remote import SuperLinkClient

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flwr").write_text(FAKE_FLWR.format(python=sys.executable))
    (bin_dir / "flwr").chmod(0o755)
    ca = tmp_path / "ca.pem"
    ca.write_text("not used by the fake")
    client = SuperLinkClient("127.0.0.1:9093", root_certificates=ca, home=tmp_path / "home", bin_dir=bin_dir)
    (client.home / "statuses.json").write_text(json.dumps(statuses))
    (client.home / "run.log").write_text(log_text)
    return client


def test_superlink_client_follows_the_run_and_reads_its_result_from_the_log(tmp_path):
    """Against a stand-in `flwr`: the stream is restarted until the run is final, then the result
    is decoded from `flwr log --show`; the run config carries result-log; the connection has the CA."""
    from fedtab.engines.result_log import encode_result

    result = {"election": {"selected": ["age"]}}
    client = _fake_client(tmp_path, ["running", "running", "finished:completed"],
                          "INFO starting\n" + "\n".join(encode_result(result)) + "\n")
    out = client.run({"min-sites": 3, "job": '{"target": "y"}'}, timeout=60, status_every=0.01)
    assert out == {**result, "run_id": 7}
    calls = (client.home / "calls.log").read_text().splitlines()
    assert calls[0].startswith("run ") and "result-log=true" in calls[0] and "job='{\"target\": \"y\"}'" in calls[0]
    assert sum(c.endswith("--stream") for c in calls) == 3 and calls[-1].endswith("--show")
    config = (client.home / "config.toml").read_text()
    assert 'address = "127.0.0.1:9093"' in config and str(tmp_path / "ca.pem") in config


@pytest.mark.parametrize("statuses, log_text, fragment", [
    (["finished:failed"], "Traceback: FederationError: site 'va' failed\n", "(?s)ended as 'finished:failed'.*site 'va' failed"),
    (["finished:completed"], "the ServerApp printed nothing\n", "completed but the run log holds no fedtab result"),
])
def test_superlink_client_reports_failed_runs_and_missing_results(tmp_path, statuses, log_text, fragment):
    from fedtab.engines.errors import RunError

    client = _fake_client(tmp_path, statuses, log_text)
    with pytest.raises(RunError, match=fragment):
        client.run({"min-sites": 1}, timeout=60, status_every=0.01)


def test_superlink_client_gives_up_after_its_timeout(tmp_path):
    from fedtab.engines.errors import RunError

    client = _fake_client(tmp_path, ["running"], "")
    with pytest.raises(RunError, match="did not finish within 1 s"):
        client.run({"min-sites": 1}, timeout=1, status_every=0.2)


def test_waiting_asks_the_status_less_and_less_often_but_at_once_when_the_result_is_there(tmp_path, monkeypatch):
    """`wait` (the loopback deployment's): each `flwr ls` is a Python process of about a CPU second
    taken from the run it watches, so the interval doubles from `status_every` up to 30 s; a run that
    fails early is still seen at the first check, and a result file is followed by a check at once."""
    from types import SimpleNamespace

    from fedtab.engines import flower_remote
    from fedtab.engines.errors import RunError

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(flower_remote, "time", SimpleNamespace(
        monotonic=lambda: clock.now, sleep=lambda s: setattr(clock, "now", clock.now + s)))
    client = _fake_client(tmp_path, [], "")
    asked: list[float] = []

    def status_after(finish_at: float):
        def status(run_id: int) -> str:
            asked.append(clock.now)
            return "finished:completed" if clock.now >= finish_at else "running"
        return status

    monkeypatch.setattr(client, "status", status_after(1000.0))
    assert client.wait(7, timeout=2000, poll=0.5, status_every=5.0) == "finished:completed"
    gaps = [round(b - a) for a, b in zip([0.0, *asked], asked)]
    assert gaps[:4] == [5, 10, 20, 30] and set(gaps[4:]) == {30}, gaps  # 1000 s: 36 checks, not 200
    assert len(asked) == 36 and asked[-1] == 1025.0

    asked.clear()
    clock.now = 0.0
    monkeypatch.setattr(client, "status", lambda run_id: asked.append(clock.now) or "finished:failed")
    assert client.wait(7, timeout=2000, poll=0.5, status_every=5.0) == "finished:failed"
    assert asked == [5.0]  # a run failing at once: seen at the first check

    asked.clear()
    clock.now = 0.0
    monkeypatch.setattr(client, "status", status_after(100.0))
    assert client.wait(7, timeout=2000, poll=0.5, status_every=5.0, done=lambda: clock.now >= 99.0) == \
        "finished:completed"
    assert asked[-1] == 100.0 and all(b - a == 0.5 for a, b in zip(asked[-3:], asked[-2:]))  # checked each poll

    asked.clear()
    clock.now = 0.0
    monkeypatch.setattr(client, "status", status_after(1e9))
    with pytest.raises(RunError, match="did not finish within 100 s"):
        client.wait(7, timeout=100, poll=0.5, status_every=5.0)
    assert asked == [5.0, 15.0, 35.0, 65.0, 95.0]


def test_progress_lines_arrive_once_each_as_the_run_goes_and_forged_ones_are_ignored(tmp_path):
    """The stream (restarted once, so repeated) delivers each progress event once, in order,
    formatted as the CLI prints it; lines a hostile site could get logged are dropped whole."""
    from fedtab.engines.progress import ProgressLog, parse_event
    from fedtab.engines.result_log import encode_result
    from fedtab.job.exchange_plan import exchange_plan
    from fedtab.job.spec import parse_job

    spec = parse_job({"target": "y", "training": {"rounds": 2}, "schema": {"profile": False},
                      "evaluation": {"baselines": False}}, sites_required=False)
    lines: list[str] = []
    clock = _Clock()  # fake: no real timing
    server = ProgressLog(exchange_plan(spec), emit=lines.append, clock=clock)
    server.estimate(3)
    server.step("training")
    for kind, answered, seconds in (("describe", 3, 2.0), ("fit", 3, 3.0), ("fit", 2, 3.0), ("evaluate", 2, 4.0)):
        clock.now += seconds
        server.exchange(kind, answered, 3)
    forged = ['ERROR site \'va\': fedtab-progress {"seq": 99, "step": "\\u001b[31mpwned", "kind": "x"}',
              'fedtab-progress {"seq": 98, "step": "training", "round": -1}',
              'fedtab-progress {"seq": 97, "step": "training", "evil": 1}',
              'fedtab-progress {"seq": 96, "t": 1e999}', "fedtab-progress [1, 2]"]
    assert all(parse_event(f) is None for f in forged)
    client = _fake_client(tmp_path, ["running", "finished:completed"], "\n".join(encode_result({"ok": 1})))
    (client.home / "stream.log").write_text("\n".join(["INFO starting", *lines[:4], forged[0], *lines[4:]]))
    said: list[str] = []
    out = client.run({"min-sites": 3}, timeout=60, status_every=0.01, progress=said.append)
    assert out == {"ok": 1, "run_id": 7}
    assert said == ["submitted as Flower run 7 (fedtab attach 7 follows it again)",
                    "3 site(s) joined; the job makes about 5 exchanges (timed on its exchanges after the first)",
                    "training: describe (3/3 sites)", "training round 1/2 (3/3 sites)", "training round 2/2 (2/3 sites)",
                    "training: evaluate (2/3 sites)", "training: about 1 exchanges left × 3.3 s ≈ 3 s"]
    # (the run's first exchange prints no estimate; at the 4th the step is timed on the exchanges
    # after its first: (3 + 3 + 4) / 3 s)


def _fake_clock(ticks: list[float]):
    """A clock returning ``ticks`` in turn (then the last one again): no real timing."""
    it = iter(ticks)
    last = [0.0]

    def clock() -> float:
        last[0] = next(it, last[0])
        return last[0]
    return clock


class _Clock:
    """A settable fake clock: ``now`` is what it returns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_estimate_is_timed_on_each_steps_own_exchanges_never_on_the_site_naming_one():
    """The heart-job failure: a cheap first exchange (site naming, a profile) must not set the
    estimate of a dear step. With a fake clock: the profile costs 0.5 s, each training exchange
    10 s; the estimate printed at the training step's first exchange is the plan's exchanges left
    × 10 s (what the rest really took), re-timed at the step's 4th exchange."""
    from fedtab.engines.progress import ProgressLog, describe, parse_event
    from fedtab.job.exchange_plan import exchange_plan, planned_exchanges
    from fedtab.job.spec import parse_job

    spec = parse_job({"target": "y", "training": {"rounds": 6}, "evaluation": {"baselines": False}},
                     sites_required=False)
    assert planned_exchanges(spec) == {"schema": 1, "training": 8}
    clock = _Clock()
    lines: list[str] = []
    server = ProgressLog(exchange_plan(spec), emit=lines.append, clock=clock)
    server.estimate(3)
    first = parse_event(lines[-1])
    assert first["exchanges"] == 9 and "seconds_per_exchange" not in first
    assert describe(first) == "3 site(s) joined; the job makes about 9 exchanges (timed on its exchanges after the first)"
    server.step("schema")
    clock.now += 0.5
    server.exchange("profile", 3, 3)
    server.step("training")
    for kind in ("describe", "fit", "fit", "fit", "fit", "fit", "fit", "evaluate"):
        clock.now += 10.0
        server.exchange(kind, 3, 3)
    estimates = [e for e in map(parse_event, lines) if "seconds_per_exchange" in e]
    assert [(e["step"], e["exchanges"], e["seconds_per_exchange"]) for e in estimates] == [
        ("training", 7, 10.0), ("training", 4, 10.0)]  # the run's first exchange (the profile) prints none
    assert describe(estimates[0]) == "training: about 7 exchanges left × 10.0 s ≈ 70 s"
    assert estimates[0]["exchanges"] * estimates[0]["seconds_per_exchange"] == pytest.approx(clock.now - 10.5)


def test_the_estimate_follows_a_step_whose_exchanges_grow_dearer_and_stays_within_1_5x():
    """A GBDT step whose first exchange (the bin summary) is cheap and whose tree levels cost 5×
    more: re-timed at its 4th, 16th and 64th exchange (its 1st is the run's first: no estimate), each
    estimate is within 1.5× of what the rest of the step really took (fake clock)."""
    from fedtab.engines.progress import ProgressLog, parse_event
    from fedtab.job.exchange_plan import exchange_plan, planned_exchanges
    from fedtab.job.spec import parse_job

    spec = parse_job({"target": "y", "schema": {"profile": False}, "evaluation": {"baselines": False},
                      "training": {"model": {"name": "gbdt", "params": {"n_trees": 20, "max_depth": 4}}}},
                     sites_required=False)
    total = planned_exchanges(spec)["training"]
    # levels; summary, the bin sketch's two exchanges, start, closing level, importance, evaluation; schema
    assert total == 20 * 4 + 7 + 1
    cost = [1.0] + [5.0] * (total - 1)
    clock = _Clock()
    lines: list[str] = []
    server = ProgressLog(exchange_plan(spec), emit=lines.append, clock=clock)
    server.estimate(4)
    server.step("training")
    seen = []
    for i, c in enumerate(cost):
        clock.now += c
        server.exchange("gbdt_level", 4, 4)
        e = parse_event(lines[-1])
        if "seconds_per_exchange" in e:
            seen.append((i + 1, e["exchanges"], e["seconds_per_exchange"], sum(cost[i + 1:])))
    assert [s[0] for s in seen] == [4, 16, 64]
    assert [s[1] for s in seen] == [total - 4, total - 16, total - 64]
    for n, left, rate, real in seen:
        assert real / 1.5 <= left * rate <= real * 1.5, (n, left * rate, real)


def test_exchanges_beyond_the_plan_count_none_left_and_no_spec_prints_no_estimate():
    from fedtab.engines.progress import ProgressLog, parse_event
    from fedtab.job.exchange_plan import exchange_plan
    from fedtab.job.spec import parse_job

    spec = parse_job({"target": "y", "training": {"rounds": 1}, "schema": {"profile": False},
                      "evaluation": {"baselines": False}}, sites_required=False)
    lines: list[str] = []
    server = ProgressLog(exchange_plan(spec), emit=lines.append, clock=_fake_clock([0.0, *range(1, 80)]))
    server.step("training")
    for _ in range(16):  # the plan says 4 (schema agreement, describe, fit, evaluate)
        server.exchange("fit", 2, 2)
    # (the 1st is the run's first exchange: no estimate) at the 4th and 16th: none left of its own
    assert [e["exchanges"] for e in map(parse_event, lines) if "seconds_per_exchange" in e] == [0, 0]
    bare: list[str] = []
    none = ProgressLog(None, emit=bare.append, clock=_fake_clock([0.0, 1.0, 2.0]))
    none.estimate(2)
    none.exchange("select_evaluate", 2, 2)
    assert [parse_event(line).get("kind") for line in bare] == ["select_evaluate"]


def test_a_run_past_its_timeout_or_interrupted_is_stopped_on_the_superlink(tmp_path, monkeypatch):
    from fedtab.engines.errors import RunError

    client = _fake_client(tmp_path, ["running"], "")
    with pytest.raises(RunError, match=r"did not finish within 1 s \(stopped on the SuperLink\)"):
        client.run({"min-sites": 1}, timeout=1, status_every=0.2)
    calls = (client.home / "calls.log").read_text().splitlines()
    assert "stop 7 fedtab --format json" in calls

    (client.home / "calls.log").unlink()
    monkeypatch.setattr(type(client), "follow", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        client.attach(7, timeout=60)
    assert (client.home / "calls.log").read_text().splitlines() == ["stop 7 fedtab --format json"]


def test_attach_follows_a_submitted_run_without_submitting_and_writes_the_outputs(tmp_path, monkeypatch):
    """`fedtab attach RUN JOB --superlink`: nothing is submitted; the outputs are the job's, from the run's log."""
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.engines import flower_remote

    seen = {}

    def fake_attach(self, run_id, *, timeout, status_every=5.0, progress=None):
        seen.update(run_id=run_id, timeout=timeout, address=self.address)
        progress("training round 1/1 (1/1 sites)")
        raise flower_remote.RunError(f"Flower run {run_id} ended as 'finished:failed'")

    monkeypatch.setattr(flower_remote.SuperLinkClient, "attach", fake_attach)
    monkeypatch.setattr(flower_remote.SuperLinkClient, "submit", lambda *a, **k: pytest.fail("submitted"))
    (tmp_path / "job.toml").write_text('target = "y"\n[sites.a]\n[sites.b]\n')
    res = CliRunner().invoke(app, ["attach", "42", str(tmp_path / "job.toml"), "--superlink", "127.0.0.1:9",
                                   "--insecure", "--timeout", "5"])
    assert res.exit_code == 2 and "run 42 ended as 'finished:failed'" in res.output
    assert "training round 1/1 (1/1 sites)" in res.output
    assert seen == {"run_id": 42, "timeout": 5.0, "address": "127.0.0.1:9"}
    from fedtab.job import JobError
    from fedtab.job.run import run_job

    with pytest.raises(JobError, match="attach"):
        run_job(str(tmp_path / "job.toml"), attach=42)


def test_the_plans_exchange_count_is_what_the_in_process_engine_makes(tmp_path):
    """planned_exchanges (the estimate's count) against the real exchange count of each step."""
    from fedtab.engines.local import LocalFederation
    from fedtab.job.exchange_plan import planned_exchanges
    from fedtab.job.spec import parse_job
    from fedtab.job.workflow import run_workflow
    from tests.builders import classification_parts, make_sites

    _, parts = classification_parts(90, 4, 2, 1, seed=1)
    # (imputation, rounds + 5 or + 6 with the profile, + 4·rounds + 4 secure, was measured the same way;
    # torch costs 10 s here)
    gbdt = {"name": "gbdt", "params": {"n_trees": 3, "max_depth": 2}}
    for sections in ({"training": {"rounds": 2, "local_epochs": 1}, "schema": {"profile": False},
                      "evaluation": {"baselines": False}},
                     {"training": {"rounds": 3, "local_epochs": 1}, "election": {"freedom_degree": 0.5}},
                     # GBDT: n_trees × max_depth level exchanges, not `rounds` (the heart job's "15 exchanges"
                     # took 42 min); with its own schema agreement, and after an election
                     {"training": {"model": gbdt, "rounds": 10}, "schema": {"profile": False}},
                     {"training": {"model": gbdt}, "privacy": {"secure_aggregation": True}},
                     {"training": {"rounds": 3, "local_epochs": 1}, "election": {"freedom_degree": 0.5},
                      "privacy": {"secure_aggregation": True}},  # secure: + 2 per summed exchange, + 1 keys
                     {"training": {"model": {"name": "gbdt", "params": {"n_trees": 2, "max_depth": 3}}},
                      "election": {"freedom_degree": 0.5}},
                     # tune = "cv": the selection step (rounds + 3), not the tuning grid, election and training
                     {"training": {"rounds": 2, "local_epochs": 1}, "election": {"tune": "cv", "grid": [0.0, 0.5]},
                      "schema": {"profile": False}},
                     {"training": {"rounds": 2, "local_epochs": 1}, "election": {"tune": "cv", "grid": [0.0, 0.5]}}):
        spec = parse_job({"target": "target", **sections}, sites_required=False)
        fed = LocalFederation(make_sites(parts, selector="anova", policy={"allow_server_row_sets": True}))
        marks: list[tuple[str, int]] = []
        run_workflow(fed, spec, progress=lambda name: marks.append((name, fed.exchange_count)))
        ends = [m[1] for m in marks[1:]] + [fed.exchange_count]
        made = {name: end - start for (name, start), end in zip(marks, ends)}
        assert planned_exchanges(spec) == made, sections
    assert made == {"selection": 2 + 3, "schema": 1}  # the last case: prepare, 2 fit rounds, CV and test evaluation


def test_the_plans_exchange_count_of_a_regression_is_what_the_in_process_engine_makes():
    """A linear regression trains in one round; with tune = "cv" the selection makes 3 exchanges
    (prepare, fit, CV evaluation) and the training step 3 (describe, fit, evaluate)."""
    import numpy as np
    import pandas as pd

    from fedtab.engines.local import LocalFederation
    from fedtab.job.exchange_plan import planned_exchanges
    from fedtab.federation.site.core import Site
    from fedtab.job.spec import parse_job
    from fedtab.job.workflow import run_workflow

    rng = np.random.default_rng(3)
    X = rng.normal(size=(360, 5))
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(5)]).assign(y=X[:, 0] * 2 - X[:, 1] + rng.normal(size=360))
    seen = []
    for sections in ({"training": {"model": "linear", "rounds": 10}},
                     {"training": {"model": "linear"}, "election": {"tune": "cv", "grid": [0.0, 0.5]}},
                     {"training": {"model": "linear"}, "election": {"tune": "cv"}, "schema": {"profile": False}}):
        spec = parse_job({"target": "y", **sections}, sites_required=False)
        fed = LocalFederation([Site(f"s{i}", frame.iloc[i * 120:(i + 1) * 120].reset_index(drop=True), "y", seed=i,
                                    selector="anova") for i in range(3)])
        marks: list[tuple[str, int]] = []
        run_workflow(fed, spec, progress=lambda name: marks.append((name, fed.exchange_count)))
        ends = [m[1] for m in marks[1:]] + [fed.exchange_count]
        made = {name: end - start for (name, start), end in zip(marks, ends)}
        assert planned_exchanges(spec) == made, sections
        seen.append(made)
    assert seen[0]["training"] == 3 and seen[1]["selection"] == 3 and "tuning" not in seen[1]
