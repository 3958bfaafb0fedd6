"""The cost estimate of a Newton reply (issue 28 item 5): the gradient and Hessian sums over the rows
grow as ``n·size²`` (``size = k·(d+1)``), FedAvg's local epochs as ``n·size·epochs``. No timing here:
``python -m benchmarks.cost_model`` checks the estimates against measured CPU time."""

import pytest

from fedtab.learn.models import model_cost

NEWTON = "logistic"
FEDAVG = {"name": "logistic", "params": {"solver": "fedavg"}}


def test_newton_work_grows_with_the_square_of_the_size():
    small, big = (model_cost(NEWTON, d, 2, 10_000, 1) for d in (49, 199))  # size 50 and 200
    assert big.work / small.work == pytest.approx(16.0, rel=0.05)  # 4x the size: about 16x the work
    assert big.size == 200 * 200 + 200  # it holds the Hessian
    ten = model_cost(NEWTON, 49, 2, 100_000, 1)
    assert ten.work / small.work == pytest.approx(10.0, rel=0.05)  # linear in the rows


def test_multiclass_newton_counts_every_class_block_of_the_hessian():
    binary, four = model_cost(NEWTON, 99, 2, 10_000, 1), model_cost(NEWTON, 99, 4, 10_000, 1)
    assert four.work / binary.work == pytest.approx(16.0, rel=0.05)  # size 4·100 against 100


def test_newton_costs_more_than_one_fedavg_epoch_and_never_less_than_the_local_fit_it_can_be_asked_for():
    for d in (10, 100, 500):
        newton, fedavg = model_cost(NEWTON, d, 2, 5_000, 1), model_cost(FEDAVG, d, 2, 5_000, 1)
        assert newton.work > fedavg.work
        assert fedavg.size == d + 1
    # a Newton setup asked for 100 local L-BFGS epochs (a ``fit`` request) is charged those epochs
    assert model_cost(NEWTON, 3, 2, 5_000, 100).work == model_cost(FEDAVG, 3, 2, 5_000, 100).work
