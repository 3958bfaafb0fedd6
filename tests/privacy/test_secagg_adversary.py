"""Secure aggregation against a curious server and hostile sites.

The server relays every key, signature, share and survivor list; a site checks them against
the consortium key list from its own configuration. Each test plays one attack and asserts
that nothing is recovered (the site refuses, naming why) or that the hostile sender -- and
only it -- is named. The quorum matrix checks that a secure sum follows ``min_sites`` like
every other exchange.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedtab.deploy.keys import sign_site_keys, write_consortium_keys
from fedtab.engines.local import LocalFederation
from fedtab.errors import SiteFault
from fedtab.engines.site_config import build_site, with_job_settings
from fedtab.federation import Federation, FederationError, Message, Site, run_training
from fedtab.federation.protocol import QuorumError, SiteError, SiteRefused, set_options
from fedtab.federation.protocol.kinds import MessageKind, declare, summed_kinds
from fedtab.federation.site.core import HANDLERS
from fedtab.federation.site.registry import handler
from fedtab.privacy import DisclosurePolicy, shamir
from fedtab.privacy.gate import COUNT, Releases
from fedtab.privacy.identity import IdentityError, SiteIdentity, provision, read_key_list, signed_message
from fedtab.federation.protocol.secure_aggregator import SecureAggregator
from fedtab.privacy.secagg import SECAGG_META, _self_mask

KIND = "adv_stats"

if KIND not in HANDLERS:
    declare(MessageKind(KIND, __name__, Releases(part="=all", aggregates=("sum", "count"), meta={"n": COUNT}),
                        "an adversary test's sums of every column", summed=True))

    @handler(KIND)
    def _stats(site: Site, request: Message) -> Message:
        mode = site.state.get("adv_fail")
        if mode == "error":
            raise SiteFault("disk full")  # a site-side fault whose text the gate lets through
        if mode == "hang":
            site.state["adv_release"].wait()
        x = site.table.to_numpy(dtype=float)
        return Message(KIND, {"sum": x.sum(0), "count": np.array([float(len(x))])}, {"n": len(x)})


Hook = Callable[[str, Message], Message]


class Server(Federation):
    """A curious server's transport over a :class:`LocalFederation`: ``down(site, request)``
    rewrites what the site receives, ``up(site, request, reply)`` what the honest code sees;
    every (site, request as sent, reply as received) is recorded."""

    def __init__(self, inner: LocalFederation, down: Hook | None = None,
                 up: Callable[[str, Message, Message], Message] | None = None) -> None:
        super().__init__()
        self.inner, self.down, self.up, self.seen = inner, down, up, []

    @property
    def sites(self) -> list[str]:
        return self.inner.sites

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        out = {}
        for name, req in requests.items():
            sent = self.down(name, req) if self.down else req
            reply = self.inner.ask({name: sent})[name]
            self.seen.append((name, sent, reply))
            out[name] = self.up(name, sent, reply) if self.up else reply
        return out

    def replies(self, kind: str) -> dict[str, Message]:
        return {n: r for n, q, r in self.seen if q.kind == kind}


def _sites(n: int = 5, cols: int = 6, seed: int = 0, policy=None) -> list[Site]:
    rng = np.random.default_rng(seed)
    return [Site(f"s{i}", pd.DataFrame(rng.normal(3.0 * (i + 1), 2.0, size=(40 + 5 * i, cols))).rename(columns=str),
                 policy=policy) for i in range(n)]


def _truth(sites) -> np.ndarray:
    return sum(s.table.to_numpy().sum(0) for s in sites)


def _ask(agg: SecureAggregator, names, **kw):
    return agg.ask({s: Message(KIND) for s in names}, KIND, {"sum": None, "count": 0}, **kw)


def _refusals(fed: Server, kind: str) -> dict[str, str]:
    return {n: r.meta["reason"] for n, r in fed.replies(kind).items() if r.is_refusal}


def _with(req: Message, arrays=None, meta=None) -> Message:
    return Message(req.kind, {**req.arrays, **(arrays or {})}, {**req.meta, **(meta or {})})


# ------------------------------------------------------------------ key substitution
def test_server_substituting_a_peers_session_key_is_refused_naming_the_peer():
    attacker = X25519PrivateKey.generate().public_key().public_bytes_raw()

    def substitute(site, req):
        if SECAGG_META in req.meta and site == "s0":  # s0 would mask with a key the server holds
            peers = req.meta[SECAGG_META]["peers"]
            pk = req.arrays["secagg:pk"].copy()
            pk[peers.index("s1")] = np.frombuffer(attacker, dtype=np.uint8)
            return _with(req, {"secagg:pk": pk})
        return req

    fed = Server(LocalFederation(_sites(3)), down=substitute)
    with pytest.raises(SiteRefused) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.refusals) == {"s0"}
    assert "the session key of peer 's1' is not signed by its identity key" in err.value.refusals["s0"]
    assert "secagg:y" not in fed.replies(KIND)["s0"].arrays  # nothing masked, nothing to unmask


def test_server_substituting_key_signature_and_identity_is_refused():
    rogue = ec.generate_private_key(ec.SECP384R1())  # the server's own identity, not in the sites' key list
    pk = X25519PrivateKey.generate().public_key().public_bytes_raw()

    def substitute(site, req):
        if SECAGG_META in req.meta and site != "s1":
            spec = req.meta[SECAGG_META]
            j = spec["peers"].index("s1")
            arrays = {k: req.arrays[k].copy() for k in ("secagg:pk", "secagg:ksig", "secagg:id")}
            arrays["secagg:pk"][j] = np.frombuffer(pk, dtype=np.uint8)
            spk = req.arrays["secagg:spk"][j].tobytes()
            arrays["secagg:ksig"][j] = np.frombuffer(_rogue_sig(rogue, spec["session"], pk, spk), dtype=np.uint8)
            arrays["secagg:id"][j] = np.frombuffer(_der(rogue), dtype=np.uint8)
            return _with(req, arrays)
        return req

    fed = Server(LocalFederation(_sites(4)), down=substitute)
    with pytest.raises(SiteRefused) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.refusals) == {"s0", "s2", "s3"}
    assert all("the identity key of site 's1' is not the one in the consortium key list" in r
               for r in err.value.refusals.values())


def _der(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _rogue_sig(key, session: str, pk: bytes, spk: bytes) -> bytes:
    """A valid signature of s1's (substituted) session key -- by a key the consortium never listed."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(key.sign(signed_message("key", session, "s1", pk, spk), ec.ECDSA(hashes.SHA384())))
    return r.to_bytes(48, "big") + s.to_bytes(48, "big")


