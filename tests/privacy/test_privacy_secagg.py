"""Secure aggregation: the server reads sums only; sums survive dropouts; hostile inputs are caught."""

from typing import Callable, Mapping

import numpy as np

from fedtab.federation.protocol import set_options
from fedtab.privacy.gate import COUNT, Releases
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.data import classification_table, split_rows
from fedtab.engines.local import LocalFederation
from fedtab.federation import Federation, FederationError, Message, Site, run_election, run_training
from fedtab.federation.protocol.kinds import MessageKind, declare
from fedtab.federation.site.core import HANDLERS
from fedtab.federation.site.registry import handler
from fedtab.privacy import shamir
from fedtab.federation.protocol.secure_aggregator import SecureAggregator


@given(secret=st.sampled_from([16, 32]).flatmap(lambda k: st.binary(min_size=k, max_size=k)), n=st.integers(2, 7),
       data=st.data())
@settings(max_examples=30, deadline=None)
def test_shamir_any_t_shares_recover_the_secret_and_fewer_do_not(secret, n, data):
    t = data.draw(st.integers(2, n))
    shares = shamir.split(secret, n, t)
    pick = data.draw(st.permutations(range(n)))
    assert shamir.combine([shares[i] for i in pick[:t]]) == secret
    assert shamir.combine([shares[i] for i in pick[: t - 1]]) != secret
    assert all(len(y) == len(secret) for _, y in shares) and sorted(x for x, _ in shares) == list(range(1, n + 1))


if "probe_stats" not in HANDLERS:
    declare(MessageKind("probe_stats", __name__, Releases(part="=all", aggregates=("sum", "count"), meta={"n": COUNT}),
                        "a test's sums of every column", summed=True))

    @handler("probe_stats")
    def _probe(site: Site, request: Message) -> Message:
        x = site.table.to_numpy(dtype=float)
        return Message("probe_stats", {"sum": x.sum(0), "count": np.array([float(len(x))])}, {"n": len(x)})


class Tampering(Federation):
    """A federation whose replies (or requests) pass through ``hook(site, request, reply)``;
    it also records every reply the server receives."""

    def __init__(self, inner: LocalFederation, hook: Callable[[str, Message, Message], Message] | None = None):
        super().__init__()
        self.inner, self.hook, self.seen = inner, hook, []

    @property
    def sites(self):
        return self.inner.sites

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        out = {}
        for name, req in requests.items():
            reply = self.inner.ask({name: req})[name]
            if self.hook is not None:
                reply = self.hook(name, req, reply)
            self.seen.append((name, req, reply))
            out[name] = reply
        return out


def _sites(n=5, rows=200, cols=300, seed=0):
    rng = np.random.default_rng(seed)
    return [Site(f"s{i}", pd.DataFrame(rng.normal(5.0 * (i + 1), 3.0, size=(rows + 10 * i, cols)))
                 .rename(columns=str)) for i in range(n)]


def _plain_sum(sites):
    return sum(s.table.to_numpy().sum(0) for s in sites)


def _ask(agg, fed, **kw):
    return agg.ask({s: Message("probe_stats") for s in fed.sites}, "probe_stats", {"sum": None, "count": 0}, **kw)


def test_server_sees_masked_values_only_and_the_sum_is_exact():
    sites = _sites()
    fed = Tampering(LocalFederation(sites))
    result = _ask(SecureAggregator(fed), fed)
    plain = _plain_sum(sites)
    assert np.max(np.abs(result.sums["sum"] - plain)) / np.max(np.abs(plain)) < 1e-6
    assert result.sums["count"][0] == sum(len(s.table) for s in sites)
    masked = [(n, r) for n, _, r in fed.seen if r.kind == "probe_stats"]
    assert len(masked) == 5
    for name, reply in masked:
        assert "sum" not in reply.arrays and "count" not in reply.arrays
        truth = fed.inner.site(name).table.to_numpy().sum(0)
        y = reply.arrays["secagg:y"][:-1].astype(np.float64)
        # uniformly random words: no relation to the site's true sums (|r| ~ 0.06 for 300 values)
        assert abs(np.corrcoef(y, truth)[0, 1]) < 0.3
        assert not np.any(np.isclose(y / 2**24, truth, rtol=1e-3))
    # nothing else the server received carries the sums
    for _, _, reply in fed.seen:
        for arr in reply.arrays.values():
            assert arr.dtype in (np.uint8, np.uint64)


