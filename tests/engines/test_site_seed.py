"""A site draws its row parts from its own split and secret seed on every engine (issue 28 item 2).

The attack: a curious server runs a job twice with two seeds (or test sizes, or fold counts); the two
test parts differ by a few rows, and the difference of two honest releases over them (a ``describe``
sum, an evaluation count) isolates those rows, though each release alone meets every per-reply rule.
On Flower the run config's ``site-settings`` and on FLARE the job's ``RowSplit`` are written by the
server's side, so a site takes its split from its own configuration and its seed from its state
folder (drawn once with :mod:`secrets`), and ignores the server's values.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from fedtab.engines import site_config as sc
from fedtab.federation.protocol.messages import Message
from tests.builders import write_classification_sites, flare_context, write_flare_site_file


def _fl_ctx(workspace: Path, job: str, name: str = "site-1"):
    """A FLARE context whose job id names the workspace (live sites are cached per job and site)."""
    return flare_context(workspace, f"{workspace.name}-{job}", name)


def _local(workspace: Path, own: dict) -> None:
    write_flare_site_file(workspace, own)


flower = pytest.importorskip("fedtab.engines.flower")

#: what a curious server sends for every site: another seed, test size and fold count
HOSTILE = {"seed": 12345, "test-size": 0.5, "folds": 2}
#: a release over the site's test part: its rows' count and sums
DESCRIBE_TEST = {"features": ["f0", "f1"], "part": "test"}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[dict]:
    """Two sites as a real operator configures them: name, table, label column, no seed."""
    configs = write_classification_sites(tmp_path_factory.mktemp("seed_sites"), 600, 4, 2, 1, table_seed=2,
                                         split_seed=0)[:2]
    return [{k: v for k, v in c.items() if k != "seed"} for c in configs]


def _releases(times: int = 1):
    """A server workflow asking every site ``times`` for its test part's describe; the result is
    every reply (kind, meta, arrays as lists), per site, in order."""

    def workflow(federation, run_config):  # noqa: ANN001, ANN202 - a Flower ServerApp workflow
        out: dict[str, list] = {s: [] for s in federation.sites}
        for _ in range(times):
            replies = federation.ask({s: Message("describe", meta=DESCRIBE_TEST) for s in federation.sites})
            for site, r in replies.items():
                out[site].append({"kind": r.kind, "meta": r.meta,
                                  "arrays": {k: np.asarray(v).tolist() for k, v in sorted(r.arrays.items())}})
        return {"replies": out}

    return workflow


def _run(configs: list[dict], run_config: dict | None = None, times: int = 1) -> dict:
    app = flower.make_server_app(_releases(times))
    return flower.run_in_process(configs, run_config, app=app, fresh_processes=True)["replies"]


def _same_parts(a, b) -> bool:  # noqa: ANN001 - RowParts
    return (np.array_equal(a.train, b.train) and np.array_equal(a.test, b.test) and len(a.folds) == len(b.folds)
            and all(np.array_equal(x, y) for x, y in zip(a.folds, b.folds)))


def _context(node_config: dict, run_config: dict, state=None):  # noqa: ANN001, ANN202
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=1, node_config=node_config, state=state if state is not None else RecordDict(),
                   run_config=run_config)


# ----------------------------------------------------------------------------- Flower
def test_a_flower_server_cannot_reseed_or_resize_a_sites_parts(sites, tmp_path, caplog):
    configs = [{**c, "state-dir": str(tmp_path / c["name"])} for c in sites]
    honest = _run(configs)
    assert all(r[0]["kind"] == "describe" and min(r[0]["arrays"]["count"]) >= 10 for r in honest.values()), honest
    settings = {"site-settings": json.dumps({c["name"]: HOSTILE for c in configs})}
    with caplog.at_level(logging.WARNING, logger="fedtab.site"):
        curious = _run(configs, settings)
    assert curious == honest  # the same test part, so the two releases differ in nothing
    assert "test-size, seed, folds are ignored" in caplog.text
    # the parts themselves, as the ClientApp builds the site
    plain = sc.build_site(flower._site_config(_context(configs[0], {})))
    told = sc.build_site(flower._site_config(_context(configs[0], settings)))
    assert _same_parts(plain.parts, told.parts) and plain.seed == told.seed != HOSTILE["seed"]
    assert (told.test_size, told.folds) == (0.2, 5)
    # control: the same values chosen by the site's own operator do move its test part (the test can fail)
    pinned = _run([{**c, **HOSTILE} for c in configs])
    assert all(pinned[s][0]["arrays"] != honest[s][0]["arrays"] for s in honest)


def test_a_flower_site_without_a_state_folder_keeps_its_parts_for_the_run_and_says_so(sites, caplog, monkeypatch):
    """A ClientApp is a new process per message (``fresh_processes``): the run's secret seed is kept in
    the node's ``Context.state``, so every message of a run sees the same parts; the next run draws anew."""
    drawn = iter(range(1000, 2000))
    monkeypatch.setattr(sc, "draw_secret_seed", lambda: next(drawn))
    with caplog.at_level(logging.WARNING, logger="fedtab.site"):
        first = _run(sites, times=3)
        second = _run(sites, times=1)
    for name, replies in first.items():
        assert all(r == replies[0] for r in replies), name  # one run: one test part
        assert second[name][0]["arrays"] != replies[0]["arrays"]  # another run: another seed, other parts
    warned = [r.getMessage() for r in caplog.records if "no state folder" in r.getMessage()]
    for c in sites:
        assert any(repr(c["name"]) in w and "row parts" in w and "difference" in w for w in warned), warned


