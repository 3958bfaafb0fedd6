"""The model file's imputer network in numpy (``job/model_file/imputer_net.py``) is the torch
``GNNImputer``: the same weight names and shapes for every configuration, the same predictions
(float32 tolerance) with and without the linear prior and ``block_unavailable``, over rows with
missing cells and columns a row's site lacks; a bad config or weight set is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedtab.job.model_file.imputer_net import CONFIG_DEFAULTS, NumpyImputerNet, net_config, weight_shapes

torch = pytest.importorskip("torch")
from fedtab.impute.graph import FeatureGraph  # noqa: E402
from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors, state_to_numpy  # noqa: E402
from fedtab.impute.train import predict  # noqa: E402

F = 7
CONFIGS = {
    "plain": dict(hidden_dim=8, n_layers=2),
    "no_layers": dict(hidden_dim=5, n_layers=0),
    "prior": dict(hidden_dim=8, n_layers=2, prior_rank=2),
    "prior_no_clip": dict(hidden_dim=6, n_layers=1, prior_rank=3, prior_clip=None),
    "blocked": dict(hidden_dim=8, n_layers=3, block_unavailable=True, prior_rank=2),
}


def _graph(rng: np.random.Generator) -> FeatureGraph:
    pairs = [(i, j) for i in range(F) for j in range(F) if i != j and rng.random() < 0.5]
    src, tgt = np.array(pairs, dtype=np.int64).T
    return FeatureGraph([f"c{i}" for i in range(F)], np.stack([src, tgt]), rng.uniform(0.1, 1.0, len(pairs)),
                        rng.choice([-1.0, 1.0], len(pairs)))


def _trained_like(cfg: GNNConfig, rng: np.random.Generator) -> GNNImputer:
    """A module whose every weight is random (a fresh one has a zero head with the prior)."""
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = GNNImputer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def test_the_config_defaults_are_gnnconfigs():
    defaults = {f.name: f.default for f in dataclasses.fields(GNNConfig) if f.name != "n_features"}
    assert defaults == CONFIG_DEFAULTS


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_weight_shapes_are_the_torch_modules(name):
    cfg = GNNConfig(n_features=F, **CONFIGS[name])
    state = {k: tuple(v.shape) for k, v in GNNImputer(cfg).state_dict().items()}
    assert weight_shapes(net_config(cfg.to_dict())) == state


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_numpy_predictions_equal_the_torch_modules(name):
    rng = np.random.default_rng(7)
    cfg = GNNConfig(n_features=F, **CONFIGS[name])
    graph, model = _graph(rng), _trained_like(cfg, rng)
    w = rng.normal(size=(F, cfg.prior_rank)) if cfg.prior_rank else None
    psi = rng.uniform(0.3, 1.5, F) if cfg.prior_rank else None
    if cfg.prior_rank:
        model.set_prior(w, psi)
    values = rng.normal(size=(40, F)) * 2.0
    values[:, 2] *= 20  # beyond the prior's clip
    values[rng.random(values.shape) < 0.3] = np.nan
    available = rng.random((40, F)) < 0.8
    want = predict(model, values, available, graph_tensors(graph), batch_size=16)
    net = NumpyImputerNet(net_config(cfg.to_dict()), state_to_numpy(model), graph.edge_index,
                          graph.sign * graph.weight, (w, psi) if cfg.prior_rank else None)
    got = net.predict(values, available, batch_size=16)
    assert got.shape == (40, F) and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    # one (F,) availability for every row, as fedtab predict passes it
    np.testing.assert_allclose(net.predict(values, available[0]), predict(model, values, available[0],
                                                                           graph_tensors(graph)), rtol=1e-4, atol=1e-4)


def test_a_different_network_gives_different_predictions():
    """The comparison above can fail: one changed weight moves the numpy predictions."""
    rng = np.random.default_rng(3)
    cfg = GNNConfig(n_features=F, hidden_dim=8, n_layers=2)
    graph, model = _graph(rng), _trained_like(cfg, rng)
    weights = state_to_numpy(model)
    values = rng.normal(size=(10, F))
    values[rng.random(values.shape) < 0.3] = np.nan
    base = NumpyImputerNet(net_config(cfg.to_dict()), weights, graph.edge_index, graph.sign * graph.weight)
    weights["layers.1.conv.lin.weight"] = weights["layers.1.conv.lin.weight"] + 0.5
    moved = NumpyImputerNet(net_config(cfg.to_dict()), weights, graph.edge_index, graph.sign * graph.weight)
    assert np.abs(base.predict(values, np.ones(F, bool)) - moved.predict(values, np.ones(F, bool))).max() > 1e-3


@pytest.mark.parametrize("doc, message", [
    ({"n_features": F, "width": 3}, "unknown setting"),
    ({"hidden_dim": 8}, "n_features is missing"),
    ({"n_features": F, "hidden_dim": 0}, "hidden_dim"),
    ({"n_features": F, "n_layers": True}, "n_layers"),
    ({"n_features": F, "prior_clip": float("nan")}, "prior_clip"),
    ({"n_features": F, "block_unavailable": 1}, "block_unavailable"),
    ([F], "object"),
])
def test_a_bad_config_is_refused(doc, message):
    with pytest.raises(ValueError, match=message):
        net_config(doc)


def test_bad_weights_or_a_missing_prior_are_refused():
    rng = np.random.default_rng(0)
    cfg = GNNConfig(n_features=F, hidden_dim=4, n_layers=1, prior_rank=2)
    graph, weights = _graph(rng), state_to_numpy(GNNImputer(cfg))
    args = (graph.edge_index, graph.sign * graph.weight)
    nc = net_config(cfg.to_dict())
    with pytest.raises(ValueError, match="needs its prior"):
        NumpyImputerNet(nc, weights, *args)
    with pytest.raises(ValueError, match="do not match"):
        NumpyImputerNet(nc, {**weights, "extra": np.zeros(1)}, *args, (np.ones((F, 2)), np.ones(F)))
    with pytest.raises(ValueError, match="do not match"):
        NumpyImputerNet(nc, {**weights, "embed.weight": np.zeros((F, 5))}, *args, (np.ones((F, 2)), np.ones(F)))
    with pytest.raises(ValueError, match="not finite"):
        NumpyImputerNet(nc, {**weights, "head.2.bias": np.array([np.inf])}, *args, (np.ones((F, 2)), np.ones(F)))
    with pytest.raises(ValueError, match="prior"):
        NumpyImputerNet(nc, weights, *args, (np.ones((F, 2)), -np.ones(F)))