def test_server_checks_keys_against_its_key_list_and_names_the_impostor():
    sites = _sites(4)
    fed = LocalFederation(sites)
    impostor = provision(["s2"])["s2"]  # s2 runs with a key outside the consortium's list
    sites[2].identity = impostor
    with pytest.raises(SiteError) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.sites) == {"s2"} and "consortium key list" in err.value.sites["s2"]
    # with a quorum it is dropped by name and the others' sum completes
    fed = LocalFederation(_sites(4), min_sites=3)
    fed.site("s2").identity = provision(["s2"])["s2"]
    result = _ask(SecureAggregator(fed), ["s0", "s1", "s3"])
    assert "s2" in fed.dropped and result.survivors == ["s0", "s1", "s3"]
    assert np.allclose(result.sums["sum"], _truth([fed.site(s) for s in ("s0", "s1", "s3")]), rtol=1e-6)


# ------------------------------------------------------------------ too few peers
@pytest.mark.parametrize("peers,threshold,why", [
    (["s0"], 1, "at least min_peers=3"),
    (["s0", "s1"], 2, "at least min_peers=3"),
    (["s0", "s1", "s2"], 1, "threshold 1 is not a majority of 3 peers"),
    (["s0", "s1", "s2", "s3"], 2, "threshold 2 is not a majority of 4 peers"),
])
def test_self_only_and_tiny_peer_sets_are_refused(peers, threshold, why):
    def shrink(site, req):
        if SECAGG_META in req.meta and site == "s0":
            spec = req.meta[SECAGG_META]
            idx = [spec["peers"].index(p) for p in peers]
            arrays = {k: req.arrays[k][idx] for k in ("secagg:pk", "secagg:spk", "secagg:ksig", "secagg:id")}
            return _with(req, arrays, {SECAGG_META: {**spec, "peers": peers, "threshold": threshold}})
        return req

    fed = Server(LocalFederation(_sites(4)), down=shrink)
    agg = SecureAggregator(fed)
    with pytest.raises(SiteRefused):
        _ask(agg, fed.sites)
    refusals = _refusals(fed, KIND)
    assert set(refusals) == {"s0"} and why in refusals["s0"], refusals
    assert "secagg:y" not in fed.replies(KIND)["s0"].arrays


