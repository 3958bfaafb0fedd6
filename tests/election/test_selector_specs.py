"""The selector table the server checks specs against without scikit-learn (fedtab.election.selector_table,
used by fedtab.election.selector_specs) stays the selector classes' own, and the light check accepts and
refuses what make_selector, which checks with the same table and then builds, does."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from fedtab.election.selector_specs import SELECTOR_DEFAULTS, check_selector, selector_wire_spec
from fedtab.election.selectors import SELECTORS, LassoSelector, make_selector, selector_spec

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_table_is_every_selector_class_with_its_constructors_defaults():
    assert sorted(SELECTOR_DEFAULTS) == sorted(SELECTORS)
    for name, cls in SELECTORS.items():
        signature = inspect.signature(cls.__init__).parameters
        assert SELECTOR_DEFAULTS[name] == {k: p.default for k, p in signature.items() if k != "self"}, name
        assert all(p.default is not inspect.Parameter.empty for k, p in signature.items() if k != "self"), name


@pytest.mark.parametrize("name", sorted(SELECTOR_DEFAULTS))
def test_the_wire_spec_of_a_name_is_the_built_selectors(name):
    assert selector_wire_spec(name) == selector_spec(name)
    some = {k: v for k, v in list(SELECTOR_DEFAULTS[name].items())[:2]}
    some = {k: (7 if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in some.items()}
    spec = {"name": name.replace("_", "-").upper(), "params": some}
    assert selector_wire_spec(spec) == selector_spec(spec)
    assert list(selector_wire_spec(spec)["params"]) == sorted(SELECTOR_DEFAULTS[name])


def _outcome(fn, spec) -> str:  # noqa: ANN001
    try:
        fn(spec)
    except ValueError as exc:
        return "refused: " + str(exc).split(":")[0]
    return "accepted"


names = st.sampled_from([*SELECTOR_DEFAULTS, "Lasso", "random-forest", "nope", "", "LASSO_CV"])
param_names = st.sampled_from(["C", "alpha", "k", "seed", "task", "n_trees", "hidden", "bogus", "n_threads"])
specs = st.one_of(names, st.fixed_dictionaries(
    {"name": names, "params": st.one_of(st.dictionaries(param_names, st.integers(0, 5), max_size=3), st.none(),
                                        st.lists(st.integers(), max_size=2), st.just("C=1"))}))


@settings(max_examples=300, deadline=None)
@given(specs)
def test_the_light_check_accepts_and_refuses_as_building_the_selector_does(spec):
    assert _outcome(check_selector, spec) == _outcome(make_selector, spec)


def test_the_refusals_name_the_selector_and_the_parameter():
    with pytest.raises(ValueError, match=r"unknown selector 'nope'; known: \['anova'"):
        check_selector("nope")
    with pytest.raises(ValueError, match=r"bad parameters for selector 'lasso': unexpected parameter\(s\) 'bogus'; "
                                         r"it takes C, alpha, task, tol, seed"):
        check_selector({"name": "lasso", "params": {"bogus": 1}})
    with pytest.raises(ValueError, match="params must be a table of name = value, got list"):
        check_selector({"name": "lasso", "params": [1]})
    check_selector(LassoSelector(C=3.0))  # an object: built (it is one already)
    with pytest.raises(ValueError, match="cannot build a selector"):
        check_selector({"params": {}})  # no name: make_selector's own refusal


def test_checking_and_sending_a_named_spec_imports_no_scikit_learn():
    code = ("import sys\nfrom fedtab.election.selector_specs import check_selector, selector_wire_spec\n"
            "check_selector({'name': 'markov-blanket', 'params': {'n_trees': 5}})\n"
            "print(selector_wire_spec('lasso_cv')['params']['Cs'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'pandas')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10", "[]"]
