"""A FLARE site's policy, files and state folder are its own (issue 28, the curious server).

On NVIDIA FLARE the job — executor arguments included — is written by whoever submits it, i.e. the
server's side. The site reads its own ``local/fedtab-site.json``; a job's policy settings can only
tighten it. Tested as a curious server: a job that lowers ``min_rows``, sets
``allow_server_row_sets`` or drops ``require_secure_aggregation``, or names another table, changes
nothing at the site, which answers exactly as its own file says.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from fedtab.engines.site_config import POLICY_STRICTER, own_over_job, stricter_policy
from fedtab.federation.protocol.messages import Message
from fedtab.privacy.policy import DisclosurePolicy
from tests.builders import write_classification_sites, flare_context, write_flare_site_file


def _fl_ctx(workspace: Path, job: str, name: str = "site-1"):
    """A FLARE context whose job id names the workspace (live sites are cached per job and site)."""
    return flare_context(workspace, f"{workspace.name}-{job}", name)


def _local(workspace: Path, own: dict) -> None:
    write_flare_site_file(workspace, own)


nvflare = pytest.importorskip("fedtab.engines.nvflare")

DESCRIBE = Message("describe", meta={"features": ["f0"]})
#: what a curious server writes into the job: every relaxation it can name
RELAXING = {"min_rows": 1, "allow_server_row_sets": True, "require_secure_aggregation": False,
            "require_dp": False, "max_evaluations": 10**9, "epsilon_budget": 1e6, "period_days": 1}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("flare_policy_sites"), 300, 4, 2, 1, table_seed=3,
                                      split_seed=0)[:2]


def _answer(executor, workspace: Path, job: str, request: Message = DESCRIBE) -> Message:
    site, _ = executor._site(_fl_ctx(workspace, job))
    return site.handle(request)


def test_every_policy_setting_has_a_direction():
    """A new DisclosurePolicy setting must say how a job may move it, or the job could set it freely."""
    assert set(POLICY_STRICTER) == {f.name for f in fields(DisclosurePolicy)}
    assert set(POLICY_STRICTER.values()) <= {"max", "min", "site"}


def test_a_relaxing_job_changes_nothing_and_a_tightening_one_wins():
    own = DisclosurePolicy(min_rows=20, require_secure_aggregation=True, max_evaluations=50, epsilon_budget=8.0)
    merged, relaxed = stricter_policy(own, RELAXING)
    assert merged == own
    assert set(relaxed) == set(RELAXING) - {"require_dp"}  # require_dp was off at the site too: nothing relaxed
    tighter, relaxed = stricter_policy(own, {"min-rows": 40, "require_dp": True, "max_evaluations": 5})
    assert (tighter.min_rows, tighter.require_dp, tighter.max_evaluations) == (40, True, 5)
    assert tighter.require_secure_aggregation and relaxed == []
    with pytest.raises(ValueError, match="unknown setting"):
        stricter_policy(own, {"min_rowz": 1})
    # a site that opted in keeps its opt-in; a job cannot take back what it did not give
    opted = DisclosurePolicy(allow_server_row_sets=True, min_rows=5)
    assert own_over_job({"policy": opted.to_dict()}, {})[0]["policy"] == opted.to_dict()


def test_min_rows_the_job_lowers_stays_the_sites(sites, tmp_path, caplog):
    cfg = sites[0]
    rows = len(pd.read_csv(cfg["data-path"]))
    _local(tmp_path, {"data-path": cfg["data-path"], "min-rows": rows + 1})  # more than the site has: refuses
    curious = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"], min_rows=1,
                                     policy={"min_rows": 1, "allow_server_row_sets": True})
    with caplog.at_level(logging.WARNING, logger="fedtab.engines.nvflare"):
        reply = _answer(curious, tmp_path, "job-1")
    assert reply.is_refusal and "min_rows" in reply.meta["reason"]
    site, _ = curious._site(_fl_ctx(tmp_path, "job-1"))
    assert site.policy.min_rows == rows + 1 and site.policy.allow_server_row_sets is False
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "policy.min_rows" in warned and "policy.allow_server_row_sets" in warned
    # the same job against a site whose own floor it meets is answered: the refusal was the site's file
    _local(tmp_path, {"data-path": cfg["data-path"], "min-rows": 5})
    assert _answer(curious, tmp_path, "job-2").kind == "describe"
    # and a job may raise the floor (stricter wins)
    strict = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"], min_rows=rows + 1)
    assert _answer(strict, tmp_path, "job-3").is_refusal


def test_a_dropped_require_flag_is_still_required(sites, tmp_path):
    cfg = sites[0]
    _local(tmp_path, {"data-path": cfg["data-path"], "min-rows": 5,
                      "policy": {"require_secure_aggregation": True}})
    curious = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                     policy={"require_secure_aggregation": False, "require_dp": False})
    reply = _answer(curious, tmp_path, "job-1")
    assert reply.is_refusal and "secure" in reply.meta["reason"]
    # without the site's flag the same plain request is answered
    _local(tmp_path, {"data-path": cfg["data-path"], "min-rows": 5})
    assert _answer(curious, tmp_path, "job-2").kind == "describe"


def test_the_site_reads_its_own_table_not_the_one_the_job_names(sites, tmp_path, caplog):
    mine, other = sites[0], sites[1]
    _local(tmp_path, {"data-path": mine["data-path"], "min-rows": 5})
    curious = nvflare.FedtabExecutor(data_path=other["data-path"], target=mine["target"])
    with caplog.at_level(logging.WARNING, logger="fedtab.engines.nvflare"):
        site, _ = curious._site(_fl_ctx(tmp_path, "job-1"))
    assert len(site.table) == len(pd.read_csv(mine["data-path"])) != len(pd.read_csv(other["data-path"]))
    assert any("data-path" in r.getMessage() for r in caplog.records)
    # relative paths in the site's file are in its local/ folder
    local = tmp_path / "rel"
    (local / "local").mkdir(parents=True)
    (local / "local" / "t.csv").write_bytes(Path(mine["data-path"]).read_bytes())
    (local / "local" / nvflare.SITE_FILE).write_text(json.dumps({"site-1": {"data-path": "t.csv", "min-rows": 5},
                                                               "site-9": {"data-path": "x.csv"}}))
    site, _ = curious._site(_fl_ctx(local, "job-2"))
    assert len(site.table) == len(pd.read_csv(mine["data-path"]))


def test_a_site_without_its_own_file_keeps_the_default_floor(sites, tmp_path):
    """No local/fedtab-site.json: the job's table is read, but its policy can only tighten the defaults."""
    cfg = sites[0]
    curious = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                     policy=dict(RELAXING, period_days=365))
    site, _ = curious._site(_fl_ctx(tmp_path, "job-1"))
    assert site.policy == DisclosurePolicy()


