"""The site's disclosure policy: leak scenarios are refused, small cells suppressed, work capped."""

import numpy as np
import pandas as pd
import pytest

from fedtab.data import classification_table
from fedtab.engines.local import LocalFederation
from fedtab.engines.site_config import build_site
from fedtab.federation import FederationError, Message, Site, SiteRefused, gather_ballots, run_training
from fedtab.federation.steps.encoding import federated_one_hot
from fedtab.privacy import OTHER_CATEGORY, DisclosurePolicy


@pytest.fixture(scope="module")
def table():
    return classification_table(300, 6, 3, 1, seed=1)


def _big_and_tiny(table, n_tiny, **kw):
    return LocalFederation([Site("big", table.iloc[:200], "target", **kw),
                            Site("tiny", table.iloc[200:200 + n_tiny], "target", test_size=0)])


@pytest.mark.parametrize("n_tiny", [1, 2, 3])
def test_tiny_sites_refuse_ballots_descriptions_and_updates(table, n_tiny):
    fed = _big_and_tiny(table, n_tiny)
    with pytest.raises(SiteRefused, match=r"site 'tiny' refused: ballot on part 'train': it has \d row") as err:
        gather_ballots(fed)
    assert set(err.value.refusals) == {"tiny"}
    with pytest.raises(SiteRefused, match="site 'tiny' refused: describe on part 'train'"):
        run_training(fed, ["f0", "f1"], rounds=1)
    # nothing was computed: the refusal carries no arrays
    reply = fed.site("tiny").handle(Message("describe", meta={"part": "train"}))
    assert reply.is_refusal and reply.arrays == {} and set(reply.meta) == {"reason"}
    reply = fed.site("tiny").handle(Message("fit", meta={"epochs": 1}))
    assert reply.is_refusal


@pytest.mark.parametrize("n_tiny", [1, 2, 3])
def test_tiny_sites_refuse_imputation_statistics(table, n_tiny):
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    data = table.drop(columns=["target"])
    fed = LocalFederation([Site("big", data.iloc[:200], test_size=0.1), Site("tiny", data.iloc[200:200 + n_tiny],
                                                                              test_size=0)])
    with pytest.raises(SiteRefused, match="site 'tiny' refused: impute_schema on part 'train': it has"):
        run_imputation(fed, ImputeConfig(rounds=1, hidden_dim=4, n_layers=1))
    for kind in ("impute_schema", "impute_stats", "impute_fit"):
        assert fed.site("tiny").handle(Message(kind)).is_refusal


def test_skipping_a_refusing_site_trains_on_the_others(table):
    fed = _big_and_tiny(table, 2)
    out = run_training(fed, ["f0", "f1"], rounds=1, on_error="skip")
    assert out.pooled["n"] > 0


def test_an_explicit_permissive_policy_answers_tiny_sites(table):
    site = Site("tiny", table.iloc[:3], "target", test_size=0, policy=DisclosurePolicy(min_rows=1))
    reply = site.handle(Message("describe", meta={"part": "train"}))
    assert reply.kind == "describe" and reply.arrays["count"][0] == 3


def test_describe_only_on_the_sites_own_parts_and_agreed_columns(table):
    site = Site("a", table.iloc[:200], "target")
    for part in ("rows:1-3", 3, "fold:99"):  # not a part of the site (it draws its own)
        assert site.handle(Message("describe", meta={"part": part})).is_refusal
    assert not site.handle(Message("describe", meta={"part": "all"})).is_refusal  # a part of its own
    # before a schema is agreed, a column the site lacks is answered as absent (count 0) ...
    absent = site.handle(Message("describe", meta={"features": ["f0", "secret_column"]}))
    assert absent.arrays["count"].tolist() == [160, 0]
    # ... once agreed (fedtab.federation.protocol.schema), only the agreed columns are answered
    site.state["schema"] = {"columns": site.feature_names, "holders": [1] * len(site.feature_names)}
    assert site.handle(Message("describe", meta={"features": ["f0", "secret_column"]})).is_refusal
    ok = site.handle(Message("describe", meta={"part": "test", "features": ["f0"]}))
    assert ok.kind == "describe" and ok.arrays["count"].tolist() == [40]
    # the same rules hold when the description rides on set_mask
    assert site.handle(Message("set_mask", meta={"features": ["f0"], "describe": "rows:1-3"})).is_refusal


def test_describe_suppresses_columns_observed_in_few_rows(table):
    t = table.iloc[:100].copy()
    t.loc[t.index[5:], "f1"] = np.nan  # f01 observed in 5 training rows at most
    site = Site("a", t, "target", test_size=0)
    reply = site.handle(Message("describe", meta={"features": ["f0", "f1"]}))
    assert reply.arrays["count"].tolist() == [100, 0]
    assert reply.arrays["sum"][1] == 0 and reply.arrays["sumsq"][1] == 0


def test_evaluate_probes_are_refused(table):
    """A binary search over crafted models needs many evaluations of few rows."""
    fed = LocalFederation([Site("a", table.iloc[:200], "target", policy=DisclosurePolicy(max_evaluations=3))])
    run_training(fed, ["f0"], rounds=1)  # one evaluation
    site = fed.site("a")
    probe = Message("evaluate", {"param:coef": np.zeros((1, 1)), "param:intercept": np.zeros(1)}, {"part": "test"})
    assert site.handle(probe).kind == "evaluate"
    assert site.handle(probe).kind == "evaluate"
    assert site.handle(probe).is_refusal  # the fourth evaluation exceeds the cap
    assert site.handle(Message("evaluate", meta={"part": "all"})).is_refusal


