"""Issue 29, item 5: a scikit-learn style selector keeps at most 9 constructor parameters. The
Markov blanket selector lost ``C`` (its logistic model's strength, fixed at 1.0) and Sequential
Attention ``n_threads`` (fixed at 1): nothing set either; a spec naming them is now refused by name."""

import inspect

import numpy as np
import pytest
from sklearn.base import clone

from fedtab.election.markov_blanket import MarkovBlanketSelector
from fedtab.election.selectors import make_selector
from fedtab.election.sequential_attention import SequentialAttentionSelector


@pytest.mark.parametrize("cls", [MarkovBlanketSelector, SequentialAttentionSelector])
def test_selector_has_at_most_nine_parameters_and_get_set_params_still_round_trip(cls):
    names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert len(names) <= 9
    sel = cls()
    assert sorted(sel.get_params()) == sorted(names)
    sel.set_params(seed=5)
    twin = clone(sel)
    assert twin.get_params() == sel.get_params() and twin.seed == 5


@pytest.mark.parametrize(("name", "param"), [("markov_blanket", "C"), ("sequential_attention", "n_threads")])
def test_a_spec_naming_a_removed_parameter_is_refused_by_name(name, param):
    with pytest.raises(ValueError, match=f"bad parameters for selector '{name}'.*'{param}'"):
        make_selector({"name": name, "params": {param: 2}})


def test_the_linear_markov_blanket_fits_its_logistic_model_at_strength_one():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5))
    y = (X[:, 0] + 0.3 * rng.normal(size=300) > 0).astype(int)
    sel = MarkovBlanketSelector(model="linear", n_splits=3)
    assert sel.LOGISTIC_C == 1.0
    out = sel.select(X, y)
    assert bool(out.mask[0])
