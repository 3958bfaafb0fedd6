"""The site ledger across two real ``flwr run`` s on one SuperLink (issue 28 item 6, "Done when":
ledger across Flower runs with and without a state folder, evaluation lock-out).

One loopback deployment (:class:`fedtab.engines.flower_deploy.LoopbackDeployment`: a SuperLink
and two SuperNodes, each process started with ``setsid`` and its group killed in a ``finally``)
runs the same curious server twice (:mod:`fedtab.testing.curious_flower`): per run it trains one
model, spends the site's evaluations with crafted models until refused, and asks for DP sums
of a column. ``site-1`` has the state folder the deployment gives every node by default;
``site-2`` is started with ``state-dir=""``, as an operator who left it out. Each site's policy
caps evaluations at 1 per run and its ε at 8 per period (3 DP describes of 3 releases at z=2:
ε(9 releases) = 7.59, ε(12) = 9.01 at δ = 1e-5).

The in-process variants (and FLARE's) are in tests/engines/test_ledger_engines.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.requires("flwr")]

BIN = Path(sys.executable).parent
FEATURES = ["f0", "f1", "f2", "f3"]
POLICY = {"max_evaluations": 1, "epsilon_budget": 8.0}
#: DP describes the server sends per run (each 3 Gaussian releases at z = 2)
DP_PER_RUN = 2


def _binaries() -> bool:
    return all((BIN / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


def _requests():
    """The curious server's groups: one fit (so the site holds a model setup), two distinct
    crafted models to evaluate on ``test``, then DP sums of ``f0``."""
    from fedtab.federation.protocol.messages import Message

    setup = {"features": FEATURES, "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "part": "train"}
    fit = Message("fit", {"setup:mean": np.zeros(4), "setup:std": np.ones(4), "param:coef": np.zeros((1, 4)),
                          "param:intercept": np.zeros(1)}, {"setup": setup, "epochs": 1})
    crafted = [Message("evaluate", {"param:coef": np.array([[1.0, 0.0, 0.0, 0.0]]),
                                    "param:intercept": np.array([float(i)])}, {"part": "test"}) for i in range(2)]
    dp = Message("describe", meta={"features": ["f0"], "dp": {"z": 2.0, "bounds": [-10.0, 10.0]}})
    return [[fit], crafted, [dp] * DP_PER_RUN]


def _ledger(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two runs of the curious server on one deployment; the results, the ledger file of
    ``site-1`` after each run, and the SuperNodes' logs."""
    if not _binaries():
        pytest.skip("Flower CLI binaries not installed")
    from fedtab.engines.flower_deploy import LoopbackDeployment
    from fedtab.testing.curious_flower import probe_plan, write_app
    from tests.builders import write_classification_sites

    work = tmp_path_factory.mktemp("ledger_runs")
    sites = write_classification_sites(work, 300, 4, 2, 1, table_seed=1, split_seed=0)[:2]
    policy = json.dumps(POLICY)
    configs = [{**sites[0], "policy": policy}, {**sites[1], "policy": policy, "state-dir": ""}]
    app = write_app(work / "app")
    run_config = {"probe": probe_plan(_requests()), "poll-interval": 0.02}
    dep = LoopbackDeployment(configs, work / "deployment", insecure=True, start_timeout=120)
    ledger = work / "deployment" / "state" / "site-1" / "ledger.json"
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # the SuperNodes' logs are read below
    out = {"runs": [], "ledgers": [], "ledger_path": ledger}
    try:
        dep.start()
        for _ in range(2):
            out["runs"].append(dep.run(run_config, timeout=240, app=app))
            out["ledgers"].append(_ledger(ledger))
        out["logs"] = [(dep.workdir / f"supernode{i}.log").read_text(errors="replace") for i in range(2)]
    finally:
        dep.stop()
        left = dep.stragglers()
    assert not left, f"processes left running: {left}"
    return out


def _group(result: dict, i: int) -> dict:
    return result["groups"][i]


def test_the_ledger_is_keyed_by_each_flower_run(two_runs):
    ids = [r["run_id"] for r in two_runs["runs"]]
    assert ids[0] != ids[1]
    first, second = two_runs["ledgers"]
    assert set(first["runs"]) == {f"flower:{ids[0]}"}, first["runs"]
    assert set(second["runs"]) == {f"flower:{ids[0]}", f"flower:{ids[1]}"}, second["runs"]
    for rid in ids:
        assert second["runs"][f"flower:{rid}"]["fit"] == 1
        assert second["runs"][f"flower:{rid}"]["evaluate:test"] == POLICY["max_evaluations"]


def test_cheap_evaluations_in_run_1_do_not_lock_the_site_out_of_run_2(two_runs):
    """Run 1 spends every evaluation with crafted models; run 2 gets its own: the per-run cap
    resets for both sites (with or without a state folder)."""
    for result in two_runs["runs"]:
        evaluations = _group(result, 1)
        for site in ("site-1", "site-2"):
            assert evaluations[site]["answered"] == POLICY["max_evaluations"], evaluations
            reason = evaluations[site]["reason"]
            assert "max_evaluations=1" in reason and "in this run" in reason, reason
        assert all(v == {"answered": 1, "reason": ""} for v in _group(result, 0).values())  # the fit


def test_epsilon_accumulates_over_the_runs_in_the_state_folder(two_runs):
    from fedtab.privacy import DisclosurePolicy
    from fedtab.privacy.accountant import epsilon_of
    from fedtab.privacy.ledger import SiteLedger

    delta = DisclosurePolicy().delta
    first, second = (_group(r, 2)["site-1"] for r in two_runs["runs"])
    assert first == {"answered": DP_PER_RUN, "reason": ""}
    assert second["answered"] == 1 and "budget 8" in second["reason"], second  # 3 describes in the period
    spent = [sum(n for day in led["days"].values() for z, n in day["dp"][repr(float(delta))] if z == 2.0)
             for led in two_runs["ledgers"]]
    assert spent == [3 * DP_PER_RUN, 3 * (DP_PER_RUN + 1)]  # the releases of both runs, in one period
    eps = [epsilon_of(1.0, {2.0: n}, delta) for n in spent]
    assert eps[0] < eps[1] <= POLICY["epsilon_budget"] < epsilon_of(1.0, {2.0: spent[1] + 3}, delta)
    assert SiteLedger(two_runs["ledger_path"]).epsilon_spent(delta) == pytest.approx(eps[1], rel=1e-12)


def test_a_site_without_a_state_folder_says_so_and_starts_each_run_afresh(two_runs):
    """What docs/deployment.md says: the warning in the SuperNode's log at the run's start, and
    the ledger in the run's ``Context.state`` only, so its ε budget is whole again in run 2."""
    for result in two_runs["runs"]:
        assert _group(result, 2)["site-2"] == {"answered": DP_PER_RUN, "reason": ""}
    with_folder, without = two_runs["logs"]
    needle = "site 'site-2' has no state folder (state-dir)"
    per_run = {rid: section.count(needle) for rid, section in _run_sections(without).items()}
    assert per_run == {str(r["run_id"]): 1 for r in two_runs["runs"]}, without[-3000:]  # once at each run's start
    assert "budgets reset" in without
    assert "has no state folder" not in with_folder


def _run_sections(log: str) -> dict[str, str]:
    """The SuperNode log's text per Flower run id (the lines after each ``[RUN id, ROUND n]`` header)."""
    import re

    out: dict[str, str] = {}
    parts = re.split(r"\[RUN (\d+), ROUND \d+\]", log)
    for rid, text in zip(parts[1::2], parts[2::2]):
        out[rid] = out.get(rid, "") + text
    return out