def test_the_run_seed_lives_in_the_nodes_context_state(sites):
    from flwr.app import RecordDict

    state = RecordDict()
    one = flower._site_config(_context(sites[0], {}, state))["seed"]
    assert flower._site_config(_context(sites[0], {}, state))["seed"] == one  # a later message, same run
    assert flower._run_seed(_context({**sites[0], "seed": 3}, {})) is None  # the node's own seed wins
    assert flower._site_config(_context({**sites[0], "seed": 3}, {}))["seed"] == 3


# ----------------------------------------------------------------------------- NVIDIA FLARE


def test_a_flare_job_cannot_reseed_or_resize_a_sites_parts(sites, tmp_path, caplog):
    nvflare = pytest.importorskip("fedtab.engines.nvflare")
    cfg = sites[0]
    _local(tmp_path, {"data-path": cfg["data-path"]})
    honest = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"])
    curious = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                     split=nvflare.RowSplit(test_size=0.5, seed=12345, folds=2))
    one, _ = honest._site(_fl_ctx(tmp_path, "job-1"))
    with caplog.at_level(logging.WARNING, logger="fedtab.engines.nvflare"):
        two, _ = curious._site(_fl_ctx(tmp_path, "job-2"))
    assert _same_parts(one.parts, two.parts) and one.seed == two.seed != 12345
    assert (two.test_size, two.folds) == (0.2, 5)
    assert "test-size, seed, folds are ignored" in caplog.text
    # the seed is the site's secret, kept in its own state folder (local/fedtab-state) for every job
    kept = tmp_path / "local" / nvflare.STATE_FOLDER / sc.SEED_FILE
    assert int(kept.read_text()) == one.seed and oct(kept.stat().st_mode & 0o777) == "0o600"
    reply_one = one.handle(Message("describe", meta=DESCRIBE_TEST))
    reply_two = two.handle(Message("describe", meta=DESCRIBE_TEST))
    assert reply_one.kind == "describe" and all(np.array_equal(reply_one.arrays[k], reply_two.arrays[k])
                                                for k in reply_one.arrays)


def test_a_flare_sites_own_file_sets_its_split_and_a_job_equal_to_it_is_quiet(sites, tmp_path, caplog):
    nvflare = pytest.importorskip("fedtab.engines.nvflare")
    cfg = sites[0]
    _local(tmp_path, {"data-path": cfg["data-path"], "seed": 12345, "test-size": 0.5, "folds": 2})
    job = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                 split=nvflare.RowSplit(test_size=0.5, seed=12345, folds=2))
    with caplog.at_level(logging.WARNING, logger="fedtab.engines.nvflare"):
        site, _ = job._site(_fl_ctx(tmp_path, "job-1"))
    assert (site.test_size, site.seed, site.folds) == (0.5, 12345, 2)
    assert "ignored" not in caplog.text
    # the job's values were not what made the split: a job with other values gets the same site
    other = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                   split=nvflare.RowSplit(test_size=0.1, seed=1, folds=4))
    again, _ = other._site(_fl_ctx(tmp_path, "job-2"))
    assert _same_parts(site.parts, again.parts) and (again.test_size, again.seed, again.folds) == (0.5, 12345, 2)


# ----------------------------------------------------------------------------- the seed file
def test_a_state_folder_keeps_one_secret_seed(tmp_path, monkeypatch, caplog):
    drawn = iter([7, 8, 9])
    monkeypatch.setattr(sc, "draw_secret_seed", lambda: next(drawn))
    assert sc.kept_seed(tmp_path / "state") == 7 == sc.kept_seed(tmp_path / "state")  # drawn once, then read
    assert sc.own_split({"name": "a", "state-dir": str(tmp_path / "state")})["seed"] == 7
    assert sc.own_split({"name": "a", "state-dir": str(tmp_path / "state"), "seed": "3"})["seed"] == 3  # its own
    assert sc.own_split({"name": "a"}, seed=5)["seed"] == 5  # the engine's per-run secret
    with caplog.at_level(logging.WARNING, logger="fedtab.site"):
        assert sc.own_split({"name": "a"})["seed"] == 8  # a fresh secret for this process, with a warning
    assert "drew a secret seed for this process only" in caplog.text
    assert not [f for f in os.listdir(tmp_path / "state") if f != sc.SEED_FILE]  # no temporary file left
    (tmp_path / "state" / sc.SEED_FILE).write_text("not a seed")
    with pytest.raises(ValueError, match="seed file is damaged"):
        sc.kept_seed(tmp_path / "state")
    with pytest.raises(ValueError, match="test-size must be a number"):
        sc.own_split({"name": "a", "seed": 1, "test-size": "big"})
    with pytest.raises(ValueError, match="folds must be a non-negative integer"):
        sc.own_split({"name": "a", "seed": 1, "folds": -1})


def test_two_sites_built_from_one_state_folder_draw_identical_parts(sites, tmp_path):
    """Two runs (processes) of a site with a state folder: the same seed, the same parts."""
    cfg = {**sites[0], "state-dir": str(tmp_path / "s")}
    one = sc.build_site(sc.own_split(cfg))
    import shutil

    for entry in (tmp_path / "s").iterdir():  # keep only the seed: the second site draws its parts afresh
        if entry.name != sc.SEED_FILE:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    two = sc.build_site(sc.own_split(cfg))
    assert _same_parts(one.parts, two.parts) and one.seed == two.seed == sc.kept_seed(tmp_path / "s")


def test_fedtab_deploy_writes_no_split_into_a_sites_config(tmp_path):
    from typer.testing import CliRunner

    from fedtab.cli import app

    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "c"), "--site", "a", "--site", "b"],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    own = json.loads((tmp_path / "c" / "flare" / "sites" / "a" / "fedtab-site.json").read_text())
    assert own and not set(sc.site_config(own)) & set(sc.SPLIT_KEYS)
    assert "--node-config" in res.output and "seed=" not in res.output and "test-size" not in res.output
