"""DP imputation: per-row gradients, their clipping bound, and a DP run that stays useful.

The GNN's DP training bounds each row's influence (per-row gradient clipping, noise on
the sum); these tests would fail if per-row gradients were wrong, if one hostile row
could move a step by more than the sensitivity the noise is calibrated to, or if a DP
run wrecked the imputer (the old whole-update DP-FedAvg gave RMSE ~10⁴ in z-space).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation import Site
from fedtab.federation.workflows.imputation import DP_STEPS_PER_ROUND, ImputeConfig, run_imputation
from fedtab.federation.protocol import set_options
from fedtab.impute.graph import build_feature_graph

# torch, dp_accounting (and fedtab.impute.model/dp_train, which import torch) inside the tests
pytestmark = pytest.mark.requires("torch", "dp_accounting")

F = 6


def _model_and_batch(seed: int = 0):
    import torch

    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    corr = np.corrcoef(rng.normal(size=(50, F)) @ rng.normal(size=(F, F)), rowvar=False)
    graph = build_feature_graph(corr, [f"c{i}" for i in range(F)], k=3)
    model = GNNImputer(GNNConfig(n_features=F, hidden_dim=8, n_layers=2, prior_rank=2))
    model.set_prior(rng.normal(size=(F, 2)) * 0.5, np.ones(F))
    with torch.no_grad():  # the correction head starts at 0: make every parameter matter
        for p in model.head.parameters():
            p.normal_(0.0, 0.3)
    x = torch.as_tensor(rng.normal(size=(5, F)).astype(np.float32))
    given = torch.as_tensor(rng.random((5, F)) < 0.6)
    hidden = ~given & torch.as_tensor(rng.random((5, F)) < 0.8)
    hidden[0, 0], given[0, 0] = True, False
    avail = torch.ones(5, F, dtype=torch.bool)
    return model, graph_tensors(graph), x, given, avail, hidden


def test_per_row_gradients_equal_autograd_on_each_row():
    import torch

    from fedtab.impute.dp_train import per_example_grads

    model, adj, x, given, avail, hidden = _model_and_batch()
    grads = per_example_grads(model, x, given, avail, hidden, adj)
    for i in range(len(x)):
        model.zero_grad()
        pred = model(x[i:i + 1], given[i:i + 1], avail[i:i + 1], adj)  # the sparse path
        h = hidden[i:i + 1].float()
        (((pred - x[i:i + 1]) * h) ** 2).sum().div(h.sum().clamp(min=1)).backward()
        for name, p in model.named_parameters():
            expected = p.grad if p.grad is not None else torch.zeros_like(p)
            # float32, summed in another order (vmap'ed per-row graphs vs one backward pass per row): measured
            # <= 4 eps32 at the gradients' O(1) scale and <= 45 eps32 of a tiny tensor's own scale. atol 1e-6
            # (~8 eps32 at 1) + rtol 1e-4 (~840 eps32); a wrong row, mask or loss moves gradients by O(1e-2+).
            torch.testing.assert_close(grads[name][i], expected, rtol=1e-4, atol=1e-6, msg=f"row {i}, {name}")


def test_one_hostile_row_moves_the_clipped_sum_by_at_most_twice_the_clip():
    import torch

    from fedtab.impute.dp_train import clipped_gradient_sum

    model, adj, x, given, avail, hidden = _model_and_batch(1)
    clip = 0.05
    before = clipped_gradient_sum(model, x, given, avail, hidden, adj, clip)
    x2, given2, hidden2 = x.clone(), given.clone(), hidden.clone()
    x2[2] = 1e6  # a row of extreme values, every entry given or hidden differently
    given2[2], hidden2[2] = ~given[2], given[2]
    after = clipped_gradient_sum(model, x2, given2, avail, hidden2, adj, clip)
    assert torch.isfinite(after).all()
    assert float(torch.linalg.norm(after - before)) <= 2 * clip * (1 + 1e-5)
    assert float(torch.linalg.norm(after - before)) > 0  # the row does count


def _sites(seed: int) -> tuple[LocalFederation, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(1800, 2))
    full = pd.DataFrame(z @ rng.normal(size=(2, 5)) + 0.3 * rng.normal(size=(1800, 5)), columns=list("abcde"))
    full = (full - full.mean()) / full.std()
    keep = [list("abcd"), list("bcde"), list("acde")]
    return LocalFederation([Site(f"s{i}", full.iloc[i * 600:(i + 1) * 600][cols], test_size=0.1)
                            for i, cols in enumerate(keep)]), full


def _rmse_of_unheld_column(r, full: pd.DataFrame) -> float:
    """RMSE (z-space) of column "e" predicted for site 0's rows, which do not hold it."""
    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors, numpy_to_state
    from fedtab.impute.train import predict

    model = GNNImputer(GNNConfig(**r.model_config))
    numpy_to_state(model, r.weights)
    if r.prior_W is not None:
        model.set_prior(r.prior_W, r.prior_psi)
    zed = ((full.iloc[:600][r.columns] - r.mean) / r.std).to_numpy()
    col = r.columns.index("e")
    given = zed.copy()
    given[:, col] = np.nan
    pred = predict(model, given, np.ones(len(r.columns), bool), graph_tensors(r.graph))
    return float(np.sqrt(np.mean((pred[:, col] - zed[:, col]) ** 2)))


def test_dp_imputation_accounts_every_gradient_step_and_stays_useful():
    # ε = 50: a correctly calibrated run is close to the plain one (the old whole-update
    # DP-FedAvg put noise of ~0.5 on every weight at this ε and predicted garbage)
    rounds = 2
    dp = {"epsilon": 50.0, "delta": 1e-5, "bounds": [-5, 5]}
    cfg = dict(rounds=rounds, hidden_dim=8, n_layers=1, n_threads=1)
    fed, full = _sites(0)
    set_options(fed, dp=dp)
    res = run_imputation(fed, ImputeConfig(**cfg))
    assert res.privacy["releases"] == {"imputation.schema": 3, "imputation.stats": 7,
                                       "imputation.fit": rounds * DP_STEPS_PER_ROUND}
    assert res.privacy["total"] == pytest.approx(50.0, rel=0.01)
    plain = _rmse_of_unheld_column(run_imputation(_sites(0)[0], ImputeConfig(**cfg)), full)
    private = _rmse_of_unheld_column(res, full)
    assert plain < 0.6 and private < 1.5 * plain, (plain, private)


@pytest.mark.parametrize("steps", [0, -1, 10**6, 2.5, True, "3"])
def test_a_site_refuses_an_unbounded_or_malformed_number_of_dp_steps(steps):
    from fedtab.federation.workflows.imputation.site import _dp_steps

    with pytest.raises(ValueError, match="steps must be an integer"):
        _dp_steps({"z": 1.0, "clip": 1.0, "steps": steps})
    assert _dp_steps({"z": 1.0, "clip": 1.0, "steps": 3}) == 3
