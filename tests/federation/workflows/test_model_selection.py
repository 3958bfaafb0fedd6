"""Honest model selection (issue 22): the one-SE rule, folds drawn at the sites, ballots on
measured cells, personalisation, the refit, leave-one-site-out contributions, exchange counts
and hostile fold metrics."""

import numpy as np
import pytest

from fedtab.election.one_se import Scored, one_standard_error
from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol import SiteError
from fedtab.federation.workflows.selection import personalised_predict, select_model, site_contributions
from fedtab.federation.site.core import Site
from fedtab.federation.site.matrices import class_indices, site_matrix
from fedtab.federation.workflows.training import run_training
from fedtab.learn.personalise import log_loss_sum
from tests.builders import base_rate_parts, classification_parts, federation

FAST = dict(rounds=3, local_epochs=3, personal_epochs=20)
#: the selection trains its chains by FedAvg: the reference runs pin that solver (the default is Newton)
FEDAVG = {"name": "logistic", "params": {"solver": "fedavg"}}


def _fed(seed=0, n=600, **site_options):
    _, parts = classification_parts(n, 8, 3, 1, seed=seed, class_sep=1.2)
    return federation(parts, seed=range(3), **site_options)


# ----------------------------------------------------------------------------- the rule
def test_one_se_flat_curve_picks_the_smaller_mask():
    rng = np.random.default_rng(0)
    base = 0.5 + rng.normal(0, 0.03, 5)  # folds differ in difficulty
    wobble = np.array([0.006, -0.004, 0.005, -0.006, 0.004])  # mean +0.001, spread 0.005: flat within noise
    small = Scored("small", 2, float((base + wobble).mean()), tuple(base + wobble))
    big = Scored("big", 10, float(base.mean()), tuple(base))
    for paired in (True, False):
        assert one_standard_error([big, small], paired=paired).chosen.name == "small"


def test_one_se_noisy_dip_does_not_buy_columns_but_a_real_gain_does():
    rng = np.random.default_rng(1)
    base = 0.5 + rng.normal(0, 0.03, 5)
    small = Scored("small", 2, float(base.mean()), tuple(base))
    noise = np.array([-0.04, 0.03, -0.03, 0.02, -0.005])  # mean −0.005, spread 0.03: a noisy dip
    dip = Scored("dip", 10, float((base + noise).mean()), tuple(base + noise))
    assert dip.score < small.score
    assert one_standard_error([small, dip]).chosen.name == "small"
    gain = base - 0.05 + rng.normal(0, 0.003, 5)  # better in every fold
    real = Scored("real", 10, float(gain.mean()), tuple(gain))
    assert one_standard_error([small, real]).chosen.name == "real"
    with pytest.raises(ValueError, match="at least 2 fold"):
        one_standard_error([Scored("one", 1, 0.5, (0.5,)), Scored("two", 2, 0.4, (0.4,))])


# ----------------------------------------------------------------------------- the workflow
@pytest.fixture(scope="module")
def outcome():
    fed = _fed()
    return fed, select_model(fed, selector="lasso", grid=(0.0, 0.5, 1.0), **FAST)


def test_candidates_and_result(outcome):
    fed, out = outcome
    names = [c["name"] for c in out.candidates]
    assert "all columns" in names and out.all_columns["name"] == "all columns"
    assert sum(c["chosen"] for c in out.candidates) == 1 and out.chosen["chosen"]
    for key in ("logloss", "logloss_se", "auroc", "fold_logloss"):
        assert key in out.chosen and key in out.all_columns
    assert out.best_fd is not None and out.best_fd["freedom_degree"] is not None
    assert out.features == out.chosen["features"] == out.model["features"]
    assert out.rule["columns"]["chosen"] == out.chosen["name"]
    assert out.personalisation in out.modes and out.rule["personalisation"]["chosen"] == out.personalisation
    assert out.test["rows"] == "test" and out.test["trained_on"] == "train"
    import json

    json.dumps(out.to_dict())
    sections = json.loads(json.dumps(out.result_sections()))
    assert sections["metrics_from"] == {"rows": "test", "trained_on": "train"}
    assert set(sections["contributions"]) == set(fed.sites) and sections["local_only"]["per_site"]


def test_folds_are_the_sites_own(outcome):
    fed, out = outcome
    # every training row is held out exactly once: the folds are each site's fold:k parts
    assert out.chosen["rows"] == sum(fed.site(s).n_rows("train") for s in fed.sites)
    assert out.n_folds == max(fed.site(s).parts.n_folds for s in fed.sites) == 5
    # another site seed draws other folds (the server's seed is the same): other CV scores
    _, parts = classification_parts(600, 8, 3, 1, seed=0, class_sep=1.2)
    other = select_model(federation(parts, seed=[0, 1, 7]), selector="lasso", grid=(0.0, 0.5, 1.0), **FAST)
    assert other.all_columns["fold_logloss"] != out.all_columns["fold_logloss"]


