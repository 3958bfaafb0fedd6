"""DP a user can write (issue 30 item 4): public bounds per column in the job's data dictionary
(``[columns] bounds`` / ``levels``), carried to every DP release, and a DP job without the bounds
its releases need refused when the job file is read, naming the columns."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedtab.job.run import run_job
from fedtab.job.spec import JobError, dp_columns_without_bounds, load_job, spec_from_plan

BASE = {"target": "y", "sites": {"a": {"path": "a.csv"}, "b": {"path": "b.csv"}}}


def _write(folder, name, columns, n=60, seed=0):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({c: rng.normal(50, 10, n).round(1) for c in columns})
    frame["y"] = (frame[columns[0]] + rng.normal(0, 5, n) > 50).astype(int)
    frame.to_csv(folder / name, index=False)


def _job_file(folder, body):
    path = folder / "job.toml"
    path.write_text('target = "y"\n[sites.a]\npath = "a.csv"\n[sites.b]\npath = "b.csv"\n[training]\nrounds = 2\n'
                    + body)
    return path


def test_data_dictionary_becomes_the_dp_bounds():
    spec = load_job({**BASE, "privacy": {"dp": {"epsilon": 4.0}},
                     "columns": {"bounds": {"age": [0, 120], "chol": [100, 600]}, "levels": {"cp": [4, 1, 2, 3]}}})
    assert spec.privacy.dp["bounds"] == {"age": [0.0, 120.0], "chol": [100.0, 600.0], "cp": [1.0, 4.0]}
    assert dp_columns_without_bounds(spec, ["age", "cp", "chol", "y", "bp"]) == ["bp"]  # the label needs none
    back = spec_from_plan(json.dumps(spec.plan()))  # the plan carries them to a server
    assert back.privacy.dp["bounds"] == spec.privacy.dp["bounds"] and back.columns.bounds == spec.columns.bounds
    # merged with dp.bounds given per column; bounds win over levels for one column
    spec = load_job({**BASE, "privacy": {"dp": {"epsilon": 4.0, "bounds": {"bp": [50, 250]}}},
                     "columns": {"bounds": {"cp": [0, 9]}, "levels": {"cp": [1, 2]}}})
    assert spec.privacy.dp["bounds"] == {"bp": [50.0, 250.0], "cp": [0.0, 9.0]}
    # no DP: the dictionary is kept and bounds nothing; a private run may declare it (no profile needed)
    assert load_job({**BASE, "columns": {"bounds": {"age": [0, 120]}}}).privacy.dp is None
    load_job({**BASE, "privacy": {"secure_aggregation": True}, "columns": {"bounds": {"age": [0, 120]}}})


@pytest.mark.parametrize("columns, privacy, fragment", [
    ({"bounds": {"age": [120, 0]}}, {}, "[columns] bounds.age must be [low, high] with finite low < high"),
    ({"bounds": {"age": [0, float("inf")]}}, {}, "[columns] bounds.age must be [low, high]"),
    ({"bounds": {"age": [0, True]}}, {}, "[columns] bounds.age must be [low, high]"),
    ({"bounds": [0, 1]}, {}, "[columns] bounds must be a table"),
    ({"levels": {"cp": []}}, {}, "[columns] levels.cp must be a non-empty list of numeric codes"),
    ({"levels": {"cp": ["a"]}}, {}, "[columns] levels.cp must be a non-empty list"),
    ({"bounds": {"age": [0, 120]}}, {"dp": {"epsilon": 1.0, "bounds": [-5, 5]}},
     "[privacy] dp.bounds = [low, high] (one range for every column) and [columns] bounds/levels"),
    ({"bounds": {"age": [0, 120]}}, {"dp": {"epsilon": 1.0, "bounds": {"age": [0, 100]}}},
     "[privacy] dp.bounds.age = [0.0, 100.0] but [columns] gives [0.0, 120.0]"),
])
def test_bad_dictionaries_are_refused_in_one_line(columns, privacy, fragment):
    with pytest.raises(JobError) as exc:
        load_job({**BASE, "columns": columns, "privacy": privacy})
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_a_dp_job_file_without_the_bounds_it_needs_is_refused_when_read(tmp_path):
    _write(tmp_path, "a.csv", ["age", "chol", "bp"])
    _write(tmp_path, "b.csv", ["age", "chol", "hr"], seed=1)
    with pytest.raises(JobError, match=r"job.toml: \[privacy\] dp needs public value bounds for the column\(s\) "
                                       r"chol, bp, hr: add them to \[columns\] bounds"):
        load_job(_job_file(tmp_path, '[privacy]\ndp = { epsilon = 4.0 }\n[columns]\nbounds = { age = [0, 120] }\n'))
    with pytest.raises(JobError, match=r"column\(s\) age, chol, bp, hr"):
        load_job(_job_file(tmp_path, '[privacy]\ndp = { epsilon = 4.0 }\n'))
    # the label needs none; one [lo, hi] for every column is enough
    load_job(_job_file(tmp_path, '[privacy]\ndp = { epsilon = 4.0 }\n[columns]\nbounds = { age = [0, 120], '
                                 'chol = [0, 100], hr = [0, 100], bp = [0, 100] }\n'))
    load_job(_job_file(tmp_path, '[privacy]\ndp = { epsilon = 4.0, bounds = [0, 100] }\n'))
    # without DP nothing is asked
    load_job(_job_file(tmp_path, ''))


def test_a_dp_plan_without_site_files_needs_some_bounds(tmp_path):
    """A job whose sites keep their own tables (no path) is refused without any bounds; with a
    dictionary it is accepted and a site lacking a column's bounds names it at run time."""
    (tmp_path / "job.toml").write_text('target = "y"\n[sites.a]\n[sites.b]\n[privacy]\ndp = { epsilon = 4.0 }\n')
    with pytest.raises(JobError, match=r"\[privacy\] dp needs public value bounds for every feature column"):
        load_job(tmp_path / "job.toml")
    (tmp_path / "job.toml").write_text('target = "y"\n[sites.a]\n[sites.b]\n[privacy]\ndp = { epsilon = 4.0 }\n'
                                       '[columns]\nbounds = { age = [0, 120] }\n')
    assert load_job(tmp_path / "job.toml").privacy.dp["bounds"] == {"age": [0.0, 120.0]}


def test_the_dictionary_reaches_the_sites_dp_releases(tmp_path):
    """A DP run with only the dictionary's bounds runs end to end, and the result records them."""
    _write(tmp_path, "a.csv", ["age", "chol"], n=80)
    _write(tmp_path, "b.csv", ["age", "chol"], n=80, seed=1)
    job = _job_file(tmp_path, '[impute]\nrounds = 1\n[privacy]\ndp = { epsilon = 8.0 }\n[columns]\n'
                                        'bounds = { age = [0, 120] }\nlevels = { chol = [0, 100] }\n')
    load_job(job)
    result = run_job(job, out=tmp_path / "out")
    dp = result["privacy"]["dp"]
    assert dp["bounds"] == {"age": [0.0, 120.0], "chol": [0.0, 100.0]}
    assert 0 < dp["epsilon_spent"] <= 8.0 + 1e-9
    # the evaluation was released under DP: its n is the sum of noisy counts (drawn from the site's
    # secure randomness, unseeded), so a few dozen test rows can read as 0 — the release itself is checked
    pooled = result["training"]["metrics"]["pooled"]
    assert {"n", "confusion", "accuracy"} <= set(pooled) and isinstance(pooled["n"], int) and pooled["n"] >= 0
