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
    # as on a SuperNode, every message meets a fresh process: the imputer's model, Adam
    # moments and random state must come back from Context.state (arrays + JSON only)
    result = flower.run_in_process(configs, run, fresh_processes=True)
    _assert_same_imputation(result, ref)


def _assert_same_imputation(result: dict, ref: dict) -> None:
    assert result["imputation"]["columns"] == ref["imputation"]["columns"]
    assert [h["round"] for h in result["imputation"]["history"]] == [h["round"] for h in ref["imputation"]["history"]]
    for got, want in zip(result["imputation"]["history"], ref["imputation"]["history"]):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-5)
    assert result["imputation"]["validation"]["overall"] == pytest.approx(ref["imputation"]["validation"]["overall"],
                                                                         rel=1e-5)


def _flower_binaries() -> bool:
    bin_dir = Path(os.sys.executable).parent
    return all((bin_dir / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


def _run_on_loopback(configs: list[dict], run: dict, workdir: Path, timeout: float) -> dict:
    """Start a SuperLink + one SuperNode per config, ``flwr run`` ``run``, and check that
    stopping the deployment left no process behind."""
    from fedtab.engines.flower_deploy import LoopbackDeployment

    dep = LoopbackDeployment(configs, workdir, start_timeout=90)
    try:
        dep.start()
        result = dep.run(run, timeout=timeout)
    finally:
        dep.stop()
        leftovers = dep._stragglers()
    assert not leftovers, f"processes left running: {leftovers}"
    assert result["engine"] == "flower"
    return result


@pytest.mark.slow
@pytest.mark.skipif(not _flower_binaries(), reason="Flower CLI binaries not installed")
def test_loopback_deployment_matches_local_engine(site_configs, tmp_path):
    reference = run_pipeline(LocalFederation([build_site(c) for c in site_configs]), DEPLOY_RUN)
    result = _run_on_loopback(site_configs, DEPLOY_RUN, tmp_path / "deployment", timeout=240)
    assert result["sites"] == ["site-1", "site-2", "site-3"]
    _assert_same(result, reference)


@pytest.mark.slow
@pytest.mark.skipif(not _flower_binaries(), reason="Flower CLI binaries not installed")
def test_loopback_deployment_runs_imputation(imputation_site_configs, tmp_path):
    """FedHF-Impute on real SuperNodes, where each message runs in a new ClientApp process."""
    pytest.importorskip("torch")
    run = {"steps": "imputation", "impute-rounds": 2,
           "impute-config": '{"hidden_dim": 8, "n_layers": 1, "n_threads": 1}'}
    reference = run_pipeline(LocalFederation([build_site(c) for c in imputation_site_configs]), run)
    result = _run_on_loopback(imputation_site_configs, run, tmp_path / "deployment", timeout=300)
    _assert_same_imputation(result, reference)


def test_config_strings_survive_flowers_key_value_parser():
    from flwr.common.config import parse_config_args

    from fedtab.engines.flower_deploy import _toml_value

    cfg = {"impute-config": '{"hidden_dim": 8, "n_layers": 1}', "data-path": "/tmp/a b/site.csv",
           "note": "it's", "rounds": 3, "fd": 0.5, "flag": True}
    line = " ".join(f"{k}={_toml_value(v)}" for k, v in cfg.items())
    assert parse_config_args([line]) == cfg
    with pytest.raises(ValueError, match="cannot carry"):
        _toml_value("""both ' and " quotes""")
