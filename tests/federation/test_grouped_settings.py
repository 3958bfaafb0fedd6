"""Settings grouped in small dataclasses (issue 29, item 5): ``select_model``'s
:class:`SelectionOptions`, ``run_election``'s :class:`RuleSettings` / :class:`Quorum`,
``pooled_agreement``'s :class:`RuleSettings`. The flat keywords the docs show still work, give
the same result as the dataclass, and a wrong or doubled keyword is refused before anything is sent."""

import dataclasses

import numpy as np
import pytest

from fedtab import run_election
from fedtab.election.agreement import pooled_agreement
from fedtab.election.ballot import Ballot
from fedtab.election.rule import RuleSettings
from fedtab.federation.workflows.election.server import Quorum, election_settings
from fedtab.federation.workflows.selection import SelectionOptions, select_model
from fedtab.federation.workflows.selection.server import selection_options
from tests.builders import classification_parts, federation


def _fed(seed=0):
    _, parts = classification_parts(600, 12, 4, 3, seed=seed, class_sep=1.5)
    return federation(parts, selector=["lasso", "anova", "mutual_info"])


def test_selection_keywords_build_the_options_their_names_say():
    opts = selection_options(None, {"rounds": 3, "grid": (0.5,), "aggregation": "uniform", "min_holders": 2})
    assert opts == dataclasses.replace(SelectionOptions(), rounds=3, grid=(0.5,), aggregation="uniform", min_holders=2)
    assert opts.election == {"aggregation": "uniform", "normalization": "all", "min_holders": 2}
    given = SelectionOptions(seed=7)
    assert selection_options(given, {}) is given


@pytest.mark.parametrize(("options", "settings", "message"), [
    (None, {"round": 3}, "select_model\\(\\) got an unexpected keyword argument 'round'"),
    (SelectionOptions(), {"rounds": 3}, "options= and the keyword\\(s\\) rounds"),
])
def test_select_model_refuses_a_wrong_or_doubled_setting_before_it_sends_anything(options, settings, message):
    fed = _fed()
    with pytest.raises(TypeError, match=message):
        select_model(fed, options, **settings)
    assert fed.exchange_count == 0


def test_election_keywords_and_dataclasses_elect_the_same():
    by_keywords = run_election(_fed(), 0.5, aggregation="uniform", min_holders=1, min_sites=3).result
    by_dataclass = run_election(_fed(), 0.5, rule=RuleSettings(aggregation="uniform", min_holders=1),
                                quorum=Quorum(min_sites=3)).result
    default = run_election(_fed(), 0.5).result
    assert by_keywords.aggregation == by_dataclass.aggregation == "uniform" != default.aggregation
    assert by_keywords.min_holders == by_dataclass.min_holders == 1
    np.testing.assert_array_equal(by_keywords.mask, by_dataclass.mask)
    np.testing.assert_allclose(by_keywords.votes, by_dataclass.votes, rtol=0, atol=1e-12)
    assert not np.allclose(by_keywords.votes, default.votes)  # the setting reached the rule


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"aggregaton": "uniform"}, "run_election\\(\\) got an unexpected keyword argument 'aggregaton'"),
    ({"rule": RuleSettings(), "compat": "flower"}, "rule= and its field\\(s\\) compat"),
    ({"quorum": Quorum(), "min_sites": 2}, "quorum= and its field\\(s\\) min_sites"),
])
def test_run_election_refuses_a_wrong_or_doubled_setting_before_it_sends_anything(kwargs, message):
    fed = _fed()
    with pytest.raises(TypeError, match=message):
        run_election(fed, 0.5, **kwargs)
    assert fed.exchange_count == 0


def test_election_settings_keep_the_defaults_and_split_the_keywords():
    rule, quorum = election_settings(None, None, {"consensus": "stouffer", "on_error": "skip"})
    assert rule == RuleSettings(consensus="stouffer") and quorum == Quorum(on_error="skip")
    assert election_settings(None, None, {}) == (RuleSettings(), Quorum())


def test_pooled_agreement_takes_the_rule_as_one_value():
    rng = np.random.default_rng(0)
    ballots = [Ballot.build(rng.random(8) > 0.5, rng.random(8), 100 + 10 * i, [f"f{j}" for j in range(8)],
                            site=f"s{i}") for i in range(3)]
    pooled = np.arange(8) < 4
    plain = pooled_agreement(ballots, pooled, freedom_degrees=[0.0, 0.5, 1.0])
    assert plain == pooled_agreement(ballots, pooled, freedom_degrees=[0.0, 0.5, 1.0], rule=RuleSettings(min_holders=1))
    strict = pooled_agreement(ballots, pooled, freedom_degrees=[0.0], rule=RuleSettings(min_holders=3))
    assert strict[0]["kept"] <= plain[0]["kept"]
    with pytest.raises(ValueError, match="unknown aggregation"):
        pooled_agreement(ballots, pooled, rule=RuleSettings(aggregation="median"))