def test_a_site_sets_its_own_min_peers():
    strict = DisclosurePolicy(min_rows=1, min_peers=5)
    sites = _sites(4)
    sites[1].policy = strict
    fed = LocalFederation(sites)
    with pytest.raises(SiteRefused, match="site 's1' refused: secure aggregation over 4 peer"):
        _ask(SecureAggregator(fed), fed.sites)
    assert DisclosurePolicy.from_dict({"min-peers": 4}).min_peers == 4
    with pytest.raises(ValueError, match="min_peers"):
        DisclosurePolicy(min_peers=-1)


# ------------------------------------------------------------------ the survivor-list lie
def test_survivor_list_lie_is_refused_and_recovers_nothing():
    """The server tells s0 that s1 dropped (so s0 would reveal its pairwise seed with s1)
    and tells the others that s1 survived (so they reveal shares of s1's self-mask)."""
    sites = _sites(5)
    state: dict = {}

    def lie(site, req):
        if req.kind == "secagg_sign":
            state.setdefault("U", req.meta["survivors"])
            if site == "s0":
                return _with(req, meta={"survivors": [s for s in req.meta["survivors"] if s != "s1"]})
        return req

    fed = Server(LocalFederation(sites), down=lie)
    agg = SecureAggregator(fed)
    result = _ask(agg, fed.sites)  # the honest code sees s0's signature fail and leaves it out
    assert result.faults == {"s0": "its signature on the survivor list does not verify"}
    # the lie, completed: s0 gets an unmask request for "s1 dropped" with every signature the server holds
    sign = fed.replies("secagg_sign")
    template = next(q for n, q, r in fed.seen if q.kind == "secagg_unmask" and n == "s2")
    told = [s for s in state["U"] if s != "s1"]
    peers = state["U"]
    masked = fed.replies(KIND)
    lie_req = Message("secagg_unmask", {
        "secagg:sigs": np.stack([sign[s].arrays["sig"] for s in told]),
        "secagg:shares": np.stack([masked[k].arrays["secagg:shares"][0] for k in peers]),
        "secagg:share_hashes": np.stack([masked[k].arrays["secagg:share_hashes"][0] for k in peers]),
    }, {**template.meta, "survivors": told, "dropped": ["s1"], "signers": told})
    reply = fed.inner.site("s0").handle(lie_req)
    assert reply.is_refusal and "inconsistent survivor lists" in reply.meta["reason"], reply.meta
    assert "'s2', 's3', 's4'" in reply.meta["reason"]  # the signatures that are on another list
    # no site revealed a pairwise seed: s1's masked vector cannot be opened alone
    answers = fed.replies("secagg_unmask")
    assert all(r.arrays["seeds"].shape == (0, 32) for r in answers.values() if not r.is_refusal)
    k = peers.index("s1")
    b1 = shamir.combine([(peers.index(h) + 1, answers[h].arrays["b_shares"][k].tobytes()) for h in ("s2", "s3", "s4")])
    y1 = masked["s1"].arrays["secagg:y"]
    guess = (y1 - _self_mask(b1, len(y1))).view(np.int64)[:-1] / 2.0**24  # best the server can do without the seeds
    truth = sites[1].table.to_numpy().sum(0)
    assert not np.any(np.isclose(guess, truth, rtol=1e-3))
    # the honest sum is all the server learned
    assert np.allclose(result.sums["sum"], _truth(sites), rtol=1e-6)


