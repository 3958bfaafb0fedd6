"""fedtab on NVIDIA FLARE 2.9: FedtabController + FedtabExecutor in the simulator.

Results must equal the in-process engine's; the simulator's return code is checked
(``run_simulator`` raises on a non-zero code).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows
from tests.builders import local_reference

# fedtab.engines.nvflare imports NVIDIA FLARE (~1 s): inside the tests, not at collection
pytestmark = pytest.mark.requires("nvflare")

RUN = {"steps": "election,training", "freedom-degree": 0.5, "rounds": 2, "local-epochs": 2}
# the simulator run also tunes the freedom degree first (many more, cheap, FLARE tasks)
TUNED_RUN = {"steps": "tuning,election,training", "rounds": 1, "local-epochs": 2,
             "tuning-config": {"grid": [0.0, 1.0], "refine_step": 0.0}}


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
                        "target": "target", "selector": "nvflare-lasso"})
    return configs


@pytest.fixture(scope="module")
def reference(site_configs) -> dict:
    return local_reference(site_configs, TUNED_RUN)


def test_build_job_rejects_unknown_site_arguments(site_configs):
    from fedtab.engines.nvflare import build_job

    bad = [dict(site_configs[0], colour="blue")]
    with pytest.raises(ValueError, match="colour"):
        build_job(bad, RUN)


@pytest.mark.slow
def test_simulator_matches_local_engine(site_configs, reference, tmp_path):
    from fedtab.engines.nvflare import run_simulator

    result = run_simulator(site_configs, TUNED_RUN, tmp_path, threads=3)
    assert result["engine"] == "nvflare"
    assert result["tuning"]["freedom_degree"] == reference["tuning"]["freedom_degree"]
    assert result["tuning"]["selected"] == reference["tuning"]["selected"]
    assert result["sites"] == ["site-1", "site-2", "site-3"]
    assert result["election"]["selected"] == reference["election"]["selected"]
    assert result["election"]["mask"] == reference["election"]["mask"]
    for key, value in reference["training"]["params"].items():
        np.testing.assert_allclose(result["training"]["params"][key], value, rtol=1e-9, atol=1e-12)
    assert result["training"]["weighted_f1"] == pytest.approx(reference["training"]["weighted_f1"], abs=1e-12)
    # per-site state was persisted in each client's run directory
    assert len(list((tmp_path / "sim").glob("site-*/simulate_job/fedtab_site_state.bin"))) == 3


@pytest.mark.slow
def test_simulator_failure_is_reported(site_configs, tmp_path):
    from fedtab.engines.nvflare import SimulatorError, run_simulator

    broken = [dict(c) for c in site_configs]
    broken[2]["data-path"] = "/nonexistent/site3.csv"
    with pytest.raises(SimulatorError):
        run_simulator(broken, RUN, tmp_path, threads=3)


@pytest.mark.slow
def test_simulator_runs_imputation(tmp_path, imputation_site_configs):
    pytest.importorskip("torch")
    from fedtab.engines.nvflare import run_simulator

    configs = imputation_site_configs
    run = {"steps": "imputation", "impute-rounds": 2,
           "impute-config": {"hidden_dim": 8, "n_layers": 1, "n_threads": 1}}
    ref = local_reference(configs, run)
    result = run_simulator(configs, run, tmp_path / "flare", threads=2)
    assert result["imputation"]["columns"] == ref["imputation"]["columns"]
    # a float32 RMSE of the same computation: rel 1e-6 is ~8 eps32
    assert result["imputation"]["validation"]["overall"] == pytest.approx(ref["imputation"]["validation"]["overall"],
                                                                         rel=1e-6)