def test_sum_survives_sites_dropping_out_after_masking():
    sites = _sites()
    gone = {"s1", "s3"}  # 5 sites, threshold 3: two may vanish before unmasking

    def drop(name, req, reply):
        return Message.error("connection lost") if req.kind == "secagg_unmask" and name in gone else reply

    fed = Tampering(LocalFederation(sites), drop)
    result = _ask(SecureAggregator(fed), fed)
    assert result.survivors == [s.name for s in sites]  # their masked values are in the sum
    plain = _plain_sum(sites)
    assert np.max(np.abs(result.sums["sum"] - plain)) / np.max(np.abs(plain)) < 1e-6


def test_sum_of_the_others_when_a_site_drops_before_masking():
    sites = _sites()

    def drop(name, req, reply):
        return Message.error("timeout") if req.kind == "probe_stats" and name == "s2" else reply

    fed = Tampering(LocalFederation(sites), drop)
    result = _ask(SecureAggregator(fed), fed, on_error="skip")
    assert result.dropped == ["s2"]
    plain = _plain_sum([s for s in sites if s.name != "s2"])
    assert np.max(np.abs(result.sums["sum"] - plain)) / np.max(np.abs(plain)) < 1e-6


def test_too_many_dropouts_fail_with_a_clear_error():
    def drop(name, req, reply):
        return Message.error("gone") if req.kind == "secagg_unmask" and name != "s0" else reply

    fed = Tampering(LocalFederation(_sites(n=3, cols=5)), drop)
    with pytest.raises(FederationError, match="1 sites answered the unmasking, threshold is 2"):
        _ask(SecureAggregator(fed), fed)


def test_forged_shares_are_detected_and_outvoted():
    sites = _sites(cols=5)

    def forge(name, req, reply):
        if req.kind == "secagg_unmask" and name == "s4":
            shares = reply.arrays["b_shares"].copy()
            shares[:, -1] ^= 0x5A  # alter every share s4 hands back
            return Message(reply.kind, {**reply.arrays, "b_shares": shares}, reply.meta)
        return reply

    fed = Tampering(LocalFederation(sites), forge)
    result = _ask(SecureAggregator(fed), fed)  # 4 honest shares >= threshold 3: still exact
    assert np.allclose(result.sums["sum"], _plain_sum(sites), rtol=1e-6)
    # with only threshold-many answers the forgery cannot be outvoted: it is reported, not summed
    gone = {"s0", "s1"}

    def forge_and_drop(name, req, reply):
        if req.kind == "secagg_unmask" and name in gone:
            return Message.error("gone")
        return forge(name, req, reply)

    fed = Tampering(LocalFederation(_sites(cols=5)), forge_and_drop)
    # each share is checked against its dealer's commitment: the forger is named even then
    with pytest.raises(FederationError, match="site 's4': its share of site 's.'.s self-mask does not match") as err:
        _ask(SecureAggregator(fed), fed)
    assert set(err.value.sites) == {"s4"}


def test_a_share_altered_in_transit_does_not_authenticate():
    def tamper(name, req, reply):
        if req.kind == "probe_stats" and name == "s0":
            cts = reply.arrays["secagg:shares"].copy()
            cts[1, 20] ^= 1  # the share s0 encrypted for s1
            return Message(reply.kind, {**reply.arrays, "secagg:shares": cts}, reply.meta)
        return reply

    fed = Tampering(LocalFederation(_sites(cols=5)), tamper)
    result = _ask(SecureAggregator(fed), fed)  # s1 leaves out the share it cannot decrypt, naming s0
    unreadable = [r.meta["unreadable"] for n, q, r in fed.seen if q.kind == "secagg_unmask"]
    assert unreadable.count({}) == 4
    assert {"s0": "the share from site 's0' does not authenticate (forged or altered)"} in unreadable
    assert result.unreadable == {"s0": ["s1"]} and result.faults == {}
    assert np.allclose(result.sums["sum"], _plain_sum(fed.inner._sites.values()), rtol=1e-6)