def test_a_bad_site_file_is_one_clear_error(tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / nvflare.SITE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        nvflare.local_site_config(tmp_path / "local", "site-1")
    (tmp_path / "local" / nvflare.SITE_FILE).unlink()
    (tmp_path / "local" / nvflare.IDENTITY_FILE).write_text(json.dumps({"min-rows": 1}))
    with pytest.raises(ValueError, match="only the identity keys and state-dir"):
        nvflare.local_site_config(tmp_path / "local", "site-1")


def test_the_simulator_writes_the_sites_own_file(sites, tmp_path):
    """run_simulator's sites are given by one owner: it writes their local file from the configs it gets."""
    path = nvflare.write_site_files(tmp_path, [{**sites[0], "min-rows": 7, "policy": '{"max_rounds": 3}'}])
    own = nvflare.local_site_config(path.parent, sites[0]["name"])
    assert own["min_rows"] == 7 and own["policy"] == {"max_rounds": 3}
    assert Path(own["data_path"]) == Path(sites[0]["data-path"]).resolve()


def test_the_file_fedtab_deploy_writes_is_what_the_site_reads(sites, tmp_path):
    """``fedtab deploy``'s flare/sites/<site>/fedtab-site.json copied into a kit's local/, as it prints:
    the site reads its table, state folder and identity from it, under its policy, whatever the job says."""
    from typer.testing import CliRunner

    from fedtab.cli import app

    cfg = sites[0]
    res = CliRunner().invoke(app, ["deploy", str(tmp_path / "c"), "--site", "site-1", "--site", "site-2",
                                   "--data", f"site-1={cfg['data-path']}"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    kit = tmp_path / "kit"
    (kit / "local").mkdir(parents=True)
    out = tmp_path / "c"
    for src in (out / "flare" / "sites" / "site-1" / nvflare.SITE_FILE, out / "ca.pem", out / "site-keys.json",
                out / "site-keys.json.sig", out / "sites" / "site-1.key"):
        (kit / "local" / src.name).write_bytes(src.read_bytes())
    curious = nvflare.FedtabExecutor(data_path=sites[1]["data-path"], target=cfg["target"],
                                     policy=RELAXING, state_dir=str(tmp_path / "the-servers-choice"))
    site, _ = curious._site(_fl_ctx(kit, "job-1"))
    assert site.policy == DisclosurePolicy()
    assert len(site.table) == len(pd.read_csv(cfg["data-path"]))
    assert site.ledger.path == kit / "local" / "fedtab-state" / "ledger.json"
    assert site.identity is not None and site.identity.problem is None


def test_a_job_that_maps_labels_and_names_its_task_builds_on_flare(sites, tmp_path):
    """The job's per-site reading keys (``label-map``, ``sep``, ``decimal``, ``task``: what a job may
    set for a site) are executor arguments: a job with ``[labels] map`` or a task builds, and the
    site reads its table with them."""
    import pandas as pd

    cfg = {**sites[0], "label-map": '{"0": "no", "1": "yes"}', "task": "classes", "sep": ",", "decimal": "."}
    job = nvflare.build_job([{"name": "site-1", **{k: v for k, v in cfg.items() if k != "name"}}], {})
    assert job is not None
    executor = nvflare.FedtabExecutor(data_path=cfg["data-path"], target=cfg["target"],
                                      reading={"label_map": {"0": "no", "1": "yes"}, "task": "classes", "sep": ",",
                                               "decimal": "."})
    site, _ = executor._site(_fl_ctx(tmp_path, "labels"))
    assert set(pd.unique(site.table[cfg["target"]].astype(str))) == {"no", "yes"}