def test_exchange_counts(outcome):
    fed, out = outcome
    assert out.exchanges["total"] == FAST["rounds"] + 3
    assert out.exchanges["steps"] == {"select.prepare": 1, "select.fit": FAST["rounds"], "select.cv_evaluate": 1,
                                      "select.test_evaluate": 1}
    before = fed.exchange_count
    fed.broadcast(__import__("fedtab").federation.Message("describe", meta={"part": "train"}))
    assert fed.exchange_count == before + 1  # a broadcast outside exchange() is counted too


def test_refit_is_fedavg_on_all_training_rows(outcome):
    fed, out = outcome
    # the selection's chains train by FedAvg (not the logistic default, Newton), and its spec says so
    assert out.model["model"]["params"]["solver"] == "fedavg"
    ref = run_training(fed, out.features, model=FEDAVG, rounds=FAST["rounds"], local_epochs=FAST["local_epochs"],
                       train_part="train")
    np.testing.assert_allclose(out.model["mean"], ref.mean, rtol=1e-10)
    np.testing.assert_allclose(out.model["std"], ref.std, rtol=1e-10)
    np.testing.assert_allclose(out.model["params"]["coef"], ref.params["coef"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(out.model["params"]["intercept"], ref.params["intercept"], rtol=1e-6, atol=1e-9)
    assert out.test["modes"]["none"]["pooled"]["n"] == sum(fed.site(s).n_rows("test") for s in fed.sites)


# ----------------------------------------------------------------------------- personalisation
def _shifted_sites(seed=0):
    """Three sites with the same coefficients and very different base rates."""
    return LocalFederation([Site(f"s{i}", frame, "target", seed=i) for i, frame in enumerate(base_rate_parts(seed))])


def test_personalisation_is_chosen_when_it_helps_and_predicts_per_site():
    fed = _shifted_sites()
    out = select_model(fed, selector="lasso", grid=(1.0,), modes=("intercept",), contributions=False, **FAST)
    assert out.personalisation == "intercept"
    assert out.modes["intercept"]["logloss"] < out.modes["none"]["logloss"]
    sites = out.model["personalisation"]["sites"]
    assert set(sites) == set(fed.sites)
    shifts = [sites[s]["shift"][0] for s in ("s0", "s1", "s2")]
    assert shifts[0] > shifts[1] > shifts[2]
    # the protocol's test log-loss of the shipped model = personalised_predict on each site's test rows
    total, n = 0.0, 0
    for name in fed.sites:
        site = fed.site(name)
        X, y = site_matrix(site, out.model["features"], "test")
        proba = personalised_predict(out.model, X, name)
        total += log_loss_sum(class_indices(y, out.model["classes"]), proba)
        n += len(y)
        global_proba = personalised_predict(out.model, X)
        assert not np.allclose(proba, global_proba)
    assert total / n == pytest.approx(out.test["modes"]["intercept"]["pooled"]["logloss"], rel=1e-9)
    with pytest.raises(ValueError, match="no personalisation for site"):
        personalised_predict(out.model, X, "elsewhere")


# ----------------------------------------------------------------------------- contributions
def _fold_logloss(sites, feats, mean, std, params, fold):
    total, n = 0.0, 0
    for site in sites:
        X, y = site_matrix(site, feats, f"fold:{fold}")
        Z = (X - mean) / std
        Z[np.isnan(Z)] = 0.0
        z = Z @ params["coef"].T + params["intercept"]
        p1 = 1 / (1 + np.exp(-z[:, 0]))
        total += log_loss_sum(class_indices(y, ["0", "1"]), np.column_stack([1 - p1, p1]))
        n += len(y)
    return total, n


def test_contributions_equal_explicit_leave_one_site_out_runs():
    fed = _fed(seed=3, n=450, policy={"min_rows": 5})  # every site draws all 5 folds
    assert {fed.site(s).parts.n_folds for s in fed.sites} == {5}
    out = select_model(fed, selector="lasso", grid=(), modes=("none",), **FAST)  # all columns only
    contrib = site_contributions(out)
    assert set(contrib) == set(fed.sites)
    feats = out.election["columns"]
    sites = [fed.site(s) for s in fed.sites]
    for left in fed.sites:
        others = LocalFederation([s for s in sites if s.name != left])
        total = n = 0.0
        for k in range(out.n_folds):
            tr = run_training(others, feats, model=FEDAVG, rounds=FAST["rounds"], local_epochs=FAST["local_epochs"],
                              train_part=f"fit:{k}", eval_part=f"fold:{k}", score_bins=None)
            t, m = _fold_logloss(sites, feats, tr.mean, tr.std, tr.params, k)  # scored on every site's fold rows
            total, n = total + t, n + m
        assert contrib[left]["logloss_without"] == pytest.approx(total / n, rel=1e-6)
        assert contrib[left]["logloss_delta"] == pytest.approx(total / n - out.chosen["logloss"], rel=1e-5, abs=1e-9)
        assert contrib[left]["ballot_decided"] == []  # all columns: no election decided anything
        assert contrib[left]["auroc_without"] is not None


def test_columns_only_here_and_ballot_decided():
    _, parts = classification_parts(600, 6, 3, 1, seed=5, class_sep=1.5)
    parts[0] = parts[0].copy()
    parts[0]["only0"] = parts[0]["target"] + np.random.default_rng(0).normal(0, 0.5, len(parts[0]))
    fed = federation(parts, seed=range(3))
    out = select_model(fed, selector="lasso", grid=(0.5,), modes=("none",), **FAST)
    contrib = site_contributions(out)
    assert contrib["s0"]["columns_only_here"] == ["only0"]
    assert contrib["s1"]["columns_only_here"] == contrib["s2"]["columns_only_here"] == []
    for s in fed.sites:
        assert isinstance(contrib[s]["ballot_decided"], list)
    assert out.measured["s1"]["missing_share"]["only0"] == 1.0


# ----------------------------------------------------------------------------- hostile sites
class _Hostile(Site):
    attack = "nan"

    def handle(self, request):
        reply = super().handle(request)
        if request.kind != "select_evaluate" or reply.is_error:
            return reply
        arrays = {k: np.array(v, dtype=np.float64) for k, v in reply.arrays.items()}
        if self.attack == "nan":
            arrays["logloss_sum"][0] = np.nan
        elif self.attack == "negative":
            arrays["confusion"][0, 0, 0] = -3
        elif self.attack == "too_many_rows":
            arrays["confusion"][0, 0, 0] += 50
        elif self.attack == "impossible_loss":
            arrays["logloss_sum"][:] = 1e9
        elif self.attack == "pairs":  # more ranked pairs than positives × negatives, in every slot
            arrays["rank_pairs"][:] = 1e9
        return type(reply)(reply.kind, arrays, reply.meta)


@pytest.mark.parametrize("attack", ["nan", "negative", "too_many_rows", "impossible_loss", "pairs"])
def test_hostile_fold_metrics_are_rejected_naming_the_site(attack):
    _, parts = classification_parts(450, 6, 3, 1, seed=2, class_sep=1.2)
    honest = [Site(f"s{i}", p, "target", seed=i) for i, p in enumerate(parts[:2])]
    bad = _Hostile("mallory", parts[2], "target", seed=2)
    bad.attack = attack
    fed = LocalFederation([*honest, bad])
    with pytest.raises(SiteError, match="mallory") as err:
        select_model(fed, selector="lasso", grid=(), modes=("none", "intercept"), contributions=False, rounds=1,
                     local_epochs=1)
    assert set(err.value.sites) == {"mallory"}


def test_exchange_count_counts_each_ask_once_through_subclasses():
    class Wrapped(LocalFederation):
        def ask(self, requests):  # an engine that wraps another's ask counts once per exchange
            return super().ask(requests)

    _, parts = classification_parts(120, 4, 2, 1, seed=0)
    fed = Wrapped([Site(f"s{i}", p, "target", seed=i) for i, p in enumerate(parts)])
    from fedtab.federation.protocol.messages import Message

    fed.broadcast(Message("describe", meta={"part": "train"}))
    fed.ask({"s0": Message("describe", meta={"part": "train"})})
    assert fed.exchange_count == 2


def test_every_message_can_be_answered_by_a_fresh_site_from_its_stored_state():
    """As a Flower ClientApp per message: each request is answered by a new Site whose state went
    through encode_state / decode_state (arrays + JSON, no pickle); the selection is the same."""
    from fedtab.engines.site_state import decode_state, encode_state
    from fedtab.federation.protocol.messages import Message

    _, parts = classification_parts(600, 8, 3, 1, seed=0, class_sep=1.2)

    class Fresh(LocalFederation):
        def __init__(self):
            self.stored = {f"s{i}": {} for i in range(len(parts))}
            super().__init__([Site(f"s{i}", p, "target", seed=i) for i, p in enumerate(parts)])

        def ask(self, requests):
            out = {}
            for name, req in requests.items():
                site = Site(name, parts[int(name[1:])], "target", seed=int(name[1:]))
                site.state.update(self.stored[name])
                reply = site.handle(Message.from_bytes(req.to_bytes()))
                msg, skipped = encode_state(site.state)
                assert not skipped, skipped
                self.stored[name] = decode_state(Message.from_bytes(msg.to_bytes()))
                out[name] = Message.from_bytes(reply.to_bytes())
            return out

    opts = dict(selector="lasso", rounds=2, local_epochs=2, grid=(0.5,), personal_epochs=10)
    ref = select_model(LocalFederation([Site(f"s{i}", p, "target", seed=i) for i, p in enumerate(parts)]), **opts)
    got = select_model(Fresh(), **opts)
    assert got.features == ref.features and got.personalisation == ref.personalisation
    np.testing.assert_allclose(got.model["params"]["coef"], ref.model["params"]["coef"])
    assert got.chosen["fold_logloss"] == pytest.approx(ref.chosen["fold_logloss"])
