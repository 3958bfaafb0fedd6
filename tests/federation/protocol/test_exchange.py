"""Dropouts (issue 10, item 5): quorum, per-exchange timeout, a site that fails or is rejected."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fedtab import LocalFederation, Site, run_election, run_training
from fedtab.federation import Message, QuorumError, SiteError
from tests.builders import classification_parts


class Flaky(Site):
    """A site that misbehaves on the ``nth`` request of ``kind``: ``"raise"``, ``"exit"`` or ``"hang"``.
    ``kind`` is the training exchange: ``"newton"`` for the default logistic model (Newton–Raphson)."""

    def __init__(self, *args, kind="newton", nth=2, how="raise", release=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind, self.nth, self.how, self.release, self.seen = kind, nth, how, release, 0

    def handle(self, request):
        if request.kind == self.kind:
            self.seen += 1
            if self.seen >= self.nth:
                if self.how == "hang":
                    self.release.wait(30)
                    return Message.error("released")
                if self.how == "exit":
                    return super().handle(Message("__exit__"))
                return Message.error("disk on fire")
        return super().handle(request)


@pytest.fixture(scope="module")
def parts():
    return classification_parts(300, 8, 3, 2, [0.34, 0.33, 0.33], seed=1, class_sep=1.5)[1]


def _sites(parts, **flaky):
    sites = [Site(f"s{i}", p, "target", selector="anova") for i, p in enumerate(parts[:2])]
    sites.append(Flaky("bad", parts[2], "target", selector="anova", **flaky))
    return sites


def test_without_a_quorum_a_failing_site_stops_the_run_naming_it(parts):
    fed = LocalFederation(_sites(parts))
    with pytest.raises(SiteError, match="site 'bad': disk on fire") as exc:
        run_training(fed, rounds=3)
    assert set(exc.value.sites) == {"bad"}


def test_with_a_quorum_the_run_continues_and_records_who_took_part(parts, caplog):
    fed = LocalFederation(_sites(parts))
    out = run_training(fed, rounds=3, min_sites=2)
    assert out.dropped == {"bad": "disk on fire"}
    steps = [(p["step"], p["sites"]) for p in out.participation]
    assert steps == [("describe", ["s0", "s1", "bad"]), ("newton", ["s0", "s1", "bad"]), ("newton", ["s0", "s1"]),
                     ("newton", ["s0", "s1"]), ("evaluate", ["s0", "s1"])]
    assert set(out.per_site) == {"s0", "s1"}
    assert "dropping site 'bad'" in caplog.text or "site 'bad': disk on fire" in caplog.text


def test_a_handler_calling_sys_exit_is_an_error_reply_not_the_end_of_the_server(parts):
    from fedtab.federation.site.core import HANDLERS
    from fedtab.federation.site.registry import handler

    if "__exit__" not in HANDLERS:
        from fedtab.federation.protocol.kinds import MessageKind, declare
        from fedtab.privacy.gate import Releases

        declare(MessageKind("__exit__", __name__, Releases(part=None), "a test's handler that calls sys.exit"))
        handler("__exit__")(lambda site, request: (_ for _ in ()).throw(SystemExit(3)))
    fed = LocalFederation(_sites(parts, how="exit"))
    out = run_training(fed, rounds=2, min_sites=2)
    assert "SystemExit" in out.dropped["bad"]
    reply = fed.site("s0").handle(Message("__exit__"))
    assert reply.is_error and "SystemExit" in reply.meta["error"]


def test_a_site_that_does_not_answer_in_time_is_dropped_and_never_asked_again(parts):
    release = threading.Event()
    try:
        fed = LocalFederation(_sites(parts, how="hang", release=release), timeout=2.0, min_sites=2)
        out = run_training(fed, rounds=3)
        assert "no reply within 2 s" in out.dropped["bad"]
        assert fed.site("bad").seen == 2  # not asked for round 3 or the evaluation
        assert out.participation[-1] == {"step": "evaluate", "sites": ["s0", "s1"]}
    finally:
        release.set()


def test_the_quorum_is_enforced(parts):
    fed = LocalFederation(_sites(parts), min_sites=3)
    with pytest.raises(QuorumError, match="quorum is 3"):
        run_training(fed, rounds=3)
    with pytest.raises(ValueError, match="min_sites"):
        LocalFederation(_sites(parts), min_sites=4)
    with pytest.raises(ValueError, match="min_sites"):
        run_election(LocalFederation(_sites(parts)), 0.5, min_sites=0)


#: the training exchange of each logistic solver and the check that refuses a reply inflated 10¹²×:
#: FedAvg's plausible-norm check on the weights; Newton's exact-sums check (the Hessian's intercept entry
#: Σ p(1 − p) is at most n/4 for the rows the site declared)
SOLVERS = [pytest.param("fit", {"name": "logistic", "params": {"solver": "fedavg"}}, "implausible", id="fedavg"),
           pytest.param("newton", "logistic", "impossible for the rows declared", id="newton")]


@pytest.mark.parametrize(("kind", "model", "why"), SOLVERS)
def test_a_rejected_reply_drops_only_its_sender(parts, kind, model, why):
    class Inflating(Site):
        def handle(self, request):
            reply = super().handle(request)
            if request.kind == kind:  # 10**12 x its weights / sums
                return Message(kind, {k: v * 1e12 for k, v in reply.arrays.items()}, reply.meta)
            return reply

    sites = [Site(f"s{i}", p, "target", selector="anova") for i, p in enumerate(parts[:2])]
    fed = LocalFederation(sites + [Inflating("big", parts[2], "target")])
    with pytest.raises(SiteError, match=f"site 'big'.*{why}") as exc:
        run_training(fed, model=model, rounds=2)
    assert set(exc.value.sites) == {"big"} and "'s0'" not in str(exc.value) and "'s1'" not in str(exc.value)
    fed = LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(parts[:2])]
                          + [Inflating("big", parts[2], "target")], min_sites=2)
    out = run_training(fed, model=model, rounds=2)
    assert "big" in out.dropped and set(out.per_site) == {"s0", "s1"}
    # the hostile update never reached the average: the model is as small and good as an honest one
    assert all(np.abs(v).max() < 100 for v in out.params.values())
    assert out.pooled["weighted_f1"] > 0.7


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="imputation needs torch")
def test_federated_imputer_quorum_drops_a_failing_site_and_names_it(monkeypatch):
    import pandas as pd

    import fedtab.federation.site.core as site_module
    from fedtab.imputer import FederatedImputer

    rng = np.random.default_rng(0)
    z = rng.normal(size=(240, 2))
    table = pd.DataFrame(z @ rng.normal(size=(2, 5)) + 0.1 * rng.normal(size=(240, 5)),
                         columns=[f"c{i}" for i in range(5)])
    tables = {"a": table.iloc[:80], "b": table.iloc[80:160], "c": table.iloc[160:]}
    real = site_module.Site

    def site(name, *args, **kwargs):  # site "c" fails on its second training round
        if name == "c":
            return Flaky(name, *args, kind="impute_fit", nth=2, **kwargs)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(site_module, "Site", site)
    opts = dict(rounds=3, local_epochs=1, hidden_dim=8, n_layers=1, seed=0)
    with pytest.raises(SiteError, match="'c'"):
        FederatedImputer(**opts).fit(tables)
    imp = FederatedImputer(min_sites=2, **opts).fit(tables)
    assert set(imp.result_.dropped) == {"c"} and "disk on fire" in imp.result_.dropped["c"]
    assert imp.transform(tables["a"]).notna().all().all()
    with pytest.raises(ValueError, match="min_sites"):
        FederatedImputer(min_sites=4, **opts).fit(tables)