def test_category_sets_refused_for_numeric_columns_and_rare_categories_merged():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"age": rng.integers(20, 80, 60), "color": ["red"] * 30 + ["blue"] * 27 + ["mauve"] * 3,
                          "target": rng.integers(0, 2, 60)})
    other = pd.DataFrame({"age": rng.integers(20, 80, 60), "color": ["red"] * 50 + ["green"] * 10,
                          "target": rng.integers(0, 2, 60)})
    fed = LocalFederation([Site("a", frame, "target"), Site("b", other, "target")])
    with pytest.raises(SiteRefused, match=r"\['age'\] are numeric"):
        federated_one_hot(fed, ["age"])
    reply = fed.site("a").handle(Message("category_sets", meta={"columns": ["color"]}))
    assert reply.meta["categories"] == {"color": ["blue", "red", OTHER_CATEGORY]}  # 'mauve' (3 rows) merged
    cats = federated_one_hot(fed, ["color"])
    assert cats == {"color": [OTHER_CATEGORY, "blue", "green", "red"]}
    a = fed.site("a").table
    # a's (other) bucket holds only the 3 'mauve' rows (< min_rows): an indicator with 3 ones would
    # single them out, so they are encoded as missing (all indicators 0); every other row has one 1
    indicators = a[[f"color={c}" for c in cats["color"]]]
    assert "color=mauve" not in a.columns and a[f"color={OTHER_CATEGORY}"].sum() == 0
    assert (indicators.sum(axis=1) == 0).sum() == 3 and indicators.sum().sum() == 57
    b = fed.site("b").table  # b holds no rare value: its (other) column is all zero, green keeps its own
    assert b["color=green"].sum() == 10 and b[f"color={OTHER_CATEGORY}"].sum() == 0


def test_gnb_statistics_suppress_small_classes():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=60), "target": [0] * 30 + [1] * 27 + [2] * 3})
    site = Site("a", frame, "target", test_size=0)
    setup = {"features": ["x"], "classes": ["0", "1", "2"], "model": {"name": "gnb", "params": {}}, "part": "train"}
    reply = site.handle(Message("fit", {"setup:mean": np.zeros(1), "setup:std": np.ones(1)}, {"setup": setup}))
    assert reply.arrays["param:count"].tolist() == [30, 27, 0]
    assert reply.arrays["param:sum"][2, 0] == 0


def test_co_observed_pairs_below_min_rows_are_suppressed():
    from fedtab.impute.stats import site_stats, suppressed_stats

    x = np.random.default_rng(0).normal(size=(50, 3))
    x[5:, 2] = np.nan  # column 2 observed (and co-observed) in 5 rows
    x[:40, 1] = np.nan  # columns 0/1 co-observed in 10 rows: kept
    s = suppressed_stats(site_stats(x, ["a", "b", "c"]), 10)
    assert s.pair_count[0, 2] == 0 and s.pair_sxy[0, 2] == 0 and s.count[2] == 0 and s.sum[2] == 0
    assert s.pair_count[0, 1] == 10 and s.pair_sxy[0, 1] != 0
    s.validate()


def test_caps_on_server_chosen_work(table):
    site = Site("a", table.iloc[:200], "target", policy={"max_local_epochs": 5, "max_param": 100})
    assert site.handle(Message("fit", meta={"epochs": 50})).is_refusal
    spec = {"name": "random_forest", "params": {"n_estimators": 10 ** 7}}
    reply = site.handle(Message("ballot", meta={"selector": spec}))
    assert reply.is_refusal and "n_estimators" in reply.meta["reason"]
    assert site.handle(Message("impute_setup", meta={"config": {"rounds": 10 ** 6}})).is_refusal
    locked = Site("b", table.iloc[:200], "target", policy={"allow_server_selector": False})
    assert locked.handle(Message("ballot", meta={"selector": "lasso"})).is_refusal
    assert locked.handle(Message("ballot")).kind == "ballot"


def test_policy_from_site_config(tmp_path, table):
    table.to_csv(tmp_path / "a.csv", index=False)
    base = {"name": "a", "data-path": str(tmp_path / "a.csv"), "target": "target"}
    assert build_site(base).policy == DisclosurePolicy()
    site = build_site({**base, "policy": '{"min_rows": 50, "max-rounds": 3}', "min-rows": "20"})
    assert site.policy.min_rows == 20 and site.policy.max_rounds == 3
    with pytest.raises(ValueError, match="unknown setting"):
        build_site({**base, "policy": '{"min_row": 5}'})
    with pytest.raises(ValueError, match="min_rows must be a non-negative integer"):
        DisclosurePolicy(min_rows=-1)


def test_exchange_names_refusing_and_failing_sites_together():
    from fedtab.federation import exchange
    from fedtab.federation.protocol import Federation

    class Canned(Federation):
        sites = ["a", "b", "c"]

        def ask(self, requests):
            replies = {"a": Message.refusal("too few rows"), "b": Message.error("boom"), "c": Message("x")}
            return {s: replies[s] for s in requests}

    fed = Canned()
    fed.schema = object()  # agreed already: the exchange declares nothing
    with pytest.raises(FederationError, match="failed at 2 site") as err:
        exchange(fed, Message("x"))
    assert "site 'a': refused: too few rows" in str(err.value) and "site 'b': boom" in str(err.value)
    assert list(exchange(fed, Message("x"), on_error="skip")) == ["c"]
