"""The server side of secure aggregation: :class:`SecureAggregator` runs secure sums over a
:class:`~fedtab.federation.protocol.Federation` through the one exchange path
(:func:`~fedtab.federation.protocol.exchange`), so the quorum, the timeout and the participation
record hold for secure sums as for every other exchange.

The protocol, the site side (masking, survivor signatures, unmasking) and the math (pairwise
and self masks, the fixed-point encoding) are :mod:`fedtab.privacy.secagg`; this module holds
only what the server runs: the key exchange, the masked round, the consistency round and the
unmasking, and the decoding of the sum.
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import numpy as np

from ...privacy import shamir
from ...privacy.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, IdentityError, fingerprint, public_key_from_der, \
    verify
from ...privacy.secagg import (_CT_BYTES, _HASHES, _ID, _KSIG, _MAX_SUBSETS, _PK, _SALT, _SEED, _SHARES, _SIG, _SIGS,
                               _SPK, _Y, FRAC_BITS, SECAGG_META, WEIGHT, _key_message, _prg, _self_mask,
                               _session_verify, _sign, _survivor_message, log)

if TYPE_CHECKING:  # pragma: no cover
    from fedtab.federation.protocol.messages import Message
    from .federation import Federation

__all__ = ["SecureAggregator", "SecureSum"]


@dataclass
class SecureSum:
    """What a secure exchange gives the server.

    Attributes:
        sums: ``{array name: summed array}`` (decoded floats), plus :data:`WEIGHT` when
            the exchange was weighted.
        replies: each survivor's reply without the masked arrays (its other contents).
        survivors: sites whose masked vector is in the sum; dropped: the other peers.
        late: survivors (in the sum) that did not sign or help unmask, with the reason.
        faults: sites whose hostile material was proven and left out (a share that does not
            match its dealer's commitment, a survivor-list signature that does not verify),
            with the reason; with a quorum they are dropped.
        unreadable: ``{dealer: [recipients]}`` -- shares its recipients could not decrypt or
            that did not match their commitment (a forged ciphertext, or one altered in
            transit: the recipient's word, so the dealer is named but not dropped).
    """

    sums: dict[str, np.ndarray]
    replies: dict[str, "Message"]
    survivors: list[str]
    dropped: list[str] = field(default_factory=list)
    late: dict[str, str] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)
    unreadable: dict[str, list[str]] = field(default_factory=dict)

    @property
    def weight(self) -> float | None:
        w = self.sums.get(WEIGHT)
        return None if w is None else float(w[0])


@dataclass(frozen=True)
class _PeerKeys:
    pk: bytes  # X25519 session key
    spk: bytes  # Ed25519 session signing key
    sig: bytes  # identity key's signature of both
    ident: bytes  # identity public key (DER)


class SecureAggregator:
    """Runs secure sums over a :class:`~fedtab.federation.protocol.Federation`.

    One aggregator is one session (one key exchange); each :meth:`ask` is one secure sum
    with a fresh label (a site answers each label once). Create one per workflow run.
    Every exchange follows the federation's quorum (:attr:`Federation.min_sites`): with a
    quorum, a site that fails, refuses, times out or sends a malformed reply before
    masking is dropped and named while ``min_sites`` remain; without one it raises,
    naming the site.

    Args:
        federation: the engine's federation.
        threshold: Shamir threshold ``t`` (default: a majority, ``n // 2 + 1`` of each
            sum's peers); the sum survives up to ``n - t`` sites dropping out after
            masking. Sites refuse a threshold that is not a strict majority.
        frac_bits: default fixed-point fractional bits of :meth:`ask`'s fields.
        key_list: ``{site: identity-key fingerprint}`` the server checks each site's
            identity key against at the key exchange (default: the federation's
            ``site_keys`` if it has them), so a site with a key outside the list is named
            there rather than refused by every honest peer later.

    Raises:
        FederationError: (at the key exchange) a site failed, naming it.
    """

    def __init__(self, federation: "Federation", *, threshold: int | None = None, frac_bits: int = FRAC_BITS,
                 key_list: Mapping[str, str] | None = None) -> None:
        self.federation = federation
        self.session = _secrets.token_hex(8)
        self.threshold = threshold
        self.frac_bits = int(frac_bits)
        listed = key_list if key_list is not None else getattr(federation, "site_keys", None)
        self.key_list = dict(listed) if listed else None
        self._keys: dict[str, _PeerKeys] | None = None
        self._count = 0

    @property
    def peers(self) -> list[str]:
        """The session's sites that are still taking part, sorted."""
        dropped = getattr(self.federation, "dropped", {})
        return [s for s in sorted(self._setup()) if s not in dropped]

    def _setup(self) -> dict[str, _PeerKeys]:
        from fedtab.federation.protocol.messages import Message
        from .errors import FederationError
        from .exchange import exchange

        if self._keys is None:
            keys: dict[str, _PeerKeys] = {}

            def check(site: str, reply: Message) -> None:
                pk, spk, sig, ident = (np.asarray(reply.arrays.get(k)) for k in ("pk", "spk", "sig", "id"))
                if any((a.dtype, a.shape) != (np.uint8, (width,)) for a, width in
                       ((pk, 32), (spk, 32), (sig, SIGNATURE_BYTES), (ident, PUBLIC_KEY_BYTES))):
                    raise ValueError("invalid secure-aggregation key reply (session keys, signature, identity key)")
                if self.key_list is not None:
                    try:
                        listed = fingerprint(public_key_from_der(ident.tobytes())) == self.key_list.get(site)
                    except IdentityError:
                        listed = False
                    if not listed:
                        raise ValueError("its identity key is not the one the consortium key list holds for it")
                if not verify(ident.tobytes(), sig.tobytes(),
                              _key_message(self.session, site, pk.tobytes(), spk.tobytes())):
                    raise ValueError("its session key's signature does not verify")
                keys[site] = _PeerKeys(pk.tobytes(), spk.tobytes(), sig.tobytes(), ident.tobytes())

            with _one_step(self.federation):
                good = exchange(self.federation, Message("secagg_keys", meta={"session": self.session}), check)
            keys = {s: keys[s] for s in good}
            owners: dict[bytes, str] = {}
            for site, k in keys.items():
                twin = next((owners[v] for v in (k.pk, k.spk, k.ident) if v in owners), None)
                if twin is not None:
                    raise FederationError(f"sites {twin!r} and {site!r} sent the same secure-aggregation key")
                owners.update({k.pk: site, k.spk: site, k.ident: site})
            self._keys = keys
        return self._keys

    def ask(
        self,
        requests: Mapping[str, "Message"],
        kind: str,
        fields: Mapping[str, int | None] | Sequence[str],
        *,
        weighted: Sequence[str] = (),
        weight: str | None = None,
        drop_meta: Sequence[str] = (),
        on_error: Literal["raise", "skip"] = "raise",
    ) -> SecureSum:
        """Send ``requests`` (one per peer) and securely sum the reply arrays ``fields``.

        Args:
            fields: array names (or ``{name: frac bits}``; ``None``/missing = the
                aggregator's ``frac_bits``; use 0 for integer counts).
            weighted / weight: the arrays in ``weighted`` are multiplied by the reply
                meta value ``weight`` before summing, and the weight is summed too.
            drop_meta: reply meta keys the sites must not send (per-site details that
                would defeat the sum, e.g. a per-site loss).
            on_error: ``"skip"`` tolerates sites that fail before masking for this sum
                (their pairwise masks are removed with the seeds the survivors reveal)
                even without a quorum; ``"raise"`` follows the federation's quorum.

        Raises:
            SiteError: a site failed or sent a malformed masked reply (wrong length,
                replayed label, bad shares) and no quorum lets the sum go on, naming it;
                a self-mask that cannot be rebuilt because its dealer's material is bad,
                naming the dealer.
            QuorumError: too few sites are left.
            FederationError: fewer than ``threshold`` survivors (or signers, or unmasking
                answers); sites dropping both before and after masking in one sum.
        """
        from fedtab.federation.protocol.messages import Message
        from .errors import FederationError
        from .exchange import exchange

        keys = self._setup()
        peers = sorted(requests)
        unknown = [s for s in peers if s not in keys]
        if unknown:
            raise ValueError(f"sites {unknown} are not in the secure-aggregation session")
        t = self.threshold or len(peers) // 2 + 1
        fracs = ({str(f): self.frac_bits for f in fields} if not isinstance(fields, Mapping)
                 else {str(f): self.frac_bits if b is None else int(b) for f, b in fields.items()})
        self._count += 1
        label = f"{kind}#{self._count}"
        spec = {"session": self.session, "label": label, "peers": peers, "threshold": t,
                "fields": [[f, b, f in set(weighted)] for f, b in fracs.items()],
                "weight": weight, "drop_meta": list(drop_meta)}
        key_arrays = {name: np.stack([np.frombuffer(getattr(keys[p], attr), dtype=np.uint8) for p in peers])
                      for name, attr in ((_PK, "pk"), (_SPK, "spk"), (_KSIG, "sig"), (_ID, "ident"))}
        out = {s: Message(r.kind, {**r.arrays, **key_arrays}, {**r.meta, SECAGG_META: spec})
               for s, r in requests.items()}
        check = _masked_check(label, len(peers), fracs, weight is not None)
        with _one_step(self.federation, kind) as step:
            good = exchange(self.federation, out, check, kind=kind, on_error="skip" if on_error == "skip" else None)
            masked, shapes = _agreed_shapes(good)
            self._reject({s: "its arrays have other shapes than the other sites' (expected "
                             f"{ {f: list(d) for f, d in shapes.items()} })" for s in good if s not in masked},
                         kind, on_error)
            survivors = sorted(masked)
            if len(survivors) < t:
                raise FederationError(f"{kind} (secure sum): only {len(survivors)} masked replies, threshold is {t}")
            step.sites = survivors
            result = self._unmask(label, kind, t, peers, masked, shapes, fracs, weight, on_error)
        if self.federation.min_sites is not None and on_error != "skip":  # late sites were dropped by their round
            for s, reason in result.faults.items():
                if s not in self.federation.dropped:
                    self.federation.drop(s, f"{kind} (secure sum): {reason}")
        return result

    def _reject(self, bad: Mapping[str, str], kind: str, on_error: str) -> None:
        """Leave out sites whose masked reply was rejected after it arrived: raise without a
        quorum, drop them (and check the quorum) with one, log them with ``"skip"``."""
        from .errors import SiteError, reject_text

        if not bad:
            return
        text = "; ".join(reject_text(s, e) for s, e in bad.items())
        if on_error == "skip":
            log.warning("%s (secure sum): leaving out %s", kind, text)
        elif self.federation.min_sites is None:
            raise SiteError(f"{kind} (secure sum): {text}", bad)
        else:
            for s, e in bad.items():
                self.federation.drop(s, e)

    def _round(self, requests: Mapping[str, "Message"], check: Callable[[str, "Message"], None],
               on_error: str) -> tuple[dict[str, "Message"], dict[str, str]]:
        """``(good, failed: {site: reason})`` of a round among sites already in the sum (the
        consistency or unmasking round), through :func:`~fedtab.federation.protocol.exchange`:
        with a quorum a failing site is dropped there, naming why; without one it is only
        left out (it costs nothing while ``t`` others answer)."""
        from .errors import QuorumError
        from .exchange import exchange

        reasons: dict[str, str] = {}

        def checked(site: str, reply: "Message") -> None:
            try:
                check(site, reply)
            except ValueError as exc:
                reasons[site] = str(exc)
                raise

        quorum = self.federation.min_sites is not None and on_error != "skip"
        try:
            good = exchange(self.federation, requests, checked, on_error=None if quorum else "skip")
        except QuorumError:
            if quorum:
                raise
            good = {}  # nobody answered: the caller reports the threshold
        dropped = getattr(self.federation, "dropped", {})
        return good, {s: reasons.get(s) or dropped.get(s) or "no valid answer (the warning above says why)"
                      for s in requests if s not in good}

    def _unmask(self, label: str, kind: str, t: int, peers: list[str], masked: dict[str, "Message"],
                shapes: dict[str, tuple[int, ...]], fracs: dict[str, int], weight: str | None,
                on_error: str) -> SecureSum:
        """The consistency round and the unmasking round of one sum; the decoded sum."""
        from fedtab.federation.protocol.messages import Message
        from .errors import FederationError

        survivors = sorted(masked)
        dropped = [p for p in peers if p not in masked]
        keys = self._keys or {}
        late: dict[str, str] = {}
        faults: dict[str, str] = {}

        message = _survivor_message(self.session, label, t, peers, survivors)

        def check_signature(site: str, reply: Message) -> None:
            sig = np.asarray(reply.arrays.get("sig"))
            if sig.dtype != np.uint8 or sig.shape != (_SIG,) or not _session_verify(keys[site].spk, sig.tobytes(),
                                                                                   message):
                faults[site] = "its signature on the survivor list does not verify"
                raise ValueError(faults[site])

        meta = {"session": self.session, "label": label, "survivors": survivors}
        signed, failed = self._round({s: Message("secagg_sign", meta=meta) for s in survivors}, check_signature,
                                     on_error)
        late.update({s: f"did not sign the survivor list: {e}" for s, e in failed.items() if s not in faults})
        signers = sorted(signed)
        if len(signers) < t:
            raise FederationError(f"{kind} (secure sum): {len(signers)} survivors signed the survivor list, "
                                  f"threshold is {t} ({_text(failed)})")
        sigs = np.stack([signed[s].arrays["sig"] for s in signers])
        unmask = {}
        for s in signers:
            cts = np.zeros((len(peers), _CT_BYTES), dtype=np.uint8)
            commits = np.zeros((len(peers), 32), dtype=np.uint8)
            for k in survivors:
                cts[peers.index(k)] = masked[k].arrays[_SHARES][peers.index(s)]
                commits[peers.index(k)] = masked[k].arrays[_HASHES][peers.index(s)]
            unmask[s] = Message("secagg_unmask", {_SIGS: sigs, _SHARES: cts, _HASHES: commits},
                                {**meta, "dropped": dropped, "signers": signers})
        answers, failed = self._round(unmask, _unmask_check(label, survivors, len(dropped)), on_error)
        late.update({s: f"did not help unmask: {e}" for s, e in failed.items()})
        if len(answers) < t:
            raise FederationError(f"{kind} (secure sum): {len(answers)} sites answered the unmasking, threshold is "
                                  f"{t} ({_text(failed)})")
        if dropped and len(answers) < len(survivors):
            missing = [s for s in survivors if s not in answers]
            raise FederationError(f"{kind} (secure sum): sites {missing} dropped after masking while {dropped} had "
                                  "dropped before; this sum cannot be recovered")
        length = len(masked[survivors[0]].arrays[_Y])
        total = np.zeros(length, dtype=np.uint64)
        for s in survivors:
            total += masked[s].arrays[_Y]
        seeds, unreadable_of = _self_mask_seeds(kind, t, peers, masked, answers, faults)
        for b in seeds.values():
            total -= _self_mask(b, length)
        for a, ans in answers.items():
            for k, d in enumerate(dropped):
                total -= np.uint64(_sign(a, d) % 2**64) * _prg(ans.arrays["seeds"][k].tobytes(), length)
        if faults:
            log.warning("%s (secure sum): hostile material left out: %s", kind, _text(faults))
        if unreadable_of:
            log.warning("%s (secure sum): shares that could not be read: %s", kind,
                        "; ".join(f"from site {d!r} by {r}" for d, r in unreadable_of.items()))
        if late:
            log.warning("%s (secure sum): in the sum but not answering: %s", kind, _text(late))
        return SecureSum(_decode(total, shapes, fracs, weight), _stripped(masked), survivors, dropped,
                         late, faults, unreadable_of)


class _one_step:
    """Context manager: the exchanges inside count as one entry of the federation's
    participation log (``step`` with the sites set on the returned object), or none."""

    def __init__(self, federation: "Federation", step: str | None = None) -> None:
        self.federation, self.step, self.sites = federation, step, None

    def __enter__(self) -> "_one_step":
        log_ = getattr(self.federation, "participation", None)
        self.start = len(log_) if isinstance(log_, list) else None
        return self

    def __exit__(self, *exc: Any) -> None:
        log_ = getattr(self.federation, "participation", None)
        if self.start is None or not isinstance(log_, list):
            return
        del log_[self.start:]
        if exc[0] is None and self.step is not None and self.sites is not None:
            log_.append({"step": self.step, "sites": list(self.sites)})


def _text(reasons: Mapping[str, str]) -> str:
    return "; ".join(f"site {s!r}: {e}" for s, e in reasons.items())


def _self_mask_seeds(kind: str, t: int, peers: list[str], masked: Mapping[str, "Message"],
                     answers: Mapping[str, "Message"],
                     faults: dict[str, str]) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    """Every survivor's self-mask seed from ``t`` of its shares that match their dealer's
    commitments; ``(seeds, unreadable: {dealer: recipients who could not read its share})``.
    A share that does not match names its holder in ``faults``.

    Raises:
        SiteError: a dealer whose valid shares do not rebuild its committed seed, or a seed
            left with fewer than ``t`` valid shares because of forgers or unreadable
            shares (naming them).
        FederationError: too few answers to rebuild a seed.
    """
    from .errors import FederationError, SiteError

    survivors = sorted(masked)
    seeds: dict[str, bytes] = {}
    unreadable_of: dict[str, list[str]] = {}
    for k, owner in enumerate(survivors):
        shares, unreadable = [], []
        for holder, ans in answers.items():
            if owner in ans.meta["unreadable"]:
                unreadable.append(holder)
                continue
            share, salt = ans.arrays["b_shares"][k].tobytes(), ans.arrays["b_salts"][k].tobytes()
            if hashlib.sha256(share + salt).digest() != masked[owner].arrays[_HASHES][peers.index(holder)].tobytes():
                faults[holder] = f"its share of site {owner!r}'s self-mask does not match {owner!r}'s commitment"
                continue
            shares.append((peers.index(holder) + 1, share))
        if unreadable:
            unreadable_of[owner] = unreadable
        b = _rebuild(shares, t, masked[owner].meta[SECAGG_META]["commit"])
        if b is None:
            if len(shares) >= t:
                why = "its self-mask shares do not match its commitment (inconsistent shares)"
                raise SiteError(f"{kind} (secure sum): site {owner!r}: {why}", {owner: why})
            culprits = {h: faults[h] for h in faults if h != owner and h in answers} or \
                ({owner: f"its encrypted shares could not be read by {unreadable} (forged or altered)"}
                 if unreadable else {})
            text = f"{kind} (secure sum): {len(shares)} valid shares of site {owner!r}'s self-mask, threshold is {t}"
            if not culprits:
                raise FederationError(f"{text} (too few answers)")
            raise SiteError(f"{text} ({_text(culprits)})", culprits)
        seeds[owner] = b
    return seeds, unreadable_of


def _masked_check(label: str, n: int, fracs: Mapping[str, int], weighted: bool) -> Callable[[str, "Message"], None]:
    """Validator of one masked reply (before anything is combined): this label, a commitment,
    shares and share commitments of the right shape, declared shapes of exactly the summed
    arrays and a masked vector of the length they give."""

    def check(site: str, reply: "Message") -> None:
        info, y = reply.meta.get(SECAGG_META), reply.arrays.get(_Y)
        cts, commits = reply.arrays.get(_SHARES), reply.arrays.get(_HASHES)
        if not isinstance(info, dict) or info.get("label") != label:
            raise ValueError("its masked reply is not for this exchange (replayed or stale)")
        shapes = _shapes(info)
        length = None if shapes is None or set(shapes) != set(fracs) else \
            sum(int(np.prod(shapes[f], dtype=np.int64)) for f in fracs) + weighted
        if length is None or y is None or y.dtype != np.uint64 or y.shape != (length,):
            raise ValueError(f"masked values of the wrong length or shape (expected {length} uint64)")
        if cts is None or cts.dtype != np.uint8 or cts.shape != (n, _CT_BYTES) or commits is None \
                or commits.dtype != np.uint8 or commits.shape != (n, 32):
            raise ValueError("malformed encrypted shares or share commitments")
        commit = info.get("commit")
        if not (isinstance(commit, str) and len(commit) == 64 and all(c in "0123456789abcdef" for c in commit)):
            raise ValueError("no commitment to its self-mask")

    return check


def _unmask_check(label: str, survivors: list[str], n_dropped: int) -> Callable[[str, "Message"], None]:
    def check(site: str, reply: "Message") -> None:
        unreadable = reply.meta.get("unreadable")
        if reply.meta.get("label") != label or not isinstance(unreadable, dict) \
                or not set(unreadable) <= set(survivors):
            raise ValueError("malformed unmask reply (label or unreadable shares)")
        for name, shape in (("b_shares", (len(survivors), _SEED)), ("b_salts", (len(survivors), _SALT)),
                            ("seeds", (n_dropped, 32))):
            a = reply.arrays.get(name)
            if a is None or a.dtype != np.uint8 or a.shape != shape:
                raise ValueError(f"malformed unmask reply: {name} must be {shape} uint8")

    return check


def _shapes(info: Mapping[str, Any]) -> dict[str, tuple[int, ...]] | None:
    shapes = info.get("shapes")
    if not isinstance(shapes, dict):
        return None
    try:
        out = {str(k): tuple(int(d) for d in v) for k, v in shapes.items()}
    except (TypeError, ValueError):
        return None
    return out if all(all(0 <= d < 2**31 for d in v) and len(v) <= 8 for v in out.values()) else None


def _agreed_shapes(good: Mapping[str, "Message"]) -> tuple[dict[str, "Message"], dict[str, tuple[int, ...]]]:
    """The replies whose declared array shapes are the most common ones, and those shapes."""
    seen = {s: _shapes(r.meta[SECAGG_META]) for s, r in good.items()}
    keyed = {s: tuple(sorted(v.items())) for s, v in seen.items() if v is not None}
    usual = Counter(keyed.values()).most_common(1)
    if not usual:
        return {}, {}
    return {s: good[s] for s, k in keyed.items() if k == usual[0][0]}, dict(usual[0][0])


def _decode(total: np.ndarray, shapes: Mapping[str, tuple[int, ...]], fracs: Mapping[str, int],
            weight: str | None) -> dict[str, np.ndarray]:
    signed = total.view(np.int64).astype(np.float64)
    sums, offset = {}, 0
    for f, b in fracs.items():
        size = int(np.prod(shapes[f], dtype=np.int64))
        sums[f] = (signed[offset:offset + size] / 2.0**b).reshape(shapes[f])
        offset += size
    if weight is not None:
        sums[WEIGHT] = signed[offset:offset + 1] / 2.0**FRAC_BITS
    return sums


def _stripped(masked: Mapping[str, "Message"]) -> dict[str, "Message"]:
    from fedtab.federation.protocol.messages import Message

    hidden = (_Y, _SHARES, _HASHES)
    return {s: Message(r.kind, {k: v for k, v in r.arrays.items() if k not in hidden},
                       {k: v for k, v in r.meta.items() if k != SECAGG_META}) for s, r in masked.items()}


def _rebuild(shares: list[tuple[int, bytes]], t: int, commit: str) -> bytes | None:
    """The self-mask seed from ``t`` of the (individually verified) ``shares`` whose result
    matches its commitment, trying other ``t``-subsets if the dealer's shares are
    inconsistent; ``None`` if too few shares or none matches."""
    for n_tried, subset in enumerate(combinations(shares, t)):
        if n_tried >= _MAX_SUBSETS:
            break
        b = shamir.combine(list(subset))
        if hashlib.sha256(b).hexdigest() == commit:
            return b
    return None
