"""Modes as wrappers of one summing strategy: no mode test in converted workflow steps, a new
mode is one wrapper class, the wrappers' measurements, the accountant refusing before sending."""

import ast
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedtab import run_training
from fedtab.federation.protocol import set_options
from fedtab.federation.protocol.modes import (Outcome, RunStrategy, SumStep, check_modes, run_strategy,
                                              supported_modes, use_wrapper)
import fedtab.federation.workflows.selection.server  # noqa: F401  (declares its modes)
from fedtab.federation.steps.evaluate import evaluate
from fedtab.privacy.accountant import PrivacyLedger
from tests.builders import classification_parts, federation

FEDERATION = Path(__file__).resolve().parents[3] / "src" / "fedtab" / "federation"
MODE = re.compile(r"secure|secure_aggregation|dp|noisy|robust|DP_META|SECAGG_META")
#: no module under ``federation/workflows/`` or ``federation/steps/`` tests a mode: the server side is one SumStep per
#: step on the run's strategy (protocol/modes.py); on the site side a kind declares the mods of its handler
#: under a mode (MessageKind.mods: e.g. a DP release of exact moments, the DP ballot, the ``noise``
#: parameter of DP gradient steps, the ``masked`` parameter under secure sums) and Site.handle applies them
#: (fedtab.federation.site.mods), so a handler branches on its own parameters, never on the mode.
WORKFLOW_MODULES = sorted(str(p.relative_to(FEDERATION)) for part in ("workflows", "steps")
                          for p in (FEDERATION / part).rglob("*.py"))


