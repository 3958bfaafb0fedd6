"""fedtab on NVIDIA FLARE 2.9: FedtabController + FedtabExecutor in the simulator.

Results must equal the in-process engine's; the simulator's return code is checked
(``run_simulator`` raises on a non-zero code).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows

# nvflare is imported by the tests that run (fedtab.engines.nvflare), not at collection
pytestmark = pytest.mark.requires("nvflare")

JOB = {"election": {"freedom_degree": 0.5}, "training": {"rounds": 2, "local_epochs": 2}}
# the simulator run also tunes the freedom degree first (many more, cheap, FLARE tasks)
TUNED_JOB = {"election": {"tune": "grid", "grid": [0.0, 1.0], "refine_step": 0.0},
             "training": {"rounds": 1, "local_epochs": 2}}


@pytest.fixture(scope="module")
def nvflare():
    """fedtab's FLARE engine (imports nvflare)."""
    from fedtab.engines import nvflare

    return nvflare


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("flare_sites")
    table = classification_table(900, 30, 6, 4, seed=5)
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify="target", seed=1)
    configs = []
    for i, part in enumerate(parts):
        # a stratified held-out file: every class with enough rows for the sites' floor (min_rows=10)
        train, test = split_rows(part, [0.8, 0.2], stratify="target", seed=i)
        train_path, test_path = root / f"site{i + 1}_train.csv", root / f"site{i + 1}_test.csv"
        train.to_csv(train_path, index=False)
        test.to_csv(test_path, index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(train_path), "test-path": str(test_path),
                        "target": "target", "selector": "nvflare-lasso", "seed": 0})
    return configs


@pytest.fixture(scope="module")
def reference(site_configs, jobs) -> dict:
    return jobs.local(site_configs, jobs.plan(**TUNED_JOB))


def test_build_job_rejects_unknown_site_arguments(nvflare, site_configs, jobs):
    bad = [dict(site_configs[0], colour="blue")]
    with pytest.raises(ValueError, match="colour"):
        nvflare.build_job(bad, jobs.config(jobs.plan(**JOB)))


@pytest.mark.slow
def test_simulator_matches_local_engine(nvflare, site_configs, reference, tmp_path, jobs):
    result = nvflare.run_simulator(site_configs, jobs.config(jobs.plan(**TUNED_JOB)), tmp_path, threads=3)
    assert result["engine"] == "nvflare"
    assert result["tuning"]["freedom_degree"] == reference["tuning"]["freedom_degree"]
    assert result["tuning"]["selected"] == reference["tuning"]["selected"]
    assert list(result["sites"]) == ["site-1", "site-2", "site-3"]
    assert result["election"]["selected"] == reference["election"]["selected"]
    assert result["election"]["mask"] == reference["election"]["mask"]
    for key, value in reference["model"]["params"].items():
        np.testing.assert_allclose(result["model"]["params"][key], value, rtol=1e-9, atol=1e-12)
    assert result["training"]["metrics"]["pooled"]["weighted_f1"] == pytest.approx(
        reference["training"]["metrics"]["pooled"]["weighted_f1"], abs=1e-12)
    # per-site state was persisted in each client's run directory
    assert len(list((tmp_path / "sim").glob("site-*/simulate_job/fedtab_site_state.bin"))) == 3


# A site that fails on FLARE is named: under a quorum it is dropped
# (tests/job/test_job_guarantees.py, the mode x failure matrix on the simulator); without one the job fails
# with the site's reason (tests/job/test_job.py::test_flare_project_job_matches_local_engine, a wrong path).


# FedHF-Impute on the FLARE simulator: the job's imputation, election and training equal the local
# engine's in tests/job/test_job.py::test_the_job_gives_the_same_columns_and_predictions_on_every_engine


def test_a_sites_split_travels_in_the_flare_job_but_the_site_draws_its_own(nvflare, site_configs, jobs, tmp_path):
    """``test-size``, ``seed`` and ``folds`` become the executor's :class:`RowSplit`: FLARE writes it
    into the job as a component of its own and builds it back at the site. The job is the server's
    side's, so the site draws its parts from its own ``local/`` file's split, else its defaults and a
    secret seed kept in its state folder (issue 28: two jobs with two seeds would give two test parts
    to difference)."""
    import json
    from types import SimpleNamespace

    from nvflare.fuel.utils.component_builder import ComponentBuilder

    from fedtab.engines.site_config import kept_seed

    class Builder(ComponentBuilder):  # FLARE's builder of job components (no module scanner needed)
        def get_module_scanner(self):
            return None

    plain = {k: v for k, v in site_configs[0].items() if k not in ("test-path", "seed")}
    sites = [dict(plain, name="split", **{"test-size": 0.3, "seed": 7, "folds": 3}), dict(plain, name="default")]
    nvflare.build_job(sites, jobs.config(jobs.plan(**JOB))).export_job(str(tmp_path / "jobs"))
    built = {}
    for site in ("split", "default"):
        config = json.loads(next((tmp_path / "jobs").rglob(f"app_{site}/config/config_fed_client.json")).read_text())
        component = config["executors"][0]["executor"]
        assert ("split" in component["args"]) == (site == "split")
        built[site] = Builder().build_component(component)
    assert built["split"].split == nvflare.RowSplit(test_size=0.3, seed=7, folds=3)
    assert built["default"].split is None
    ws = SimpleNamespace(get_site_config_dir=lambda: str(tmp_path / "local"), get_run_dir=lambda job: str(tmp_path))
    ctx = SimpleNamespace(get_identity_name=lambda: "split", get_job_id=lambda: "split-job",
                          get_engine=lambda: SimpleNamespace(get_workspace=lambda: ws))
    site, _ = built["split"]._site(ctx)  # no local/ file: the site's defaults and its own secret seed
    own_seed = kept_seed(tmp_path / "local" / nvflare.STATE_FOLDER)
    assert (site.test_size, site.seed, site.folds) == (0.2, own_seed, 5)
    nvflare.write_site_files(tmp_path, sites)  # the site's operator sets the split in its own file
    ctx.get_job_id = lambda: "split-job-2"
    site, _ = built["split"]._site(ctx)
    assert (site.test_size, site.seed, site.folds) == (0.3, 7, 3)
    ctx.get_identity_name, ctx.get_job_id = (lambda: "default"), (lambda: "default-job")
    site, _ = built["default"]._site(ctx)
    assert (site.test_size, site.seed, site.folds) == (0.2, own_seed, 5)


def test_a_sites_policy_given_as_json_text_travels_in_the_flare_job_as_an_object(nvflare, site_configs, jobs, tmp_path):
    """The site config's ``policy`` is JSON text (``fedtab.engines.site_config``); FLARE reads a
    ``"{...}"`` string in a job config as a variable reference and aborts the job, so the job
    carries the object and the site is built with it."""
    import json

    sites = [dict(site_configs[0], policy='{"allow_server_row_sets": true, "min_rows": 7}')]
    nvflare.build_job(sites, jobs.config(jobs.plan(**JOB))).export_job(str(tmp_path / "jobs"))
    config = json.loads(next((tmp_path / "jobs").rglob("app_site-1/config/config_fed_client.json")).read_text())
    policy = config["executors"][0]["executor"]["args"]["policy"]
    assert policy == {"allow_server_row_sets": True, "min_rows": 7}