def test_sites_sign_one_survivor_list_per_sum():
    sites = _sites(3)
    fed = Server(LocalFederation(sites))
    _ask(SecureAggregator(fed), fed.sites)
    req = next(q for n, q, r in fed.seen if q.kind == "secagg_sign" and n == "s0")
    site = fed.inner.site("s0")
    again = site.handle(req)  # the same list: the same signature (a retry is harmless) -- but unmasked now
    assert again.is_refusal and "already unmasked" in again.meta["reason"]
    # before unmasking, a second, different list is refused
    fed = Server(LocalFederation(_sites(3)), down=lambda n, q: Message("lost_in_transit")
                 if q.kind == "secagg_unmask" else q)  # no site sees the unmask request
    with pytest.raises(FederationError, match="0 sites answered the unmasking"):
        _ask(SecureAggregator(fed), fed.sites)
    req = next(q for n, q, r in fed.seen if q.kind == "secagg_sign" and n == "s0")
    site = fed.inner.site("s0")
    assert np.array_equal(site.handle(req).arrays["sig"], fed.replies("secagg_sign")["s0"].arrays["sig"])
    other = site.handle(_with(req, meta={"survivors": ["s0", "s2"]}))
    assert other.is_refusal and "second, different survivor list" in other.meta["reason"]


def test_unmask_with_too_few_signatures_is_refused():
    fed = Server(LocalFederation(_sites(3)), down=lambda n, q: _with(q, {"secagg:sigs": q.arrays["secagg:sigs"][:1]},
                                                                        {"signers": q.meta["signers"][:1]})
                 if q.kind == "secagg_unmask" else q)
    with pytest.raises(FederationError, match="0 sites answered the unmasking"):
        _ask(SecureAggregator(fed), fed.sites)
    reasons = _refusals(fed, "secagg_unmask")
    assert set(reasons) == {"s0", "s1", "s2"}
    assert all("only 1 survivor(s) signed" in r and "threshold is 2" in r for r in reasons.values())


# ------------------------------------------------------------------ sites that insist
def _labelled_sites(policy: DisclosurePolicy, n: int = 3) -> list[Site]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        x = rng.normal(size=(60, 3))
        t = pd.DataFrame(x, columns=["a", "b", "c"]).assign(y=(x[:, 0] + rng.normal(0, .5, 60) > 0).astype(int))
        out.append(Site(f"h{i}", t, "y", policy=policy))
    return out


def test_a_site_requiring_secure_aggregation_refuses_plain_sums():
    policy = DisclosurePolicy(min_rows=1, require_secure_aggregation=True)
    sites = _labelled_sites(policy)
    with pytest.raises(SiteRefused) as err:
        run_training(LocalFederation(sites), ["a", "b", "c"], rounds=1)
    assert set(err.value.refusals) == {"h0", "h1", "h2"}
    assert all("only with secure aggregation" in r for r in err.value.refusals.values())
    fed = LocalFederation(_labelled_sites(policy))
    set_options(fed, secure_aggregation=True)
    secure = run_training(fed, ["a", "b", "c"], rounds=1)
    plain = run_training(LocalFederation(_labelled_sites(DisclosurePolicy(min_rows=1))), ["a", "b", "c"], rounds=1)
    assert secure.pooled["weighted_f1"] == pytest.approx(plain.pooled["weighted_f1"], abs=1e-9)
    site = _labelled_sites(policy)[0]
    for kind, meta in [("describe", {}), ("fit", {}), ("evaluate", {}), ("class_moments", {}),
                       ("score_sums", {}), ("impute_stats", {}), ("impute_fit", {}), ("impute_eval", {}),
                       ("impute_schema", {}), ("set_mask", {"describe": "train", "features": ["a"]})]:
        reply = site.handle(Message(kind, meta=meta))
        assert reply.is_refusal and "require_secure_aggregation" in reply.meta["reason"], kind
    assert {"describe", "set_mask", "fit", "evaluate", "impute_fit"} <= summed_kinds()
    # what is not a sum is answered: the election's mask alone, the imputation column names
    assert not site.handle(Message("set_mask", meta={"features": ["a"]})).is_refusal
    assert not site.handle(Message("impute_schema", meta={"columns_only": True})).is_refusal


def test_a_site_requiring_dp_refuses_requests_without_dp():
    site = _labelled_sites(DisclosurePolicy(min_rows=1, require_dp=True))[0]
    reply = site.handle(Message("describe", meta={"features": ["a", "b"]}))
    assert reply.is_refusal and "only with differential privacy (require_dp)" in reply.meta["reason"]
    noisy = site.handle(Message("describe", meta={"features": ["a", "b"], "dp": {
        "z": 2.0, "bounds": [-5, 5], "clip": 1.0}}))
    assert not noisy.is_refusal


