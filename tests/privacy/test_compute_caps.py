"""Compute caps on server-chosen selectors and models (issue 20 item 7).

A site estimates what a selector or model spec costs on its own rows before it runs it
(:func:`fedtab.election.selectors.selector_cost`, :func:`fedtab.learn.models.model_cost`)
and refuses one above its policy's ``max_work`` / ``max_size``, naming the parameter at
fault; numbers nested in list- and dict-valued parameters are held to ``max_param`` too.
Every refusal below comes back before the handler runs: without it these tests would hang
or exhaust memory.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows
from fedtab.election.selectors import SELECTORS, selector_cost
from fedtab.engines.local import LocalFederation
from fedtab.federation import Message, Site, SiteRefused, run_training
from fedtab.learn import MODELS
from fedtab.learn.models import model_cost
from fedtab.privacy.policy import MAX_LIST_PARAM, DisclosurePolicy


@pytest.fixture(scope="module")
def table():
    return classification_table(400, 12, 4, 2, seed=0)


def _refusal(site: Site, request: Message) -> str:
    reply = site.handle(request)
    assert reply.is_refusal, reply.meta
    return reply.meta["reason"]


def test_costs_grow_with_what_the_server_chooses():
    for name in SELECTORS:
        base = selector_cost(name, 1000, 50)
        assert base.work > 0 and base.size > 0 and base.driver == "rows × features"
        assert selector_cost(name, 4000, 50).work >= base.work  # more rows: never less work
        assert selector_cost(name, 1000, 400).work > base.work  # more features: more work
    trees = [selector_cost({"name": "random_forest", "params": {"n_estimators": n}}, 1000, 50) for n in (10, 100, 1000)]
    assert trees[0].work < trees[1].work < trees[2].work and trees[2].driver == "n_estimators"
    for name in MODELS:
        c = model_cost(name, 20, 3, 1000, 2)
        assert 0 < c.size and model_cost(name, 20, 3, 1000, 2).work <= model_cost(name, 20, 3, 8000, 2).work
    wide = model_cost({"name": "mlp", "params": {"hidden": [10**9]}}, 20, 2, 1000, 1)  # nothing is allocated
    assert wide.size > 1e10 and wide.driver == "hidden"
    assert model_cost({"name": "sgd", "params": {"batch_size": 1}}, 20, 2, 10**5, 1).driver == "batch_size"
    with pytest.raises(ValueError, match="n_estimators must be a number"):
        selector_cost({"name": "random_forest", "params": {"n_estimators": "many"}}, 10, 2)


def test_defaults_leave_every_shipped_spec_and_benchmark_size_alone():
    policy = DisclosurePolicy()
    for name in SELECTORS:  # the largest shipped benchmark site: 40,000 rows x 1,000 columns
        assert selector_cost(name, 40_000, 1000).refusal(policy.max_work, policy.max_size, "selector", name) is None
    for spec in ("logistic", "sgd", "gnb", {"name": "mlp", "params": {"hidden": [64]}}):
        assert model_cost(spec, 1000, 10, 40_000, 10).refusal(policy.max_work, policy.max_size, "model", spec) is None


def test_a_selector_whose_product_of_parameters_would_hang_the_site_is_refused(table):
    site = Site("a", table, "target")
    spec = {"name": "markov_blanket", "params": {"n_repeats": 10_000, "n_trees": 10_000, "max_shrink_rounds": 5_000}}
    reason = _refusal(site, Message("ballot", meta={"selector": spec}))  # each <= max_param, their product is not
    assert "markov_blanket" in reason and "max_work" in reason and "'n_repeats'" in reason
    spec = {"name": "markov_blanket", "params": {"n_splits": 10_000, "n_trees": 10_000}}  # 10**4 forests held at once
    reason = _refusal(site, Message("ballot", meta={"selector": spec}))
    assert "max_size" in reason and "'n_splits'" in reason
    cheap = Site("b", table, "target", policy={"max_work": 1e6})  # an operator's tight cap: even lasso is too much
    assert "'rows × features'" in _refusal(cheap, Message("ballot", meta={"selector": "lasso"}))
    assert site.handle(Message("ballot", meta={"selector": "anova"})).kind == "ballot"


@pytest.mark.parametrize(("params", "name"), [
    ({"hidden": [10**9]}, "hidden"),  # a list of a huge number: bypassed max_param before
    ({"hidden": [8] * (MAX_LIST_PARAM + 1)}, "hidden"),  # a list too long
    ({"hidden": [8], "extra": {"deep": [1, 2, 1e9]}}, "extra"),  # numbers nested in dicts and lists
    ({"hidden": [8, -10**6]}, "hidden"),
])
def test_list_valued_selector_parameters_are_held_to_max_param(table, params, name):
    site = Site("a", table, "target")
    spec = {"name": "sequential_attention", "params": params}
    reason = _refusal(site, Message("ballot", meta={"selector": spec}))
    assert f"'{name}'" in reason and "max_param" in reason


def test_a_server_chosen_model_beyond_the_caps_is_refused_by_name(table):
    parts = split_rows(table, [0.5, 0.5], stratify="target", seed=0)
    big = {"name": "mlp", "params": {"hidden": [10**9]}}
    fed = LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(parts)])
    with pytest.raises(ValueError, match="model 'mlp' would hold ~1.5e\\+10 parameters, more than a site accepts"):
        run_training(fed, model=big, rounds=1)  # a careless user's: stopped before the server allocates it
    feats = [c for c in table.columns if c != "target"]
    first_round = Message("fit", {"setup:mean": np.zeros(len(feats)), "setup:std": np.ones(len(feats))},
                          {"epochs": 1, "setup": {"features": feats, "classes": ["0", "1"], "model": big}})
    assert "model parameters ['hidden'] exceed the site's cap max_param" in _refusal(Site("a", table, "target"),
                                                                                     first_round)
    small = DisclosurePolicy(max_size=1e4)  # an operator's own memory cap
    fed = LocalFederation([Site(f"s{i}", p, "target", policy=small) for i, p in enumerate(parts)])
    with pytest.raises(SiteRefused, match="model 'mlp' would hold .* \\(parameter 'hidden'\\), more than the site's "
                                          "cap max_size=10000"):
        run_training(fed, model={"name": "mlp", "params": {"hidden": [1000]}}, rounds=1)
    out = run_training(fed, model={"name": "mlp", "params": {"hidden": [8]}}, rounds=1)
    assert out.model == "mlp"


def test_the_stand_alone_setup_and_the_local_baseline_check_the_model(table):
    site = Site("a", table, "target")
    big = {"name": "mlp", "params": {"hidden": [10**9]}}
    feats = [c for c in table.columns if c != "target"]
    setup = Message("setup", {"mean": np.zeros(len(feats)), "std": np.ones(len(feats))},
                    {"features": feats, "classes": ["0", "1"], "model": big, "part": "train"})
    assert "max_param" in _refusal(site, setup)
    baseline = Message("local_baseline", meta={"features": feats, "classes": ["0", "1"], "model": big, "epochs": 1})
    assert "max_param" in _refusal(site, baseline)


def test_caps_are_policy_settings():
    p = DisclosurePolicy.from_dict({"max-work": 1e9, "max_size": 1e6})
    assert p.max_work == 1e9 and p.max_size == 1e6
    with pytest.raises(ValueError, match="max_work must be positive"):
        DisclosurePolicy(max_work=0)
