"""`fedtab attach RUN_ID other.toml` refuses a job file whose plan differs from the run's (issue 30
item 6): the server's result carries the plan it ran, and attach compares it with the job file's
before it writes anything."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedtab.job.run import check_attached_plan
from fedtab.job.spec import JobError, load_job

JOB = 'target = "y"\n[sites.a]\n[sites.b]\n[training]\nrounds = 3\n'


def _attach(tmp_path, monkeypatch, ran_plan, job_text=JOB):
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.engines import flower_remote

    def fake_attach(self, run_id, *, timeout, status_every=5.0, progress=None):
        return {"plan": ran_plan, "run_id": run_id}  # what the run's log holds (abridged)

    monkeypatch.setattr(flower_remote.SuperLinkClient, "attach", fake_attach)
    monkeypatch.setattr(flower_remote.SuperLinkClient, "submit", lambda *a, **k: pytest.fail("submitted"))
    (tmp_path / "job.toml").write_text(job_text)
    return CliRunner().invoke(app, ["attach", "42", str(tmp_path / "job.toml"), "--superlink", "127.0.0.1:9",
                                    "--insecure", "--out", str(tmp_path / "out")])


def test_attach_refuses_a_job_file_whose_plan_differs(tmp_path, monkeypatch):
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    (submitted / "job.toml").write_text(JOB.replace("rounds = 3", "rounds = 7"))
    ran = load_job(submitted / "job.toml").plan()
    res = _attach(tmp_path, monkeypatch, json.loads(json.dumps(ran)))
    assert res.exit_code != 0
    assert "is not the job Flower run 42 ran: they differ in [training] rounds" in res.output
    assert not (tmp_path / "out" / "result.json").exists()  # nothing written under the wrong job
    res = _attach(tmp_path, monkeypatch, None)  # a result without its plan cannot be checked
    assert res.exit_code != 0 and "does not carry the plan it ran" in res.output


def test_the_same_job_file_elsewhere_passes_the_check(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "job.toml").write_text(JOB)
    mine, ran = load_job(a / "job.toml").plan(), load_job(b / "job.toml").plan()
    assert mine["run"]["out"] != ran["run"]["out"]  # where each machine writes is not compared
    check_attached_plan(mine, json.loads(json.dumps(ran)), 42, "a/job.toml")
    other = load_job(b / "job.toml").plan()
    other["target"] = "z"
    with pytest.raises(JobError, match=r"differ in target;"):
        check_attached_plan(mine, other, 42, "a/job.toml")


def test_the_server_result_carries_the_plan_it_ran(jobs):
    from fedtab.engines.local import LocalFederation
    from fedtab.federation.site.core import Site
    from fedtab.job.workflow import engine_workflow

    rng = np.random.default_rng(0)
    t = pd.DataFrame({"x1": rng.normal(size=120), "x2": rng.normal(size=120)})
    t["target"] = (t.x1 + 0.3 * rng.normal(size=120) > 0).astype(int)
    sites = [Site(f"s{i}", t.iloc[i::2].reset_index(drop=True), "target", seed=i) for i in range(2)]
    plan = jobs.plan(training={"rounds": 1, "local_epochs": 1})
    result = engine_workflow(LocalFederation(sites), {"job": json.dumps(plan)})
    assert result["plan"] == json.loads(json.dumps(plan))
