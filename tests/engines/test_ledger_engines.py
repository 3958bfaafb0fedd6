"""The site ledger across engine runs (issue 28 item 6): Flower's run id and FLARE's job id
reach the site, so per-run caps count per run, while a site's state folder carries its ε
budget over every run of the period; a Flower site without one says so at the run's start."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedtab.federation.protocol.messages import Message
from tests.builders import write_classification_sites, flare_context

def _fl_ctx(workspace: Path, job_id: str, name: str = "site-1"):
    return flare_context(workspace, job_id, name)


flower = pytest.importorskip("fedtab.engines.flower")

#: noisy sums of one column: each answered request spends the site's ε
DP_DESCRIBE = {"features": ["f0"], "dp": {"z": 2.0, "bounds": [-10.0, 10.0]}}
PLAIN_DESCRIBE = {"features": ["f0"]}


def _asking(meta: dict, most: int):
    """A server workflow sending ``describe`` with ``meta`` to every site until each refuses
    (at most ``most`` times); the result counts each site's answers and keeps its last reason."""

    def workflow(federation, run_config):  # noqa: ANN001, ANN202 - a Flower ServerApp workflow
        answered = {s: 0 for s in federation.sites}
        reasons: dict[str, str] = {}
        for _ in range(most):
            live = [s for s in answered if s not in reasons]
            if not live:
                break
            replies = federation.ask({s: Message("describe", meta=meta) for s in live})
            for site, reply in replies.items():
                if reply.is_refusal or reply.is_error:
                    reasons[site] = reply.meta.get("reason") or reply.meta.get("error")
                else:
                    answered[site] += 1
        return {"answered": answered, "reasons": reasons}

    return workflow


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("ledger_sites"), 300, 4, 2, 1, table_seed=1,
                                      split_seed=0)[:2]


def _run(configs: list[dict], meta: dict, most: int) -> dict:
    app = flower.make_server_app(_asking(meta, most))
    return flower.run_in_process(configs, app=app, fresh_processes=True)


def _with(configs: list[dict], **node) -> list[dict]:
    return [{**c, **node} for c in configs]


def test_dp_budget_composes_over_flower_runs_with_a_state_folder(sites, tmp_path):
    policy = json.dumps({"epsilon_budget": 20.0})
    configs = [{**c, "policy": policy, "state-dir": str(tmp_path / c["name"])} for c in sites]
    first = _run(configs, DP_DESCRIBE, 400)
    spent = first["answered"]
    assert all(0 < n < 400 for n in spent.values()), first
    assert all("budget 20" in r for r in first["reasons"].values())
    second = _run(configs, DP_DESCRIBE, 400)  # a new Flower run: the same year, the same budget
    assert second["answered"] == {s: 0 for s in spent}, second
    assert all("budget 20" in r for r in second["reasons"].values())
    for c in configs:  # the first run's releases are in the site's own file, under its Flower run id
        runs = json.loads((Path(c["state-dir"]) / "ledger.json").read_text())["runs"]
        assert [v["release:train"] for k, v in runs.items() if k.startswith("flower:")] == [spent[c["name"]]], runs


def test_without_a_state_folder_each_flower_run_starts_afresh_and_the_site_says_so(sites, caplog):
    configs = _with(sites, policy=json.dumps({"epsilon_budget": 20.0}))
    with caplog.at_level(logging.WARNING, logger="fedtab.site"):
        first = _run(configs, DP_DESCRIBE, 400)
        second = _run(configs, DP_DESCRIBE, 400)
    assert second["answered"] == first["answered"] and all(n > 0 for n in first["answered"].values())
    warned = [r.getMessage() for r in caplog.records if "no state folder" in r.getMessage()]
    for c in configs:
        assert any(repr(c["name"]) in w and "budgets reset" in w for w in warned), warned


