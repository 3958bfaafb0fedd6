"""A job's own selector is held to the sites' work caps (issue 28, item 5): the job file's
``random_forest n_estimators=1e9`` becomes every site's own selector, and each site refuses
it before it runs — in the election's ballots and in the selection's fold ballots."""

from __future__ import annotations

import pytest

from fedtab.job.run import run_job
from tests.builders import base_rate_parts, write_csvs

HUGE = {"name": "random_forest", "params": {"n_estimators": 1e9}}


@pytest.mark.parametrize("election", [{"selector": HUGE, "freedom_degree": 0.5},
                                      {"selector": HUGE, "tune": "cv", "grid": [0.5, 1.0], "modes": ["none"]}])
def test_a_jobs_huge_selector_is_refused_by_every_site_before_it_runs(tmp_path, election):
    paths = write_csvs(base_rate_parts(0), tmp_path, stem="s{i}")
    doc = {"target": "target", "sites": {p.stem: {"path": str(p)} for p in paths}, "election": election,
           "training": {"rounds": 2, "local_epochs": 2}, "run": {"out": str(tmp_path / "out"), "seed": 0}}
    with pytest.raises(Exception) as err:
        run_job(doc)
    text = str(err.value)
    assert "refused" in text and "n_estimators" in text and ("max_work" in text or "max_size" in text), text
    assert all(f"site 's{i}' refused" in text for i in range(3)), text  # every site refused it