def test_a_site_requiring_secure_aggregation_masks_every_array():
    sites = _sites(3, policy=DisclosurePolicy(min_rows=1, require_secure_aggregation=True))
    fed = LocalFederation(sites)
    with pytest.raises(FederationError, match="leaves summable array\\(s\\) \\['count'\\] unmasked"):
        SecureAggregator(fed).ask({s: Message(KIND) for s in fed.sites}, KIND, {"sum": None})


# ------------------------------------------------------------------ hostile material names its sender
def _forge_unmask(who: str, fn) -> Callable[[str, Message, Message], Message]:
    def up(site, req, reply):
        if req.kind == "secagg_unmask" and site == who and not reply.is_refusal:
            return Message(reply.kind, fn(dict(reply.arrays)), reply.meta)
        return reply
    return up


@pytest.mark.parametrize("forgery", ["garbage", "all-ones", "one bit"])
def test_forged_shares_name_their_holder_and_no_honest_site(forgery):
    rng = np.random.default_rng(7)

    def fn(arrays):
        s = arrays["b_shares"].copy()
        if forgery == "garbage":
            s[:] = rng.integers(0, 256, s.shape, dtype=np.uint8)
        elif forgery == "all-ones":  # no share is "out of the field": every 16 bytes are an element of GF(2^128)
            s[:] = 0xFF
        else:
            s[1, 0] ^= 1
        return {**arrays, "b_shares": s}

    sites = _sites(5)
    fed = Server(LocalFederation(sites), up=_forge_unmask("s3", fn))
    result = _ask(SecureAggregator(fed), fed.sites)
    assert list(result.faults) == ["s3"] and "does not match" in result.faults["s3"]
    assert np.allclose(result.sums["sum"], _truth(sites), rtol=1e-6)


def test_malformed_unmask_reply_names_the_sender():
    sites = _sites(5)
    fed = Server(LocalFederation(sites, min_sites=3), up=_forge_unmask(
        "s2", lambda a: {**a, "b_shares": a["b_shares"][:, :7]}))
    fed.min_sites = 3
    result = _ask(SecureAggregator(fed), fed.sites)
    assert list(result.late) == ["s2"] and "b_shares must be" in result.late["s2"]
    assert np.allclose(result.sums["sum"], _truth(sites), rtol=1e-6)
    assert list(fed.dropped) == ["s2"] and "b_shares must be" in fed.dropped["s2"]


def test_garbage_ciphertexts_name_their_dealer_only():
    def garble(site, req, reply):
        if req.kind == KIND and site == "s0":
            cts = np.random.default_rng(3).integers(0, 256, reply.arrays["secagg:shares"].shape, dtype=np.uint8)
            return Message(reply.kind, {**reply.arrays, "secagg:shares": cts}, reply.meta)
        return reply

    fed = Server(LocalFederation(_sites(3)), up=garble)
    with pytest.raises(SiteError) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.sites) == {"s0"} and "could not be read by ['s1', 's2']" in err.value.sites["s0"]
    unreadable = {n: r.meta["unreadable"] for n, r in fed.replies("secagg_unmask").items()}
    assert set(unreadable["s1"]) == set(unreadable["s2"]) == {"s0"} and unreadable["s0"] == {}


def test_a_dealer_whose_shares_do_not_match_its_commitment_is_named():
    def recommit(site, req, reply):
        if req.kind == KIND and site == "s1":
            info = {**reply.meta[SECAGG_META], "commit": "0" * 64}
            return Message(reply.kind, reply.arrays, {**reply.meta, SECAGG_META: info})
        return reply

    fed = Server(LocalFederation(_sites(3)), up=recommit)
    with pytest.raises(SiteError) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.sites) == {"s1"} and "do not match its commitment" in err.value.sites["s1"]


def test_bad_signatures_name_the_signer():
    def bad_key_sig(site, req, reply):
        if req.kind == "secagg_keys" and site == "s1":
            sig = reply.arrays["sig"].copy()
            sig[5] ^= 1
            return Message(reply.kind, {**reply.arrays, "sig": sig}, reply.meta)
        return reply

    fed = Server(LocalFederation(_sites(4)), up=bad_key_sig)
    with pytest.raises(SiteError) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert err.value.sites == {"s1": "its session key's signature does not verify"}

    def bad_list_sig(site, req, reply):
        if req.kind == "secagg_sign" and site == "s2":
            return Message(reply.kind, {"sig": np.zeros(64, np.uint8)}, reply.meta)
        return reply

    sites = _sites(4)
    fed = Server(LocalFederation(sites), up=bad_list_sig)
    result = _ask(SecureAggregator(fed), fed.sites)
    assert result.faults == {"s2": "its signature on the survivor list does not verify"}
    assert np.allclose(result.sums["sum"], _truth(sites), rtol=1e-6)


