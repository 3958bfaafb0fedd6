"""The imputer's message passing in plain torch equals the PyTorch Geometric layer it replaced.

The reference is the ``MessagePassing`` layer fedtab shipped before (kept here verbatim, needs
torch_geometric): with the same weights, every forward pass — one layer and a whole imputer,
with and without the linear prior — gives the same numbers, so a model file predicts as before.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pyg = pytest.importorskip("torch_geometric.nn")

from torch import Tensor, nn  # noqa: E402

from fedtab.impute.graph import build_feature_graph  # noqa: E402
from fedtab.impute.model import GNNConfig, GNNImputer, SignedGraphConv, graph_tensors  # noqa: E402


class PygSignedGraphConv(pyg.MessagePassing):
    """fedtab's SignedGraphConv before it dropped torch_geometric (the sparse and edge-index paths)."""

    def __init__(self, dim: int) -> None:
        super().__init__(aggr="add", node_dim=0)
        self.lin = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, 1)

    def forward(self, x: Tensor, adj: Tensor, adj_abs: Tensor | None = None, edge_weight: Tensor | None = None) -> Tensor:
        g = torch.sigmoid(self.gate(x))
        if adj_abs is None:
            num = self.propagate(adj, x=self.lin(x) * g, edge_weight=edge_weight)
            den = self.propagate(adj, x=g, edge_weight=edge_weight.abs())
        else:
            num = self.propagate(adj, x=self.lin(x) * g, edge_weight=None)
            den = self.propagate(adj_abs, x=g, edge_weight=None)
        return num / (den + 1e-3)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return x_j * edge_weight.view(-1, 1, 1)

    def message_and_aggregate(self, adj_t: Tensor, x: Tensor) -> Tensor:
        f, b, d = x.shape
        return torch.sparse.mm(adj_t, x.reshape(f, b * d)).view(f, b, d)


def _graph(seed: int, f: int = 7, k: int = 3):
    c = np.corrcoef(np.random.default_rng(seed).normal(size=(60, f)).T)
    return build_feature_graph(c, [f"c{j}" for j in range(f)], k=k)


@pytest.mark.parametrize("seed", range(3))
def test_one_layer_equals_the_pyg_layer(seed):
    torch.manual_seed(seed)
    g = _graph(seed)
    ours, ref = SignedGraphConv(5), PygSignedGraphConv(5)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(7, 4, 5)
    adj = graph_tensors(g)
    assert torch.equal(ours(x, *adj), ref(x, *adj))
    ei, w = torch.as_tensor(g.edge_index), torch.as_tensor((g.sign * g.weight).astype(np.float32))
    with torch.no_grad():
        tol = 8 * torch.finfo(torch.float32).eps * float(ref(x, ei, edge_weight=w).abs().max())
    assert torch.allclose(ours(x, ei, edge_weight=w), ref(x, ei, edge_weight=w), rtol=0, atol=tol)
    assert set(ours.state_dict()) == {"lin.weight", "gate.weight", "gate.bias"}  # model files load as before


@pytest.mark.parametrize("prior_rank", [0, 2])
def test_a_whole_imputer_predicts_as_with_the_pyg_layer(prior_rank):
    torch.manual_seed(0)
    g = _graph(1)
    model = GNNImputer(GNNConfig(7, hidden_dim=6, n_layers=2, prior_rank=prior_rank)).eval()
    if prior_rank:
        rng = np.random.default_rng(0)
        model.set_prior(rng.normal(size=(7, prior_rank)), rng.uniform(0.5, 1.5, 7))
    rng = np.random.default_rng(1)
    values = torch.as_tensor(rng.normal(size=(9, 7)), dtype=torch.float32)
    observed = torch.as_tensor(rng.random((9, 7)) < 0.7)
    available = torch.as_tensor(rng.random(7) < 0.85)
    adj = graph_tensors(g)
    with torch.no_grad():
        ours = model(values, observed, available, adj)
        for layer in model.layers:
            conv = PygSignedGraphConv(6)
            conv.load_state_dict(layer.conv.state_dict())
            layer.conv = conv
        ref = model(values, observed, available, adj)
    assert torch.equal(ours, ref)


def test_importing_the_model_loads_no_torch_geometric():
    import subprocess
    import sys

    code = "import sys, fedtab.impute.model; print('torch_geometric' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"
