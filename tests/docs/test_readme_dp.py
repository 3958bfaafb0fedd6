"""The README's DP example runs as written (issue 30 item 4): its ``[privacy]`` block (with the
``[columns]`` data dictionary it carries) added to the README's own ``job.toml`` runs on the
example sites, and the same job without the dictionary is refused when it is read, naming the
columns."""

from __future__ import annotations

import json
import re
import shutil
import tomllib

import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.job.spec import JobError, load_job
from tests.docs.test_docs import ROOT, blocks


def _readme_jobs() -> tuple[str, str]:
    """``(the README's job.toml, its DP block)``, as written."""
    tomls = [b.code for b in blocks(ROOT / "README.md") if b.lang == "toml"]
    job = next(c for c in tomls if "target" in tomllib.loads(c) and "sites" in tomllib.loads(c))
    dp = next(c for c in tomls if "dp" in tomllib.loads(c).get("privacy", {}))
    return job, dp


@pytest.fixture(scope="module")
def example_sites(tmp_path_factory):
    from fedtab.data.example_sites import write_heart_sites

    d = tmp_path_factory.mktemp("readme_dp_sites")
    write_heart_sites(d)
    return d


def test_the_readme_dp_example_runs_as_written(example_sites, tmp_path, monkeypatch):
    job, dp = _readme_jobs()
    work = tmp_path / "work"
    shutil.copytree(example_sites, work)
    monkeypatch.chdir(work)
    (work / "job.toml").write_text(job + "\n" + dp)
    res = CliRunner().invoke(app, ["run", "job.toml", "--quiet"])
    assert res.exit_code == 0, res.output[-2000:]
    result = json.loads((work / "run-out" / "result.json").read_text())
    privacy = result["privacy"]
    assert privacy["secure_aggregation"] is True
    assert privacy["dp"]["epsilon"] == tomllib.loads(dp)["privacy"]["dp"]["epsilon"]
    assert 0 < privacy["dp"]["epsilon_spent"] <= privacy["dp"]["epsilon"] + 1e-9
    declared = tomllib.loads(dp)["columns"]
    assert set(privacy["dp"]["bounds"]) == set(declared["bounds"]) | set(declared["levels"])
    assert result["training"]["metrics"]["pooled"]["n"] > 0


def test_the_readme_dp_example_without_its_dictionary_is_refused_when_read(example_sites, tmp_path):
    job, dp = _readme_jobs()
    without = re.sub(r"(?ms)^\[columns\].*?(?=^\[)", "", dp)
    assert "[columns]" not in without and "[trust]" in without
    work = tmp_path / "work"
    shutil.copytree(example_sites, work)
    (work / "job.toml").write_text(job + "\n" + without)
    with pytest.raises(JobError, match=r"\[privacy\] dp needs public value bounds for the column\(s\) age, sex, cp"):
        load_job(work / "job.toml")
