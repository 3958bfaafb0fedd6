"""fedtab on Flower 1.42: the real ServerApp/ClientApp in one process, and a loopback deployment.

The deployment test starts ``flower-superlink --insecure`` and three
``flower-supernode --insecure`` on 127.0.0.1, ``flwr run``s the app and compares the
elected mask and the trained model with the in-process engine's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedtab.data import classification_table, split_rows  # noqa: E402
from fedtab.engines import LocalFederation  # noqa: E402
from fedtab.engines import flower  # noqa: E402
from fedtab.engines.pipeline import run_pipeline  # noqa: E402
from fedtab.engines.site_config import build_site  # noqa: E402
from fedtab.federation.messages import Message  # noqa: E402

RUN = {"steps": "election,training", "freedom-degree": 0.5, "rounds": 2, "local-epochs": 2}
# fewer steps for the deployment, where every step costs seconds (a ClientApp process per message)
DEPLOY_RUN = {**RUN, "rounds": 1}


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("flower_sites")
    table = classification_table(900, 30, 6, 4, seed=3)
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify="target", seed=0)
    configs = []
    for i, part in enumerate(parts):
        path = root / f"site{i + 1}.csv"
        part.to_csv(path, index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(path), "target": "target", "selector": "lasso"})
    return configs


@pytest.fixture(scope="module")
def reference(site_configs) -> dict:
    return run_pipeline(LocalFederation([build_site(c) for c in site_configs]), RUN)


def _assert_same(result: dict, ref: dict) -> None:
    assert result["election"]["selected"] == ref["election"]["selected"]
    assert result["election"]["mask"] == ref["election"]["mask"]
    assert result["training"]["features"] == ref["training"]["features"]
    for key, value in ref["training"]["params"].items():
        np.testing.assert_allclose(result["training"]["params"][key], value, rtol=1e-9, atol=1e-12)
    assert result["training"]["weighted_f1"] == pytest.approx(ref["training"]["weighted_f1"], abs=1e-12)


def test_records_round_trip_without_pickle():
    msg = Message("ballot", {"mask": np.array([True, False]), "scores": np.arange(3.0), "names": np.array(["a", "b"])},
                  {"n_samples": 7, "nested": {"x": [1, 2]}})
    back = flower.from_records(flower.to_records(msg))
    assert back.kind == "ballot" and back.meta == msg.meta
    for k, v in msg.arrays.items():
        np.testing.assert_array_equal(back.arrays[k], v)
        assert back.arrays[k].dtype == v.dtype


def test_in_process_server_and_client_apps_match_local_engine(site_configs, reference):
    # fresh_processes: the live-site cache is cleared before every message, so the
    # elected mask and training setup must survive in Flower's Context.state.
    result = flower.run_in_process(site_configs, RUN, fresh_processes=True)
    assert result["engine"] == "flower"
    assert result["sites"] == ["site-1", "site-2", "site-3"]
    assert 0 < result["election"]["kept"] < 30
    _assert_same(result, reference)


def test_in_process_site_failure_is_named(site_configs):
    broken = [dict(c) for c in site_configs]
    broken[1]["data-path"] = "/nonexistent/site2.csv"
    with pytest.raises(Exception, match="site-2|site2"):
        flower.run_in_process(broken, RUN)


def test_in_process_tuning_then_election_matches_local_engine(site_configs):
    run = {"steps": "tuning,election,training", "rounds": 1, "local-epochs": 1,
           "tuning-config": '{"grid": [0.0, 0.5, 1.0]}'}
    ref = run_pipeline(LocalFederation([build_site(c) for c in site_configs]), run)
    result = flower.run_in_process(site_configs, run, fresh_processes=True)
    assert result["tuning"]["freedom_degree"] == ref["tuning"]["freedom_degree"]
    assert result["tuning"]["selected"] == ref["tuning"]["selected"]
    assert result["election"]["selected"] == ref["election"]["selected"]
    assert result["training"]["weighted_f1"] == pytest.approx(ref["training"]["weighted_f1"], abs=1e-12)


def test_in_process_imputation_matches_local_engine(tmp_path, imputation_site_configs):
    pytest.importorskip("torch")
    configs = imputation_site_configs
    run = {"steps": "imputation", "impute-rounds": 2,
           "impute-config": '{"hidden_dim": 8, "n_layers": 1, "n_threads": 1}'}
    ref = run_pipeline(LocalFederation([build_site(c) for c in configs]), run)
    # the imputer's torch state cannot live in Context.state: keep the ClientApp process alive
    result = flower.run_in_process(configs, run, fresh_processes=False)
    assert result["imputation"]["columns"] == ref["imputation"]["columns"]
    assert result["imputation"]["validation"]["overall"] == pytest.approx(ref["imputation"]["validation"]["overall"],
                                                                         rel=1e-6)


def _flower_binaries() -> bool:
    bin_dir = Path(os.sys.executable).parent
    return all((bin_dir / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


@pytest.mark.slow
@pytest.mark.skipif(not _flower_binaries(), reason="Flower CLI binaries not installed")
def test_loopback_deployment_matches_local_engine(site_configs, tmp_path):
    from fedtab.engines.flower_deploy import LoopbackDeployment

    reference = run_pipeline(LocalFederation([build_site(c) for c in site_configs]), DEPLOY_RUN)
    dep = LoopbackDeployment(site_configs, tmp_path / "deployment", start_timeout=90)
    try:
        dep.start()
        result = dep.run(DEPLOY_RUN, timeout=240)
    finally:
        dep.stop()
        leftovers = dep._stragglers()
    assert not leftovers, f"processes left running: {leftovers}"
    assert result["engine"] == "flower"
    assert result["sites"] == ["site-1", "site-2", "site-3"]
    _assert_same(result, reference)
