"""`python -m benchmarks.small_sites --quick` runs the selection against local-only and centralised."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import small_sites  # imported here: collection stays fast

    small_sites.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "small_sites.json").read_text())
    assert len(rows) == 1 and rows[0]["case"] == "heart"
    r = rows[0]
    for key in ("tuned", "tuned_global", "no_election", "local_only", "centralised"):
        assert 0.5 < r[key] <= 1, key
    assert r["exchanges_imputation"] == 0 and r["exchanges_selection"] == 3 + 3  # --quick: 3 rounds
    assert set(r["contributions"]) == {"h1", "h2", "h3", "h4"}
    md = (tmp_path / "small_sites.md").read_text()
    assert "python -m benchmarks.small_sites --quick" in md and "| mean |" in md


def test_the_icu_consortium_is_four_icu_types_from_the_shared_physionet_files():
    import pytest

    from benchmarks import small_sites
    from fedtab.data.impute_datasets import DatasetError

    try:
        tables, target = small_sites.site_tables("icu", 0)
    except DatasetError as exc:  # the shared data folder is not on this machine
        pytest.skip(str(exc))
    assert target == "In-hospital_death" and list(tables) == list(small_sites.ICU_TYPES.values())
    assert sum(len(t) for t in tables.values()) == 4000
    for t in tables.values():
        assert t.shape[1] == 77 and "ICUType" not in t.columns and set(t[target].unique()) == {0, 1}
    # the sites differ in what they measure: cardiac surgery hardly ever measures troponin T
    troponin = {n: t["TroponinT_last"].notna().mean() for n, t in tables.items()}
    assert troponin["cardiac_surgery"] < troponin["coronary"]
    again, _ = small_sites.site_tables("icu", 0)
    assert all(again[n].equals(t) for n, t in tables.items())  # per seed, the same rows


def test_plan_prints_each_sites_release_plan(capsys):
    """``--plan`` prints, per site, the co-observation cells the imputation would suppress or
    replace: heart seed 0's h1 misses 2 cells of ``ca``, so its sums over the rows with ``ca``
    are replaced (their complement is 2 rows), and no pair of h1 is suppressed."""
    from benchmarks import small_sites

    assert small_sites.main(["--plan", "--seeds", "0", "--cases", "heart"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == [f"heart seed 0 h{k}" for k in (1, 2, 3, 4)]
    h1 = lines[0]
    assert "missing cells {'ca': 2}" in h1 and "suppressed 0 []" in h1 and "'Σage|ca'" in h1


def test_imputation_settings_default_to_the_jobs_and_refuse_unknown_names():
    """No option: the job's own imputation defaults (an empty override); the options override the
    named ImputeConfig fields; a misspelt setting or a value that is not a number is refused."""
    import pytest

    from benchmarks import small_sites

    assert small_sites.impute_settings(None, None, []) == {}
    assert small_sites.impute_settings(3, 2, ["lr=0.01", "batch_size=None"]) == {
        "rounds": 3, "local_epochs": 2, "lr": 0.01, "batch_size": None}
    with pytest.raises(ValueError, match="no imputation setting ronuds"):
        small_sites.impute_settings(None, None, ["ronuds=3"])
    with pytest.raises(ValueError, match="seed"):  # the seed is the benchmark's, per run
        small_sites.impute_settings(None, None, ["seed=1"])
    with pytest.raises(ValueError, match="not a number"):
        small_sites.impute_settings(None, None, ["lr=fast"])