def mode_ifs(path: Path) -> list[int]:
    """Lines of ``if`` statements, conditional expressions and comprehension filters whose test
    names secure/dp/robust (a variable, attribute or string key)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        tests = node.ifs if isinstance(node, ast.comprehension) else \
            [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
        for test in tests:
            for n in ast.walk(test):
                name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else \
                    n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None
                if name is not None and MODE.fullmatch(name):
                    lines.append(getattr(node, "lineno", None) or test.lineno)
                    break
    return lines


def test_the_scan_sees_a_mode_test(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f(opts, x):\n    if opts.dp is not None:\n        x = 1\n    y = 2 if opts.robust else 3\n"
                 "    return [v for v in x if secure]\n")
    assert mode_ifs(f) == [2, 4, 5]


@pytest.mark.parametrize("module", WORKFLOW_MODULES)
def test_converted_workflow_modules_test_no_mode(module):
    assert mode_ifs(FEDERATION / module) == []


class ScaledSums(RunStrategy):
    """A toy mode: the summed arrays of the steps of ``kinds`` multiplied by ``factor`` before the reduction."""

    mode = "scaled"

    def __init__(self, inner, factor=2.0, kinds=("evaluate",)):
        self.inner, self.factor, self.kinds, self.seen = inner, factor, kinds, []

    def run(self, federation, step, *, on_error=None):
        self.seen.append(step.kind or step.request.kind)
        if (step.kind or step.request.kind) not in self.kinds:
            return self.inner.run(federation, step, on_error=on_error)

        def scaled(summed):
            parts = {k: replace(m, arrays={a: (np.asarray(v) * self.factor if a in step.spec.fields else v)
                                           for a, v in m.arrays.items()}) for k, m in summed.parts.items()}
            return replace(summed, parts=parts, sums={k: v * self.factor for k, v in summed.sums.items()})

        return self.inner.run(federation, replace(step, aggregate=lambda s: step.aggregate(scaled(s))),
                              on_error=on_error)

    def reduce(self, reduction):
        return self.inner.reduce(reduction)


def _fed(seed=1):
    table, parts = classification_parts(450, 6, 3, 2, seed=seed, class_sep=1.5)
    return federation(parts), [c for c in table.columns if c != "target"]


def test_a_new_mode_is_one_wrapper_class_used_by_a_run_without_touching_a_workflow():
    fed, feats = _fed()
    plain = run_training(fed, feats, rounds=2, seed=0)
    fed2, _ = _fed()
    made = []
    use_wrapper(fed2, lambda inner: made.append(ScaledSums(inner)) or made[-1])
    scaled = run_training(fed2, feats, rounds=2, seed=0)
    for k in plain.params:  # describe and fit untouched: the same model
        np.testing.assert_allclose(scaled.params[k], plain.params[k], rtol=1e-12)
    assert scaled.metrics["pooled"]["n"] == 2 * plain.metrics["pooled"]["n"]  # the evaluation's sums doubled
    assert scaled.metrics["pooled"]["accuracy"] == pytest.approx(plain.metrics["pooled"]["accuracy"])
    assert {"describe", "newton", "evaluate"} <= {k for w in made for k in w.seen}  # logistic: Newton–Raphson


def test_the_accountant_refuses_a_release_before_the_request_goes_out():
    fed, feats = _fed()
    dp = {"epsilon": 2.0, "bounds": [-6, 6]}
    set_options(fed, dp=dp)
    out = run_training(fed, feats, rounds=1, seed=0, eval_every=0)
    ledger = PrivacyLedger.for_plan(fed.options.dp, {"training.evaluate": 1}, {})
    evaluate(fed, out.params, 2, ledger=ledger)
    sent = len(fed.traffic.records)
    with pytest.raises(RuntimeError, match="exceeds the 1 planned"):
        evaluate(fed, out.params, 2, ledger=ledger)
    assert len(fed.traffic.records) == sent  # nothing went out
    assert ledger.spent == {"training.evaluate": 1}


def test_the_wrappers_measure_beside_their_result():
    fed, feats = _fed()
    set_options(fed, dp={"epsilon": 2.0, "bounds": [-6, 6]}, robust=True)
    out = run_training(fed, feats, rounds=1, seed=0, eval_every=0)
    ledger = PrivacyLedger.for_plan(fed.options.dp, {"training.evaluate": 2}, {})
    strategy = run_strategy(fed, ledger)
    assert strategy.modes == ("dp", "robust")
    from fedtab.federation.steps.evaluate import evaluate_step

    result = strategy.run(fed, evaluate_step(fed, out.params, 2))
    assert isinstance(result, Outcome) and result.measurements.releases == {"training.evaluate": 1}
    eps = result.measurements.epsilon["training.evaluate"]
    assert eps is not None and 0 < eps <= 2.0 + 1e-9
    assert result.measurements.clipped >= 0 and set(result.result["per_site"]) == set(fed.active)


def test_a_step_states_its_modes_once_and_a_run_outside_them_is_refused():
    assert supported_modes("training") == {"secure", "dp", "robust"}
    assert "dp" not in supported_modes("training.exact")
    with pytest.raises(ValueError, match="robust is not available for selection"):
        check_modes("selection", ["robust"])
    fed, feats = _fed()
    set_options(fed, dp={"epsilon": 2.0, "bounds": [-6, 6]})
    with pytest.raises(ValueError, match="dp is not available for the exact-aggregation model 'gnb'"):
        run_training(fed, feats, model="gnb", rounds=1)
    assert not fed.traffic.records  # refused before any exchange


def test_a_step_without_a_dp_release_is_refused_by_the_noisy_wrapper():
    fed, feats = _fed()
    set_options(fed, dp={"epsilon": 2.0, "bounds": [-6, 6]})
    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.protocol import SumSpec

    step = SumStep(Message("evaluate", meta={"part": "test"}), SumSpec({"confusion": 0}), None, lambda s: s)
    with pytest.raises(ValueError, match="has no DP release"):
        run_strategy(fed, PrivacyLedger.for_plan(fed.options.dp, {"x": 1}, {})).run(fed, step)


def test_the_score_test_states_its_modes_and_refuses_dp_or_robust_before_sending():
    from fedtab.federation.workflows.score_test.server import run_pooled_score_test

    assert supported_modes("score_test") == {"secure"}
    for options in ({"dp": {"epsilon": 2.0, "bounds": [-6, 6]}}, {"robust": True}):
        fed, _ = _fed()
        set_options(fed, **options)
        with pytest.raises(ValueError, match="(dp|robust) is not available for the score test"):
            run_pooled_score_test(fed)
        assert not fed.traffic.records  # refused before the schema or any step went out


def test_the_score_test_on_secure_sums_checks_each_sites_clear_row_count_and_matches_plain():
    from fedtab.engines.local import LocalFederation
    from fedtab.federation import SiteError
    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.workflows.score_test.server import run_pooled_score_test
    from tests.builders import make_sites

    class Lying(LocalFederation):  # site s1 claims one row more than it declared, beside its masked sums
        def ask(self, requests):
            out = super().ask(requests)
            if "s1" in out and out["s1"].kind == "score_sums":
                r = out["s1"]
                out["s1"] = Message(r.kind, r.arrays, {**r.meta, "n": int(r.meta["n"]) + 1})
            return out

    table, parts = classification_parts(450, 6, 3, 2, seed=1, class_sep=1.5)
    plain = run_pooled_score_test(federation(parts), max_steps=2)
    fed = federation(parts)
    set_options(fed, secure_aggregation=True)
    secure = run_pooled_score_test(fed, max_steps=2)
    assert secure.selected == plain.selected and secure.n_rows == plain.n_rows == sum(fed.schema.rows(s, "train") for s in fed.sites)
    np.testing.assert_allclose(secure.z[secure.mask], plain.z[plain.mask], rtol=1e-5)  # fixed-point rounding
    lying = Lying(make_sites(parts))
    set_options(lying, secure_aggregation=True)
    with pytest.raises(SiteError, match="s1"):
        run_pooled_score_test(lying, max_steps=2)


def test_the_election_states_its_modes_and_refuses_a_combination_before_sending():
    from fedtab.federation.workflows.election.server import run_election

    assert supported_modes("election") == {"secure", "dp", "robust"}
    assert supported_modes("election.compat") == {"secure", "dp"}  # a peer's rule has no robust variant
    assert supported_modes("election.stouffer") == {"secure", "robust"}  # a noisy ballot has no p-values
    for options, kwargs, match in [({"robust": True}, {"compat": "nvflare"}, "robust is not available for compat"),
                                   ({"dp": {"epsilon": 2.0, "bounds": [-6, 6]}}, {"consensus": "stouffer"},
                                    "dp is not available for consensus='stouffer'")]:
        fed, _ = _fed()
        set_options(fed, **options)
        with pytest.raises(ValueError, match=match):
            run_election(fed, **kwargs)
        assert not fed.traffic.records  # no ballot was asked for


def test_the_ballot_release_is_spent_before_the_ballot_request_goes_out():
    from fedtab.federation.workflows.election.server import run_election

    fed, _ = _fed()
    dp = {"epsilon": 2.0, "bounds": [-6, 6]}
    set_options(fed, dp=dp)
    ledger = PrivacyLedger.for_plan(fed.options.dp, {"election.ballot": 1, "election.describe": 3}, {})
    ledger.spend("election.ballot")  # an earlier election spent the one planned ballot
    fed.privacy_ledger = ledger
    with pytest.raises(RuntimeError, match="exceeds the 1 planned"):
        run_election(fed, describe="train")
    assert not fed.traffic.records and ledger.spent == {"election.ballot": 1}


def test_ballots_travel_in_the_clear_under_secure_sums_and_elect_as_in_a_plain_run():
    from fedtab.federation.workflows.election.server import run_election

    fed, _ = _fed()
    plain = run_election(fed, describe="train")
    fed2, _ = _fed()
    set_options(fed2, secure_aggregation=True)
    secure = run_election(fed2, describe="train")
    assert secure.result.mask.tolist() == plain.result.mask.tolist()
    for a, b in zip(secure.ballots, plain.ballots):
        np.testing.assert_array_equal(a.scores, b.scores)  # each site's ballot as sent, not a sum
    kinds = [r.kind for r in fed2.traffic.records]
    assert kinds.index("secagg_keys") > max(i for i, k in enumerate(kinds) if k == "ballot")  # keys for the description
    np.testing.assert_allclose(secure.described.count, plain.described.count)


def test_gbdt_states_its_modes_and_refuses_dp_early_stopping_of_a_regression_before_sending():
    from fedtab.federation.workflows.gbdt.server import run_gbdt

    assert supported_modes("gbdt") == {"secure", "dp", "robust"}
    assert supported_modes("gbdt.regression_early_stopping") == {"secure", "robust"}
    assert supported_modes("gbdt.importance") == {"robust"}  # per-site gains: left out under secure sums or DP
    fed, _ = _fed()
    set_options(fed, dp={"epsilon": 2.0, "bounds": [-6, 6]})
    with pytest.raises(ValueError, match="dp is not available for early stopping of a regression"):
        run_gbdt(fed, None, params={"objective": "regression", "early_stopping_rounds": 2, "n_trees": 3})
    assert not fed.traffic.records  # refused before the schema or any step went out
    with pytest.raises(TypeError, match="unexpected keyword"):
        run_gbdt(fed, None, n_rounds=3)