# ------------------------------------------------------------------ the key list and its CA signature
@pytest.fixture
def consortium(tmp_path):
    keys = write_consortium_keys(tmp_path / "c", ["s0", "s1", "s2"])
    return keys


def _file_identity(keys, name="s0", **over) -> SiteIdentity:
    cfg = {**keys.identity_config(name), **over}
    return SiteIdentity.from_files(name, cfg["identity-key"], cfg["consortium-keys"], cfg["root-certificates"])


def test_key_list_from_files_verifies_against_the_ca(consortium):
    identity = _file_identity(consortium)
    assert identity.problem is None
    assert identity.key_list.fingerprints == consortium.fingerprints()
    assert read_key_list(consortium.site_keys, consortium.ca_cert).fingerprints == consortium.fingerprints()


def test_a_key_list_whose_ca_signature_does_not_verify_is_refused(consortium, tmp_path):
    doc = consortium.site_keys.read_text().replace(consortium.fingerprints()["s1"],
                                                   provision(["x"])["x"].key_list.fingerprints["x"])
    consortium.site_keys.write_text(doc)  # the server's key for s1, without the CA
    with pytest.raises(IdentityError, match="CA signature does not verify"):
        read_key_list(consortium.site_keys, consortium.ca_cert)
    identity = _file_identity(consortium)
    assert "CA signature does not verify" in identity.problem
    site = _sites(1)[0]
    site.identity = identity
    reply = site.handle(Message("secagg_keys", meta={"session": "abc"}))
    assert reply.is_refusal and "CA signature does not verify" in reply.meta["reason"]
    # a list signed by another CA does not verify against this consortium's CA either
    other = write_consortium_keys(tmp_path / "other", ["s0", "s1", "s2"])
    assert "does not verify" in _file_identity(consortium, **{"consortium-keys": str(other.site_keys)}).problem
    # re-signed by the consortium's own CA, the edited list verifies (but no longer holds s1's real key)
    sign_site_keys(consortium.site_keys, consortium.ca_key)
    assert read_key_list(consortium.site_keys, consortium.ca_cert).fingerprints["s1"] != \
        write_consortium_keys(tmp_path / "x", ["s1"]).fingerprints()["s1"]


def test_a_key_list_without_the_sites_own_key_is_not_used(consortium, tmp_path):
    stranger = write_consortium_keys(tmp_path / "s", ["s0"])
    identity = _file_identity(consortium, **{"identity-key": str(stranger.site_private["s0"])})
    assert "does not hold this site's identity key" in identity.problem
    missing = _file_identity(consortium, **{"root-certificates": str(tmp_path / "nope.pem")})
    assert "nope.pem" in missing.problem


def test_site_config_keys_load_the_identity(consortium, tmp_path):
    data = tmp_path / "s0.csv"
    pd.DataFrame({"a": [1.0, 2.0, 3.0], "y": [0, 1, 0]}).to_csv(data, index=False)
    for form in ("-", "_"):
        cfg = {"name": "s0", "data-path": str(data), "target": "y",
               **{k.replace("-", form): v for k, v in consortium.identity_config("s0").items()}}
        site = build_site(cfg)
        assert site.identity is not None and site.identity.problem is None
    partial = build_site({"name": "s0", "data-path": str(data), "identity-key": str(consortium.site_private["s0"])})
    assert "but not consortium-keys, root-certificates" in partial.identity.problem
    assert build_site({"name": "s0", "data-path": str(data)}).identity is None
    # the job (the server side) cannot choose a site's key list
    with pytest.raises(ValueError, match="refuses job settings consortium-keys"):
        with_job_settings({"name": "s0"}, {"s0": {"consortium-keys": "/tmp/server.json"}})


def test_a_site_without_an_identity_refuses_to_mask():
    sites = _sites(3)
    fed = LocalFederation(sites, identities=False)
    with pytest.raises(SiteRefused, match="no identity key and verified consortium key list"):
        _ask(SecureAggregator(fed), fed.sites)


