"""A target typo names the target with a did-you-mean when the job file is read (issue 30 item 6;
before, the run started and every site's error showed the name redacted)."""

from __future__ import annotations

import pandas as pd
import pytest

from fedtab.job.spec import JobError, did_you_mean, load_job


def _files(tmp_path, b_target="disease"):
    pd.DataFrame({"age": [50, 60], "disease": [0, 1]}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"age": [55, 65], b_target: [1, 0]}).to_parquet(tmp_path / "b.parquet", index=False)


def _job(tmp_path, target):
    p = tmp_path / "job.toml"
    p.write_text(f'target = "{target}"\n[sites.a]\npath = "a.csv"\n[sites.b]\npath = "b.parquet"\n'
                 '[sites.c]\n')  # c keeps its own table: checked when the run starts
    return p


def test_a_target_typo_is_refused_when_read_with_a_did_you_mean(tmp_path):
    _files(tmp_path)
    with pytest.raises(JobError, match=r"job.toml: target = 'diseas' is not a column in the file of site\(s\) a, b "
                                       r"\(did you mean 'disease'\?\)"):
        load_job(_job(tmp_path, "diseas"))
    with pytest.raises(JobError, match=r"target = 'Disease' .* \(did you mean 'disease'\?\)"):
        load_job(_job(tmp_path, "Disease"))  # a case difference is the first guess
    assert load_job(_job(tmp_path, "disease")).target == "disease"


def test_a_site_whose_file_names_the_label_differently_is_named(tmp_path):
    _files(tmp_path, b_target="Disease")
    with pytest.raises(JobError, match=r"target = 'disease' is not a column in the file of site\(s\) b "
                                       r"\(did you mean 'Disease'\?\)"):
        load_job(_job(tmp_path, "disease"))


def test_did_you_mean():
    assert did_you_mean("diseas", ["age", "disease"]) == " (did you mean 'disease'?)"
    assert did_you_mean("AGE", ["age", "agent"]) == " (did you mean 'age'?)"
    assert did_you_mean("zzz", ["age"]) == ""


def test_a_quorum_that_allows_it_leaves_the_site_to_the_run(tmp_path):
    """With [trust] min_sites the run drops a site whose file lacks the label (and names it), as
    for any site that cannot read its table; a typo that leaves too few sites is still refused."""
    _files(tmp_path, b_target="Disease")
    job = _job(tmp_path, "disease")
    job.write_text(job.read_text() + "[trust]\nmin_sites = 2\n")
    assert load_job(job).target == "disease"  # a and c (unknown here) can make the quorum
    job.write_text(job.read_text().replace("min_sites = 2", "min_sites = 3"))
    with pytest.raises(JobError, match=r"site\(s\) b \(did you mean 'Disease'\?\)"):
        load_job(job)
