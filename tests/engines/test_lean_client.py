"""The lean site path: a process that answers one message imports and reads only what the step needs.

A Flower SuperNode answers every message in a fresh ``flwr-clientapp`` process. These
tests replay a whole election + training run one message per fresh Python process, the
site's state carried between them as Flower carries it (``encode_state`` →
``decode_state``), and check that (1) every reply equals the in-process run's, (2) after
the first FedAvg round no process imports pandas/scikit-learn or reads the site's file
(its file is overwritten), and no process imports a workflow's server side (its loop, its
server steps: a workflow package resolves its names lazily), (3) a GBDT run replayed the same way reads its CSV only in the
first message (later table reads come from the site's table cache) and its level and
importance messages import none of pandas/pyarrow/scipy/scikit-learn/torch, and (4) the handler table that lets a site import one workflow
module matches what the modules register.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedtab.data import classification_table
from fedtab.engines import LocalFederation
from fedtab.engines.site_config import build_lazy_site, build_site
from fedtab.engines.site_state import decode_state, encode_state
from fedtab.federation import register_all
from fedtab.federation.site.lazy import LazySite
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import HANDLER_HOMES, HANDLERS, TABLE_STEPS, Site
from tests.builders import write_classification_sites

JOB = {"election": {"freedom_degree": 0.5}, "training": {"rounds": 3, "local_epochs": 2}}
SRC = Path(__file__).resolve().parents[2] / "src"

# One message in a fresh interpreter, as a ClientApp process answers it: build the lazy site
# from its config, restore the state, answer, store the state; report what got imported.
REPLAY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import fedtab.engines.flower  # what the ClientApp process imports
    from fedtab.engines.site_config import build_lazy_site
    from fedtab.engines.site_state import decode_state, encode_state
    from fedtab.federation.protocol.messages import Message
    d, k = Path(sys.argv[1]), int(sys.argv[2])
    site = build_lazy_site(json.loads((d / "config.json").read_text()))
    if k:
        site.state = decode_state(Message.from_bytes((d / f"{k - 1}_state.bin").read_bytes()))
    reply = site.handle(Message.from_bytes((d / f"{k}_req.bin").read_bytes()))
    (d / f"{k}_state.bin").write_bytes(encode_state(site.state)[0].to_bytes())
    (d / f"{k}_rep.bin").write_bytes(reply.to_bytes())
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pandas", "sklearn", "torch", "pyarrow", "scipy"})
    # a workflow's server side (its loop and server steps): a site message needs only the workflow's site module
    server = sorted(m for m in sys.modules if m.startswith("fedtab.federation.workflows.") and m.rsplit(".", 1)[-1] in
                    ("server", "steps"))
    print(json.dumps({"loaded": site.loaded, "heavy": heavy, "server": server}))
""")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, jobs) -> tuple[Path, list[str], list[Message]]:
    """The requests one site received in an in-process run, and its replies."""
    root = tmp_path_factory.mktemp("lean")
    configs = write_classification_sites(root, 600, 20, 5, 3, table_seed=5, split_seed=1)
    sites = [build_site(c) for c in configs]
    calls: list[tuple[Message, Message]] = []
    answer = sites[0].handle

    def record(request: Message) -> Message:
        reply = answer(request)
        calls.append((request, reply))
        return reply

    sites[0].handle = record
    from fedtab.job.spec import spec_from_plan
    from fedtab.job.workflow import run_workflow

    run_workflow(LocalFederation(sites), spec_from_plan(jobs.plan(**JOB)))
    work = root / "replay"
    work.mkdir()
    (work / "config.json").write_text(json.dumps(configs[0]))
    for k, (request, _) in enumerate(calls):
        (work / f"{k}_req.bin").write_bytes(request.to_bytes())
    return work, [req.kind for req, _ in calls], [rep for _, rep in calls]