# ------------------------------------------------------------------ quorum under secure aggregation
def _fail(mode: str, fed: LocalFederation, name: str, release: threading.Event):
    site = fed.site(name)
    if mode in ("error", "hang"):
        site.state["adv_fail"] = mode
        site.state["adv_release"] = release
    elif mode == "refuse":
        site.policy = DisclosurePolicy(min_peers=len(fed.sites) + 1)
    return fed


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("mode,reason", [("error", "disk full"),
                                         ("refuse", "refused: secure aggregation over"),
                                         ("hang", "no reply within"),
                                         ("malformed", "masked values of the wrong length")])
def test_quorum_drops_a_site_failing_before_masking(n, mode, reason):
    release = threading.Event()
    sites = _sites(n)
    inner = LocalFederation(sites, min_sites=n - 1, timeout=2.0 if mode == "hang" else None)
    _fail(mode, inner, "s1", release)

    def shorten(site, req, reply):
        if req.kind == KIND and site == "s1":
            return Message(reply.kind, {**reply.arrays, "secagg:y": reply.arrays["secagg:y"][:-1]}, reply.meta)
        return reply

    fed = Server(inner, up=shorten if mode == "malformed" else None)
    fed.min_sites = n - 1
    try:
        agg = SecureAggregator(fed)
        result = _ask(agg, agg.peers)
    finally:
        release.set()
    others = [s for s in sites if s.name != "s1"]
    assert result.survivors == [s.name for s in others] and result.dropped == ["s1"]
    assert np.allclose(result.sums["sum"], _truth(others), rtol=1e-6)
    assert result.sums["count"][0] == sum(len(s.table) for s in others)
    assert list(fed.dropped) == ["s1"] and reason in fed.dropped["s1"], fed.dropped
    assert fed.participation[-1] == {"step": KIND, "sites": [s.name for s in others]}
    assert agg.peers == [s.name for s in others]  # the next sum goes to the others


@pytest.mark.parametrize("n", [3, 4])
def test_quorum_a_site_dropping_after_masking_costs_nothing(n):
    sites = _sites(n)
    fed = Server(LocalFederation(sites), up=lambda s, q, r: Message.error("connection lost")
                 if q.kind == "secagg_unmask" and s == "s2" else r)
    fed.min_sites = n - 1
    result = _ask(SecureAggregator(fed), fed.sites)
    assert result.survivors == [s.name for s in sites]  # its masked value is in the sum
    assert np.allclose(result.sums["sum"], _truth(sites), rtol=1e-6)
    assert result.late == {"s2": "did not help unmask: connection lost"}
    assert fed.dropped == {"s2": "connection lost"}


def test_without_a_quorum_a_failing_site_still_raises_naming_it():
    release = threading.Event()
    fed = LocalFederation(_sites(3))
    _fail("error", fed, "s2", release)
    with pytest.raises(SiteError) as err:
        _ask(SecureAggregator(fed), fed.sites)
    assert set(err.value.sites) == {"s2"} and "disk full" in err.value.sites["s2"]


def test_quorum_too_few_left_raises():
    release = threading.Event()
    fed = LocalFederation(_sites(3), min_sites=3)
    _fail("error", fed, "s0", release)
    with pytest.raises(QuorumError):
        _ask(SecureAggregator(fed), fed.sites)


def test_secure_training_under_a_quorum_drops_the_failing_site_and_trains_on_the_others():
    policy = DisclosurePolicy(min_rows=1)
    sites = _labelled_sites(policy, n=4)
    sites[3].policy = DisclosurePolicy(min_rows=1000)  # h3 refuses to describe its 60 rows
    fed = LocalFederation(sites, min_sites=3)
    set_options(fed, secure_aggregation=True)
    model = run_training(fed, ["a", "b", "c"], rounds=2)
    assert list(fed.dropped) == ["h3"] and "min_rows=1000" in fed.dropped["h3"]
    assert model.per_site == {} and all(p["sites"] == ["h0", "h1", "h2"] for p in model.participation
                                                   if p["step"] != "schema")  # h3 declared, then refused
    ref = run_training(LocalFederation(_labelled_sites(policy, n=3)), ["a", "b", "c"], rounds=2)
    for k in ref.params:
        assert np.max(np.abs(model.params[k] - ref.params[k])) <= 1e-6 * np.max(np.abs(ref.params[k])), k
