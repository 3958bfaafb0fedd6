"""Run options (fedtab.federation.protocol.options): fixed once per run, checked once, careless values one line."""

from dataclasses import FrozenInstanceError

import pytest

from fedtab.federation.protocol.options import RunOptions, set_options, set_step_dp
from fedtab.federation.protocol.summing import PlainSums, SecureSums
from fedtab.privacy.accountant import PrivacyLedger
from tests.builders import classification_parts, federation


@pytest.fixture()
def fed():
    _, parts = classification_parts(240, 4, 2, 0, seed=1)
    return federation(parts)


def test_the_default_run_is_plain_and_says_so():
    opts = RunOptions.of()
    assert (opts.secure, opts.dp, opts.robust) == (False, None, False)
    assert opts.to_dict() == {"privacy": {"secure_aggregation": False, "dp": None},
                              "trust": {"robust": False, "max_site_share": opts.max_site_share, "min_holders": None}}


@pytest.mark.parametrize("settings,match", [
    ({"robust": True, "secure_aggregation": True}, "robust=True cannot be combined with secure_aggregation"),
    ({"min_holders": 0}, "min_holders must be a positive integer"),
    ({"min_holders": True}, "min_holders must be a positive integer"),
    ({"min_holders": 1.5}, "min_holders must be a positive integer"),
    ({"max_site_share": 0.0}, "max_site_share"),
    ({"max_site_share": 1.5}, "max_site_share"),
    ({"dp": {"epsilon": -1.0}}, "epsilon"),
    ({"dp": {"epsilon": "a lot"}}, "epsilon"),
])
def test_a_careless_setting_is_one_line(settings, match):
    with pytest.raises(ValueError, match=match) as info:
        RunOptions.of(**settings)
    assert "\n" not in str(info.value)


def test_options_cannot_change_behind_the_runs_back():
    opts = RunOptions.of(secure_aggregation=True)
    with pytest.raises(FrozenInstanceError):
        opts.privacy = None  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        opts.trust.robust = True  # type: ignore[misc]


def test_set_options_fixes_the_strategy_and_a_fresh_accountant(fed):
    assert isinstance(fed.summing, PlainSums)
    fed.privacy_ledger = PrivacyLedger(1.0, 1e-5, 1.0)  # an accountant of an earlier run
    opts = set_options(fed, secure_aggregation=True)
    assert fed.options is opts and opts.secure
    assert isinstance(fed.summing, SecureSums)
    assert fed.privacy_ledger is None
    with pytest.raises(ValueError, match="either options or settings"):
        set_options(fed, opts, robust=True)


def test_a_steps_own_dp_budget_keeps_the_strategy_and_the_other_options(fed):
    set_options(fed, secure_aggregation=True, min_holders=2)
    strategy = fed.summing
    opts = set_step_dp(fed, {"epsilon": 2.0, "delta": 1e-5})
    assert opts.dp is not None and opts.dp["epsilon"] == 2.0
    assert opts.secure and opts.trust.min_holders == 2
    assert fed.summing is strategy  # the secure-aggregation session is not restarted
    assert set_step_dp(fed, None).dp is None