def _replay(work: Path, k: int) -> dict:
    out = subprocess.run([sys.executable, "-c", REPLAY, str(work), str(k)], capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_same_reply(got: Message, want: Message) -> None:
    assert got.kind == want.kind
    assert got.meta == want.meta
    assert sorted(got.arrays) == sorted(want.arrays)
    for name, value in want.arrays.items():
        np.testing.assert_allclose(got.arrays[name], value, rtol=1e-12, atol=1e-14, err_msg=name)


def test_each_message_in_a_fresh_process_answers_as_in_process_and_later_steps_skip_the_table(recorded):
    work, kinds, replies = recorded
    # logistic trains by Newton–Raphson: at most `rounds` iterations, each answered from the stored matrices;
    # the iteration at zero over every candidate rides on the ballot (answered with it, issue 31)
    assert kinds[:3] == ["ballot", "newton", "set_mask"] and 1 <= kinds.count("newton") <= JOB["training"]["rounds"] \
        and kinds[-1] == "evaluate"
    data = Path(json.loads((work / "config.json").read_text())["data-path"])
    for k, kind in enumerate(kinds):
        if k == 1:
            data.write_text("unrelated\n1\n")  # after the ballot no step may read the site's file
        report = _replay(work, k)
        _assert_same_reply(Message.from_bytes((work / f"{k}_rep.bin").read_bytes()), replies[k])
        if k:  # set_mask (the training description), every round and the evaluation: from the state
            assert report == {"loaded": False, "heavy": [], "server": []}, (k, kind)
        else:
            assert report["loaded"] and "pandas" in report["heavy"] and report["server"] == [], (k, kind)


def test_the_stored_matrices_are_the_tables_and_give_way_to_a_table_step_or_a_big_table(monkeypatch, tmp_path):
    from fedtab.federation.site import matrices as tf

    table = classification_table(80, 5, 2, 1, seed=3)
    table["target"] = table["target"].map({0: "no", 1: "yes"})
    path = tmp_path / "s.csv"
    table.to_csv(path, index=False)
    config = {"name": "s", "data-path": str(path), "target": "target"}
    site = build_lazy_site(config)
    assert site.keeps_matrices and not build_site(config).keeps_matrices
    assert tf.store_part_matrices(site)
    real = build_site(config)
    for part in ("train", "test"):
        for feats in (real.feature_names, ["f3", "absent", "f0"]):
            got_X, got_y = tf.site_matrix(site, feats, part)
            site.state["table_steps"] = [{"kind": "nothing", "params": {}}]  # stale: the table is read
            assert tf._stored_matrix(site, feats, part) is None
            site.state["table_steps"] = []
            want_X, want_y = tf.site_matrix(real, feats, part)
            np.testing.assert_array_equal(got_X, want_X)
            assert [tf.label_key(v) for v in want_y] == list(got_y)
    assert tf._stored_matrix(site, ["f0"], "fit") is None  # fit/validation parts: from their split
    monkeypatch.setattr(tf, "MATRIX_CACHE_CELLS", 80 * 5 - 1)
    assert not tf.store_part_matrices(site) and tf.MATRIX_KEY not in site.state
    monkeypatch.setattr(tf, "MATRIX_CACHE_CELLS", 10**6)
    real.table["f1"] = "text"  # a column still to encode: nothing stored, the steps that need it say so
    assert not tf.store_part_matrices(real) and tf.MATRIX_KEY not in real.state


def test_a_lazy_site_reads_its_table_only_when_asked_and_shares_its_state(recorded, tmp_path):
    config = json.loads((recorded[0] / "config.json").read_text())
    config["data-path"] = str(tmp_path / "site.csv")
    table = classification_table(120, 4, 2, 1, seed=0)  # 60 per class: a test part of 12 per class
    table.to_csv(config["data-path"], index=False)
    loads = []
    site = LazySite("site-1", lambda: loads.append(1) or build_site(config), target="target")
    site.state = {"features": ["a"]}
    assert not site.loaded and site.name == "site-1" and repr(site) == "LazySite('site-1', not read yet)"
    assert site.n_rows("train") == 96 and site.loaded and loads == [1]  # no counts stored yet: reads the table
    assert site.real().state is site.state and site.state["site_rows"]["parts"]["all"] == 120
    assert site.state["site_rows"]["classes"]["test"] == site.real().class_counts("test")
    assert isinstance(site.table.shape, tuple) and site.feature_names == list(table.columns[:-1]) and loads == [1]
    site.state = {"new": 1}
    assert site.real().state == {"new": 1}

    again = build_lazy_site(config)
    stored = {"site_rows": {"parts": {"train": 96, "test": 24, "all": 120}, "classes": {}, "steps": 0}}
    again.state = decode_state(encode_state(stored)[0])
    assert again.n_rows("test") == 24 and not again.loaded  # from the stored counts
    again.state["table_steps"] = [{"kind": "one_hot", "params": {"categories": {}}}]
    assert again.n_rows("test") == 24 and again.loaded  # a table step since the count: read and replay


def test_a_lazy_site_that_loads_another_site_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    classification_table(30, 4, 2, 1, seed=0).to_csv(path, index=False)
    site = LazySite("a", lambda: Site("b", __import__("pandas").read_csv(path), "target"), target="target")
    with pytest.raises(ValueError, match="named 'b'"):
        site.real()


def test_missing_config_keys_and_files_are_named_before_any_file_is_read(tmp_path):
    with pytest.raises(ValueError, match="data-path"):
        build_lazy_site({"name": "x"})
    with pytest.raises(ValueError, match=r"'x': data-path .*nowhere.csv: no such file"):
        build_lazy_site({"name": "x", "data-path": str(tmp_path / "nowhere.csv")})


def test_the_handler_table_matches_what_the_workflow_modules_register():
    pytest.importorskip("torch")  # the imputation module registers its handlers only with torch
    register_all()
    registered = {kind: fn.__module__ for registry in (HANDLERS, TABLE_STEPS) for kind, fn in registry.items()
                  if fn.__module__.startswith("fedtab.")}
    homes = {kind: module for module, kinds in HANDLER_HOMES.items() for kind in kinds if module.startswith("fedtab.")}
    assert registered == homes


# REPLAY with the table reader refused: a site built in this process must come from its table cache.
REPLAY_CACHED = REPLAY.replace("import fedtab.engines.flower  # what the ClientApp process imports", textwrap.dedent("""\
    import fedtab.engines.flower  # what the ClientApp process imports
    import fedtab.engines.site_config as _config  # (not fedtab.data.tables: it imports pandas)
    def _refuse(*args, **kwargs):
        raise AssertionError("the CSV reader was called")
    _config._read_tables = _refuse"""))
GBDT_JOB = {"training": {"model": {"name": "gbdt", "params": {"n_trees": 2, "max_depth": 2, "max_bins": 16}}}}
#: GBDT kinds answered from the site's state alone: no table, no pandas/pyarrow/scipy/scikit-learn
GBDT_LEAN = ("gbdt_level", "gbdt_importance")


def test_gbdt_messages_in_fresh_processes_read_the_csv_once_and_levels_import_nothing_heavy(tmp_path, jobs):
    configs = write_classification_sites(tmp_path, 600, 6, 3, 1, table_seed=7, split_seed=0)
    configs = [{**c, "policy": json.dumps({"allow_server_row_sets": True}), "state-dir": str(tmp_path / f"st{i}")}
               for i, c in enumerate(configs)]
    sites = [build_site(c) for c in configs]
    calls: list[tuple[Message, Message]] = []
    answer = sites[0].handle
    sites[0].handle = lambda request: calls.append((request, answer(request))) or calls[-1][1]
    from fedtab.job.spec import spec_from_plan
    from fedtab.job.workflow import run_workflow

    run_workflow(LocalFederation(sites), spec_from_plan(jobs.plan(**GBDT_JOB)))
    kinds = [req.kind for req, _ in calls]
    assert kinds.count("gbdt_level") >= 2 and set(GBDT_LEAN) <= set(kinds) and "gbdt_evaluate" in kinds
    work = tmp_path / "replay"
    work.mkdir()
    (work / "config.json").write_text(json.dumps({**configs[0], "state-dir": str(tmp_path / "fresh-state")}))
    for k, (request, _) in enumerate(calls):
        (work / f"{k}_req.bin").write_bytes(request.to_bytes())
    loads = []
    for k, kind in enumerate(kinds):
        script = REPLAY if k == 0 else REPLAY_CACHED  # only the site's first message may read the CSV
        out = subprocess.run([sys.executable, "-c", script, str(work), str(k)], capture_output=True, text=True,
                             timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, (k, kind, out.stderr[-2000:])
        report = json.loads(out.stdout.strip().splitlines()[-1])
        _assert_same_reply(Message.from_bytes((work / f"{k}_rep.bin").read_bytes()), calls[k][1])
        if kind in GBDT_LEAN:
            assert report == {"loaded": False, "heavy": [], "server": []}, (k, kind)
        assert report["server"] == [], (k, kind)
        loads.append(report["loaded"])
    assert loads[0] and sum(loads) >= 2  # later table reads (evaluation) came from the cache, not the CSV
