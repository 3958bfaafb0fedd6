"""Adam state survives a trip through numpy arrays (what a fresh Flower ClientApp restores)."""

import numpy as np
import pytest

# torch (and fedtab.impute.optim_state, which imports it) inside the tests: collection stays fast
pytestmark = pytest.mark.requires("torch")


def _model_and_optimizer():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)


def _step(model, opt, x):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def test_restored_optimizer_continues_exactly():
    import torch

    from fedtab.impute.optim_state import numpy_to_optimizer, optimizer_to_numpy

    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    model, opt = _model_and_optimizer()
    for _ in range(3):
        _step(model, opt, x)
    arrays = optimizer_to_numpy(opt)
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    assert {"0/step#scalar", "0/exp_avg", "0/exp_avg_sq"} <= set(arrays)
    assert arrays["0/step#scalar"].shape == (1,)  # 0-d values travel as 1-element arrays

    model2, opt2 = _model_and_optimizer()
    model2.load_state_dict(model.state_dict())
    numpy_to_optimizer(opt2, arrays)
    fresh, opt3 = _model_and_optimizer()  # same weights, but Adam restarts from zero moments
    fresh.load_state_dict(model.state_dict())
    for m, o in ((model, opt), (model2, opt2), (fresh, opt3)):
        _step(m, o, x)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_bad_state_is_rejected():
    from fedtab.impute.optim_state import numpy_to_optimizer

    model, opt = _model_and_optimizer()
    with pytest.raises(ValueError, match="index"):
        numpy_to_optimizer(opt, {"exp_avg": np.zeros(3)})
    with pytest.raises(ValueError, match="parameter 9"):
        numpy_to_optimizer(opt, {"9/exp_avg": np.zeros(3)})
    with pytest.raises(ValueError, match="shape"):
        numpy_to_optimizer(opt, {"0/exp_avg": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="one value"):
        numpy_to_optimizer(opt, {"0/step#scalar": np.zeros(2)})