def test_per_run_caps_count_per_flower_run(sites, tmp_path, caplog):
    """With a state folder the release cap is per run: a second Flower run gets its own 3,
    which needs a run id that differs per run to reach the site."""
    policy = json.dumps({"max_releases_per_part": 3})
    configs = [{**c, "policy": policy, "state-dir": str(tmp_path / c["name"])} for c in sites]
    with caplog.at_level(logging.WARNING, logger="fedtab.site"):
        for _ in range(2):
            out = _run(configs, PLAIN_DESCRIBE, 10)
            assert out["answered"] == {c["name"]: 3 for c in configs}, out
            assert all("max_releases_per_part=3" in r and "in this run" in r for r in out["reasons"].values())
    assert not [r for r in caplog.records if "no state folder" in r.getMessage()]  # a site with one is quiet
    runs = json.loads((Path(configs[0]["state-dir"]) / "ledger.json").read_text())["runs"]
    assert sorted(r["release:train"] for r in runs.values()) == [3, 3]


def test_a_clientapp_takes_the_run_id_of_its_context(sites):
    """Unit-level: the site answering a message carries ``flower:<Context.run_id>``."""
    from flwr.app import Context, RecordDict

    flower.forget_sites()
    ids = []
    for run_id in (11, 12):
        ctx = Context(run_id=run_id, node_id=5, node_config=dict(sites[0]), state=RecordDict(), run_config={})
        ids.append(flower._site_for(ctx).run_id)
    assert ids == ["flower:11", "flower:12"]


# ----------------------------------------------------------------------------- NVIDIA FLARE


def test_flare_job_id_reaches_the_site_and_its_state_folder_is_its_own(sites, tmp_path, caplog):
    nvflare = pytest.importorskip("fedtab.engines.nvflare")
    cfg = sites[0]
    executor = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                      state_dir=str(tmp_path / "chosen-by-the-job"))
    with caplog.at_level(logging.WARNING, logger="fedtab.engines.nvflare"):
        one, _ = executor._site(_fl_ctx(tmp_path, "job-1"))
        two, _ = executor._site(_fl_ctx(tmp_path, "job-2"))
    assert (one.run_id, two.run_id) == ("flare:job-1", "flare:job-2")
    # the job's state_dir is ignored (the server's side writes the job), with a warning naming it
    assert any("chosen-by-the-job" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    default = tmp_path / "local" / nvflare.STATE_FOLDER / "ledger.json"
    assert one.ledger.path == default and two.ledger.path == default
    # the site's own local/fedtab-identity.json names its folder (relative to local/)
    (tmp_path / "local").mkdir(exist_ok=True)
    (tmp_path / "local" / nvflare.IDENTITY_FILE).write_text(json.dumps({"state-dir": "my-ledger"}))
    three, _ = executor._site(_fl_ctx(tmp_path, "job-3"))
    assert three.ledger.path == tmp_path / "local" / "my-ledger" / "ledger.json"
    with pytest.raises(ValueError, match="no job id"):
        nvflare.flare_run_id("")


def test_flare_per_run_caps_count_per_job(sites, tmp_path):
    """Two FLARE jobs of one site, one ledger file (its default folder): the release cap is per job."""
    nvflare = pytest.importorskip("fedtab.engines.nvflare")
    cfg = sites[0]
    executor = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                      policy={"max_releases_per_part": 3, "epsilon_budget": 20.0})
    plain = Message("describe", meta=PLAIN_DESCRIBE)
    kinds = []
    for job in ("cap-job-1", "cap-job-2"):  # job ids of its own: live sites are cached per (job, site)
        site, _ = executor._site(_fl_ctx(tmp_path, job))
        kinds.append([site.handle(plain).kind for _ in range(4)])
    assert kinds == [["describe"] * 3 + ["refused"]] * 2  # the release cap refuses before the handler
    runs = json.loads((tmp_path / "local" / nvflare.STATE_FOLDER / "ledger.json").read_text())["runs"]
    assert set(runs) == {"flare:cap-job-1", "flare:cap-job-2"}
