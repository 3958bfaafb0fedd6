"""The imputer's default batches (issue 31): about 8 optimiser steps per epoch at a site, in
batches of 32 to 256 rows, so a big site pays for few large steps and a small one keeps enough."""

import numpy as np
import pytest

from fedtab.federation.workflows.imputation.config import ImputeConfig

pytestmark = pytest.mark.requires("torch")


def test_auto_batch_size_aims_at_eight_steps_within_32_to_256_rows():
    from fedtab.impute.train import auto_batch_size

    assert auto_batch_size(0) == 32
    assert auto_batch_size(60) == 32       # a heart small site: 2 steps of 32 rows, not 1 of 60
    assert auto_batch_size(250) == 32      # a SECOM-sized site: 8 steps of 32 rows, not 1 of 250
    assert auto_batch_size(313) == 40      # 8 steps
    assert auto_batch_size(640) == 80      # PhysioNet-sized: 8 steps
    assert auto_batch_size(1497) == 188    # AirQuality-sized: 8 steps, not 24 of 64 rows
    assert auto_batch_size(10_000) == 256
    with pytest.raises(ValueError, match="n_rows"):
        auto_batch_size(-1)


def _site(n, f=6, seed=0):
    import torch

    from fedtab.impute.graph import FeatureGraph
    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors

    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, f))
    values[rng.random(values.shape) < 0.1] = np.nan
    src, tgt = np.arange(f), (np.arange(f) + 1) % f
    graph = FeatureGraph([f"c{i}" for i in range(f)], np.stack([src, tgt]), np.full(f, 0.5), np.ones(f))
    torch.manual_seed(seed)
    model = GNNImputer(GNNConfig(f, hidden_dim=8, n_layers=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, values, np.ones(f, bool), graph_tensors(graph)


@pytest.mark.parametrize("n, steps", [(1000, 8), (200, 7), (3000, 12)])
def test_local_train_without_batch_size_takes_the_auto_batches(n, steps):
    from fedtab.impute.train import Schedule, local_train

    model, opt, values, avail, adj = _site(n)
    loss, taken = local_train(model, opt, values, avail, adj, schedule=Schedule(epochs=1, batch_size=None),
                              rng=np.random.default_rng(1))
    assert taken == steps
    assert np.isfinite(loss)


def test_an_explicit_batch_size_is_kept():
    from fedtab.impute.train import Schedule, local_train

    model, opt, values, avail, adj = _site(1000)
    _, taken = local_train(model, opt, values, avail, adj, schedule=Schedule(epochs=2, batch_size=64),
                           rng=np.random.default_rng(1))
    assert taken == 2 * 16


def test_config_defaults_are_the_auto_batches_and_bad_sizes_are_refused():
    cfg = ImputeConfig()
    assert (cfg.batch_size, cfg.rounds, cfg.local_epochs, cfg.lr) == (None, 3, 8, 6e-3)
    cfg.validate()
    with pytest.raises(ValueError, match="batch_size=0"):
        ImputeConfig(batch_size=0).validate()


def test_the_imputation_defaults_agree_everywhere_they_are_declared():
    """``[impute]`` (ImputeSpec), the workflow's ImputeConfig, FederatedImputer and ``fedtab impute``
    declare the same training defaults: 3 rounds of 8 local epochs (issue 31: 20 rounds of one epoch
    before), so a job, the estimator and the command line impute alike."""
    import inspect
    from dataclasses import fields

    from fedtab.cli.impute import impute_command
    from fedtab.estimators.imputer import FederatedImputer
    from fedtab.job.spec import ImputeSpec

    config = {f.name: f.default for f in fields(ImputeConfig)}
    spec = {f.name: f.default for f in fields(ImputeSpec) if not f.name.startswith("_")}
    shared = set(spec) - {"prior"}
    assert {k: spec[k] for k in shared} == {k: config[k] for k in shared} and spec["prior"] == config["use_prior"]
    estimator = inspect.signature(FederatedImputer).parameters
    assert all(estimator[k].default == config[k] for k in shared if k in estimator)
    command = inspect.signature(impute_command).parameters
    assert (command["rounds"].default, command["local_epochs"].default) == (config["rounds"], config["local_epochs"])
    assert (config["rounds"], config["local_epochs"], config["batch_size"]) == (3, 8, None)
