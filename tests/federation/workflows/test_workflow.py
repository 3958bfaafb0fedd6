import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score

from fedtab import LocalFederation, Site, run_election, run_training
from fedtab.data import classification_table, split_rows
from fedtab.federation import FederationError, Message, gather_ballots
from tests.builders import classification_parts, federation


def make_fed(n=900, seed=0):
    table, parts = classification_parts(n, 30, 5, 3, seed=seed, class_sep=1.5)
    return federation(parts, selector=["lasso", "anova", "mutual_info"]), table


def test_election_workflow_tells_sites_the_mask():
    fed, _ = make_fed()
    out = run_election(fed, 0.5)
    assert out.result.stats["kept"] == len(out.result.selected_names) > 0
    for name in fed.sites:
        assert fed.site(name).state["features"] == out.result.selected_names
    assert [b.n_samples for b in out.ballots] == [len(fed.site(s).rows("train")) for s in fed.sites]
    down, up = fed.traffic.total("ballot")
    assert down > 0 and up > 0


def test_fedavg_training_matches_centralised_quality():
    fed, table = make_fed()
    feats = [c for c in table.columns if c != "target"]
    out = run_training(fed, feats, rounds=20, local_epochs=5)
    Xtr = pd.concat([fed.site(s).rows("train") for s in fed.sites])
    Xte = pd.concat([fed.site(s).rows("test") for s in fed.sites])
    central = LogisticRegression(max_iter=1000).fit(Xtr[feats], Xtr["target"])
    f1_central = f1_score(Xte["target"], central.predict(Xte[feats]), average="weighted")
    assert out.pooled["weighted_f1"] > f1_central - 0.03
    assert out.n_params == len(feats) + 1
    assert set(out.per_site) == set(fed.sites)
    assert out.bytes_down > 0 and out.bytes_up > 0


def test_training_on_elected_columns_uses_fewer_parameters():
    fed, table = make_fed()
    res = run_election(fed, 0.0).result
    out = run_training(fed, rounds=3)
    assert out.features == res.selected_names
    assert out.n_params == len(res.selected_names) + 1 < table.shape[1]


def test_string_labels_and_multiclass():
    table = classification_table(600, 10, 4, 0, 0, n_classes=3, seed=2, class_sep=2.0)
    table["target"] = table["target"].map({0: "low", 1: "mid", 2: "high"})
    parts = split_rows(table, [0.5, 0.5], stratify="target")
    fed = LocalFederation([Site("a", parts[0], "target"), Site("b", parts[1], "target")])
    out = run_training(fed, [c for c in table.columns if c != "target"], rounds=10)
    assert out.classes == ["high", "low", "mid"]
    assert out.pooled["accuracy"] > 0.6


def test_site_errors_are_reported_with_the_site_name():
    fed, table = make_fed()
    bad = table.head(50).copy()
    bad["f00"] = "text"
    fed2 = LocalFederation([fed.site("s0"), Site("broken", bad, "target")])
    with pytest.raises(FederationError, match="site 'broken'.*non-numeric"):
        gather_ballots(fed2)
    ballots = gather_ballots(fed2, on_error="skip")
    assert [b.site for b in ballots] == ["s0"]


def test_unknown_request_kind_is_an_error_reply():
    fed, _ = make_fed()
    reply = fed.ask({"s0": Message("no-such-step")})["s0"]
    assert reply.is_error and "no handler" in reply.meta["error"]


def test_site_validates_its_table():
    with pytest.raises(ValueError, match="site 'x': target column 'y'"):
        Site("x", pd.DataFrame({"a": [1, 2]}), "y")
    with pytest.raises(ValueError, match="no rows"):
        Site("x", pd.DataFrame({"a": []}))


def test_stratified_split_keeps_every_class_in_train():
    fed, _ = make_fed()
    for s in fed.sites:
        site = fed.site(s)
        tr, te = site.rows("train"), site.rows("test")
        assert set(tr["target"]) == {0, 1} and len(te) > 0
        assert not set(tr.index) & set(te.index)


def _exchanges(fed, site="s0"):
    return [r.kind for r in fed.traffic.records if r.site == site]


def test_mask_broadcast_can_answer_describe_with_the_same_result_and_one_exchange_less():
    plain, _ = make_fed()
    run_election(plain, 0.5)
    ref = run_training(plain, rounds=3)
    folded, _ = make_fed()
    el = run_election(folded, 0.5, describe="train")
    assert set(el.described.sites) == set(folded.sites)
    assert el.described.per_site == {}  # a running sum on set_mask: no site's moments held (issue 31)
    out = run_training(folded, el.result.selected_names, rounds=3, described=el.described)
    assert out.features == ref.features and out.classes == ref.classes
    for k in ref.params:
        np.testing.assert_array_equal(out.params[k], ref.params[k])
    np.testing.assert_array_equal(out.mean, ref.mean)
    np.testing.assert_array_equal(out.std, ref.std)
    assert out.pooled == ref.pooled
    # the setup travels with the first Newton iteration: no "setup" exchange at all
    assert 1 <= out.rounds <= 3 and out.rounds == ref.rounds
    assert _exchanges(plain) == ["ballot", "set_mask", "describe"] + ["newton"] * out.rounds + ["evaluate"]
    assert _exchanges(folded) == ["ballot", "set_mask"] + ["newton"] * out.rounds + ["evaluate"]


def test_described_replies_for_other_features_are_refused():
    fed, table = make_fed()
    el = run_election(fed, 0.5, describe="train")
    others = [c for c in table.columns if c != "target"]
    with pytest.raises(FederationError, match="described other features"):
        run_training(fed, others, rounds=1, described=el.described)


def test_a_stand_alone_setup_request_is_still_answered():
    from fedtab.learn import make_model

    fed, _ = make_fed()
    feats = ["f00", "f01"]
    spec = {"name": "logistic", "params": make_model("logistic").get_params()}
    reply = fed.ask({"s0": Message("setup", {"mean": np.zeros(2), "std": np.ones(2)},
                                   {"features": feats, "classes": ["0", "1"], "model": spec})})
    assert not reply["s0"].is_error, reply["s0"].meta
    params = {f"param:{k}": v for k, v in make_model("logistic").init(2, 2, 0).items()}
    fit = fed.ask({"s0": Message("fit", params, {"epochs": 1})})["s0"]
    assert fit.kind == "fit", fit.meta
    assert fed.site("s0").state["train_setup"]["features"] == feats


def test_a_job_of_election_and_training_takes_rounds_plus_three_exchanges(jobs):
    """Steps a job does not need cost no exchange: without the column profile and the baselines, an
    election and training is ballot, set_mask (which also describes and carries the first Newton
    iteration), the other Newton iterations (logistic, at most `rounds` in all), evaluate."""
    from fedtab.job.spec import spec_from_plan
    from fedtab.job.workflow import run_workflow

    fed, _ = make_fed()
    out = run_workflow(fed, spec_from_plan(jobs.plan(election={}, training={"rounds": 4, "local_epochs": 2}))).result
    r = out["training"]["rounds"]
    assert 2 <= r <= 4 and _exchanges(fed) == ["ballot", "set_mask"] + ["newton"] * (r - 1) + ["evaluate"]
    assert out["training"]["features"] == out["election"]["selected"]
    assert [s["step"] for s in out["steps"]] == ["election", "training"]