def test_masked_values_of_the_wrong_length_are_named():
    def shorten(name, req, reply):
        if req.kind == "probe_stats" and name == "s3":
            return Message(reply.kind, {**reply.arrays, "secagg:y": reply.arrays["secagg:y"][:-2]}, reply.meta)
        return reply

    sites = _sites(cols=5)
    fed = Tampering(LocalFederation(sites), shorten)
    with pytest.raises(FederationError, match="site 's3': masked values of the wrong length"):
        _ask(SecureAggregator(fed), fed)
    fed = Tampering(LocalFederation(_sites(cols=5)), shorten)
    result = _ask(SecureAggregator(fed), fed, on_error="skip")  # left out like a dropped site
    assert result.dropped == ["s3"]
    assert np.allclose(result.sums["sum"], _plain_sum([s for s in sites if s.name != "s3"]), rtol=1e-6)


def test_replayed_messages_are_refused():
    sites = _sites(n=3, cols=5)
    fed = Tampering(LocalFederation(sites))
    agg = SecureAggregator(fed)
    _ask(agg, fed)
    masked_req = next(q for n, q, r in fed.seen if n == "s0" and q.kind == "probe_stats")
    unmask_req = next(q for n, q, r in fed.seen if n == "s0" and q.kind == "secagg_unmask")
    keys_req = next(q for n, q, r in fed.seen if n == "s0" and q.kind == "secagg_keys")
    site = fed.inner.site("s0")
    for request in (masked_req, unmask_req, keys_req):  # refused: nothing is computed or revealed
        reply = site.handle(request)
        assert reply.is_refusal and "replayed" in reply.meta["reason"], reply.meta
    # a reply replayed from an earlier sum is not accepted into the next one
    old = {n: r for n, q, r in fed.seen if q.kind == "probe_stats"}

    def replay(name, req, reply):
        return old[name] if req.kind == "probe_stats" and name == "s1" else reply

    fed.hook = replay
    with pytest.raises(FederationError, match="site 's1': its masked reply is not for this exchange"):
        _ask(agg, fed)


def test_sites_refuse_a_minority_threshold():
    fed = LocalFederation(_sites(n=5, cols=3))
    with pytest.raises(FederationError, match="threshold 2 is not a majority of 5 peers"):
        _ask(SecureAggregator(fed, threshold=2), fed)


@pytest.fixture(scope="module")
def seed_sites():
    table = classification_table(900, 30, 6, 4, 0, shuffle=False, seed=0)
    return split_rows(table, (0.5, 0.3, 0.2), stratify="target", seed=0)


@pytest.mark.parametrize("model", ["logistic", "gnb"])
def test_secure_election_and_training_equal_the_plain_run(seed_sites, model):
    runs = {}
    for secure in (False, True):
        fed = Tampering(LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(seed_sites)]))
        set_options(fed, secure_aggregation=secure)
        elected = run_election(fed, 0.5, describe="train")
        runs[secure] = (run_training(fed, described=elected.described, model=model, rounds=3), fed)
    (plain, _), (secure, fed) = runs[False], runs[True]
    for k in plain.params:
        assert np.max(np.abs(secure.params[k] - plain.params[k])) <= 1e-6 * np.max(np.abs(plain.params[k]))
    assert np.allclose(secure.mean, plain.mean, rtol=1e-6) and np.allclose(secure.std, plain.std, rtol=1e-6)
    assert secure.pooled == plain.pooled and secure.per_site == {}
    # no fit/describe/evaluate reply the server received carries a readable statistic
    for _, req, reply in fed.seen:
        if reply.kind in ("fit", "evaluate", "set_mask"):
            assert {a.dtype.kind for a in reply.arrays.values()} == {"u"}, reply.kind
            assert "n_samples" not in reply.meta


def test_secure_imputation_equals_the_plain_run():
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    rng = np.random.default_rng(0)
    z = rng.normal(size=(600, 2))
    full = pd.DataFrame(z @ rng.normal(size=(2, 6)) * [1, 10, 100, 0.1, 1, 1] + rng.normal(0, 0.3, (600, 6)),
                        columns=[f"c{i}" for i in range(6)])
    full = full.mask(rng.random(full.shape) < 0.1)
    tables = [full.iloc[:250, :5], full.iloc[250:450, 1:], full.iloc[450:]]
    res = {}
    for secure in (False, True):
        fed = LocalFederation([Site(f"s{i}", t, test_size=0.1, seed=0) for i, t in enumerate(tables)])
        set_options(fed, secure_aggregation=secure)
        res[secure] = run_imputation(fed, ImputeConfig(rounds=2, hidden_dim=8, n_layers=1))
    a, b = res[False], res[True]
    assert np.allclose(b.mean, a.mean, rtol=1e-6) and np.allclose(b.std, a.std, rtol=1e-6)
    assert np.nanmax(np.abs(b.pooled.corr - a.pooled.corr)) < 1e-6
    assert np.array_equal(b.pooled.pair_count, a.pooled.pair_count)
    # float32 weights: round 1's averages differ by the float32 cast (<= 1 ulp; the fixed-point error,
    # 2**-25 per site / the row count, is far smaller) and round 2's training mixes that error over the
    # whole network, so it scales with the model's largest weight, not each tensor's (a bias of 7e-3 moved
    # 8e-9). Measured <= 0.5 eps32 * that scale across CPU kernels; one site with 5 rows fewer moves the
    # weights by 1e-2 of it.
    eps32 = float(np.finfo(np.float32).eps)
    scale = eps32 * max(np.max(np.abs(w)) for w in a.weights.values())
    for k in a.weights:
        assert np.max(np.abs(b.weights[k] - a.weights[k])) <= 16 * scale, k
    # the RMSE of float32 predictions: measured 8e-9 relative; 8 eps32 (~1e-6)
    assert abs(b.validation["overall"] - a.validation["overall"]) < 8 * eps32 * a.validation["overall"]
    assert b.validation["per_site"] == {}


def test_cli_elect_with_secure_aggregation_matches_the_plain_run(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedtab.cli import app

    table = classification_table(600, 10, 4, 2, 0, seed=3, class_sep=1.5)
    files = []
    for i, part in enumerate(split_rows(table, [0.4, 0.35, 0.25], stratify="target", seed=1)):
        files.append(tmp_path / f"h{i}.csv")
        part.to_csv(files[-1], index=False)
    runner, docs = CliRunner(), {}
    for flag in ([], ["--secure-aggregation"]):
        out = tmp_path / f"out{len(flag)}"
        res = runner.invoke(app, ["elect", *map(str, files), "--target", "target", "--rounds", "2", "--out", str(out),
                                  *flag])
        assert res.exit_code == 0, res.output
        docs[bool(flag)] = json.loads((out / "result.json").read_text())
    assert docs[True]["training"]["elected"]["f1"] == docs[False]["training"]["elected"]["f1"]
    assert docs[True]["training"]["elected"]["per_site_f1"] == {}
    res = runner.invoke(app, ["elect", *map(str, files), "--target", "target", "--tune", "grid", "--secure-aggregation"])
    assert res.exit_code == 2 and "cannot be combined with --tune" in res.output


def test_the_job_turns_secure_aggregation_on(seed_sites, jobs):
    from fedtab.job.spec import JobError, spec_from_plan
    from fedtab.job.workflow import run_workflow

    job = {"election": {}, "training": {"rounds": 2}}
    assert spec_from_plan(jobs.plan(**job, privacy={"secure_aggregation": True})).privacy.secure_aggregation is True
    assert spec_from_plan(jobs.plan(**job)).privacy.secure_aggregation is False
    with pytest.raises(JobError, match=r"\[privacy\] secure_aggregation must be true or false"):
        jobs.plan(**job, privacy={"secure_aggregation": "maybe"})
    out = {}
    for flag in (False, True):
        fed = Tampering(LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(seed_sites)]))
        out[flag] = run_workflow(fed, spec_from_plan(jobs.plan(**job, privacy={"secure_aggregation": flag}))).result
        kinds = {q.kind for _, q, _ in fed.seen}
        assert ("secagg_unmask" in kinds) == flag
        assert out[flag]["privacy"]["secure_aggregation"] is flag
    pooled = {flag: r["training"]["metrics"]["pooled"] for flag, r in out.items()}
    assert pooled[True]["weighted_f1"] == pooled[False]["weighted_f1"]
    assert out[True]["training"]["metrics"]["per_site"] == {}
