"""Secure aggregation: the server learns the sum of the sites' vectors, not one site's.

SecAgg (Bonawitz et al., CCS 2017) in fedtab's exchanges, so it runs unchanged on every
engine (the engines only move :class:`~fedtab.federation.messages.Message` s):

1. ``"secagg_keys"`` (once per :class:`SecureAggregator`) — every site makes an X25519
   key pair for this session and sends the public key.
2. The workflow's own request (``"fit"``, ``"describe"`` ...) carries ``meta["secagg"]``
   (session, a fresh label, the peers, the threshold, which reply arrays are summed)
   and the peers' public keys. The site runs its handler as usual, then
   :func:`mask_reply` replaces the summed arrays by one ``uint64`` vector
   ``y_i = enc(x_i) + PRG(b_i) + Σ_{j>i} PRG(s_ij) - Σ_{j<i} PRG(s_ij)  (mod 2**64)``:
   ``enc`` is fixed-point (``round(x * 2**frac)``, per array), ``s_ij`` a seed both
   sites derive from their X25519 shared secret and the label (HKDF-SHA256), PRG a
   ChaCha20 keystream, ``b_i`` a fresh random self-mask seed. The site also sends
   Shamir shares of ``b_i`` (threshold ``t``), each encrypted for its recipient with
   AES-GCM under a key derived from their shared secret, and a SHA-256 commitment to
   ``b_i``. Pairwise masks cancel in the sum.
3. ``"secagg_unmask"`` — the server tells the sites whose masked vector arrived
   (survivors ``S``) and routes each its encrypted shares. Each survivor returns its
   shares of ``b_k`` for every ``k`` in ``S`` and, for each peer ``j`` not in ``S``
   (dropped before masking), the pairwise seed ``s_ij``. With ``t`` answers the server
   rebuilds every ``b_k`` (checked against its commitment, so forged shares are found
   and named), removes the self-masks and the masks shared with dropped sites, and
   decodes the sum. A survivor that drops *after* masking costs nothing as long as
   ``t`` survivors answer.

What the server sees of one site: uniformly random ``uint64`` vectors, encrypted shares,
a hash of a random seed. A site never reveals, for the same label, both a share of
``b_k`` and its seed with ``k``. Limits (documented in ``docs/privacy.md``):
honest-but-curious server (a server that tells different sites different survivor sets
is not detected — SecAgg's signature round is not implemented); a site that drops
before masking *and* another that drops after it in the same sum make that sum fail;
sites can corrupt (not read) the sum, so robust reducers cannot be combined with it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets as _secrets
from collections import Counter
from itertools import combinations
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import shamir

if TYPE_CHECKING:  # pragma: no cover
    from ..federation.messages import Message
    from ..federation.protocol import Federation
    from ..federation.site import Site

__all__ = ["SecureAggregator", "SecureSum", "mask_reply", "SECAGG_META", "FRAC_BITS", "MOMENT_BITS", "WEIGHT"]

#: request/reply meta key that carries the secure-aggregation spec.
SECAGG_META = "secagg"
log = logging.getLogger("fedtab.privacy")

#: default fractional bits of the fixed-point encoding (resolution 2**-24 ≈ 6e-8).
FRAC_BITS = 24
#: fractional bits for sums of raw data moments (sums of squares need range: ~7e13 / sites).
MOMENT_BITS = 16
#: name of the summed weight in :attr:`SecureSum.sums` when a reply is weighted.
WEIGHT = "__weight__"

_PK = "secagg:pk"
_Y = "secagg:y"
_SHARES = "secagg:shares"
_NONCE = 12
_CT_BYTES = _NONCE + shamir.SHARE_BYTES + 16  # nonce + share + GCM tag
_STATE = "secagg"
_RANGE_BITS = 62  # |sum of encoded values| stays below 2**62 (room for the sign in int64)


# ------------------------------------------------------------------ primitives
def _hkdf(secret: bytes, info: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info.encode()).derive(secret)


def _prg(seed: bytes, n: int) -> np.ndarray:
    """``n`` pseudo-random uint64 from a 32-byte seed (ChaCha20 keystream)."""
    enc = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(b"\0" * (8 * n)), dtype="<u8").copy()


def _shared(sk_hex: str, pk: bytes) -> bytes:
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(sk_hex))
    return private.exchange(X25519PublicKey.from_public_bytes(pk))


def _pair_seed(shared: bytes, session: str, label: str) -> bytes:
    return _hkdf(shared, f"fedtab-secagg/mask/{session}/{label}")


def _share_key(shared: bytes, session: str, label: str) -> bytes:
    return _hkdf(shared, f"fedtab-secagg/share/{session}/{label}")


def _aad(session: str, label: str, sender: str, recipient: str) -> bytes:
    return f"{session}|{label}|{sender}|{recipient}".encode()


def _encode(values: np.ndarray, frac: int, n_peers: int, name: str) -> np.ndarray:
    scaled = np.asarray(values, dtype=np.float64) * float(2**frac)
    if not np.isfinite(scaled).all():
        raise ValueError(f"secure aggregation: array {name!r} is not finite")
    limit = 2.0 ** _RANGE_BITS / max(n_peers, 1)
    if np.abs(scaled).max(initial=0.0) >= limit:
        raise ValueError(f"secure aggregation: array {name!r} exceeds the fixed-point range "
                         f"(|x| < {limit / 2**frac:.3g} with {frac} fractional bits)")
    return np.round(scaled).astype(np.int64).view(np.uint64)


def _sign(me: str, other: str) -> int:
    return 1 if me < other else -1


# ------------------------------------------------------------------ site side
def _session_state(site: "Site", session: str) -> dict[str, Any]:
    sessions = site.state.get(_STATE) or {}
    st = sessions.get(session)
    if st is None:
        raise ValueError(f"secure aggregation session {session!r} was not set up at this site")
    return st


def new_session(site: "Site", session: str) -> bytes:
    """Site side of ``"secagg_keys"``: a fresh X25519 key pair; returns the public key.

    Raises:
        ValueError: the session already exists here (a replayed key request).
    """
    sessions = site.state.setdefault(_STATE, {})
    if session in sessions:
        raise ValueError(f"secure aggregation session {session!r} already exists at this site (replayed request)")
    private = X25519PrivateKey.generate()
    raw = private.private_bytes_raw()
    sessions[session] = {"sk": raw.hex(), "labels": {}}
    return private.public_key().public_bytes_raw()


def _spec(meta: Mapping[str, Any]) -> dict[str, Any]:
    spec = meta.get(SECAGG_META)
    if not isinstance(spec, dict):
        raise ValueError("secure aggregation spec must be a JSON object")
    for key, kind in (("session", str), ("label", str), ("peers", list), ("threshold", int), ("fields", list)):
        if not isinstance(spec.get(key), kind):
            raise ValueError(f"secure aggregation spec lacks a valid {key!r}")
    return spec


def _check_threshold(t: int, n: int) -> None:
    """The site's own rule: ``t`` must be a majority of the peers (and at most ``n``)."""
    if not (n // 2 + 1 <= t <= n):
        raise ValueError(f"secure aggregation threshold {t} is not a majority of {n} peers")


def mask_reply(site: "Site", request: "Message", reply: "Message") -> "Message":
    """Replace the summed arrays of ``reply`` by this site's masked vector (step 2 above).

    ``request.meta["secagg"]``: ``session``, ``label``, ``peers`` (site names, sorted),
    ``threshold``, ``fields`` (``[[array name, frac bits, weighted], ...]``), optional
    ``weight`` (a reply meta key: weighted arrays are multiplied by it, and it is summed
    as :data:`WEIGHT`) and ``drop_meta`` (reply meta keys not to send).
    ``request.arrays["secagg:pk"]``: ``(len(peers), 32)`` public keys in peer order.

    Raises:
        ValueError: unknown session, replayed label, this site not among the peers, a
            threshold that is not a majority, missing arrays, values out of range.
    """
    from ..federation.messages import Message

    spec = _spec(request.meta)
    session, label, peers = spec["session"], spec["label"], [str(p) for p in spec["peers"]]
    st = _session_state(site, session)
    if label in st["labels"]:
        raise ValueError(f"secure aggregation label {label!r} was already answered (replayed request)")
    if site.name not in peers or len(set(peers)) != len(peers) or peers != sorted(peers):
        raise ValueError("secure aggregation peers must be distinct, sorted and include this site")
    t = int(spec["threshold"])
    _check_threshold(t, len(peers))
    pks = np.asarray(request.arrays.get(_PK))
    if pks.dtype != np.uint8 or pks.shape != (len(peers), 32):
        raise ValueError(f"secure aggregation needs {len(peers)} public keys of 32 bytes")

    arrays, meta = dict(reply.arrays), dict(reply.meta)
    weight = 1.0
    if spec.get("weight") is not None:
        weight = float(meta.pop(str(spec["weight"])))
    for key in spec.get("drop_meta") or []:
        meta.pop(str(key), None)
    parts, shapes = [], {}
    for name, frac, weighted in spec["fields"]:
        if name not in arrays:
            raise ValueError(f"secure aggregation: the reply has no array {name!r}")
        value = np.asarray(arrays.pop(name), dtype=np.float64)
        shapes[name] = list(value.shape)
        parts.append(_encode(value * (weight if weighted else 1.0), int(frac), len(peers), name).ravel())
    if spec.get("weight") is not None:
        parts.append(_encode(np.array([weight]), FRAC_BITS, len(peers), WEIGHT))
    y = np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    b = os.urandom(32)
    y = y + _prg(b, len(y))
    me = peers.index(site.name)
    shares = shamir.split(b, len(peers), t)
    cts = np.zeros((len(peers), _CT_BYTES), dtype=np.uint8)
    for j, peer in enumerate(peers):
        if j == me:
            continue
        shared = _shared(st["sk"], bytes(pks[j]))
        y = y + np.uint64(_sign(site.name, peer) % 2**64) * _prg(_pair_seed(shared, session, label), len(y))
        nonce = os.urandom(_NONCE)
        ct = AESGCM(_share_key(shared, session, label)).encrypt(
            nonce, shamir.share_to_bytes(shares[j][1]), _aad(session, label, site.name, peer))
        cts[j] = np.frombuffer(nonce + ct, dtype=np.uint8)
    st["labels"][label] = {"peers": peers, "t": t, "pks": [bytes(p).hex() for p in pks],
                           "own": shamir.share_to_bytes(shares[me][1]).hex(), "unmasked": False}
    arrays[_Y] = y
    arrays[_SHARES] = cts
    meta[SECAGG_META] = {"label": label, "shapes": shapes, "commit": hashlib.sha256(b).hexdigest()}
    return Message(reply.kind, arrays, meta)


def unmask_reply(site: "Site", request: "Message") -> "Message":
    """Site side of ``"secagg_unmask"`` (step 3): shares of the survivors' self-masks,
    seeds shared with dropped peers.

    Raises:
        ValueError: unknown label, second unmask of a label, survivors and dropped not a
            partition of the peers, this site not a survivor, fewer survivors than the
            threshold, a share that does not authenticate (naming its sender).
    """
    from ..federation.messages import Message

    meta = request.meta
    session, label = str(meta.get("session")), str(meta.get("label"))
    st = _session_state(site, session)
    lab = st["labels"].get(label)
    if lab is None:
        raise ValueError(f"this site did not mask {label!r}; nothing to unmask")
    if lab["unmasked"]:
        raise ValueError(f"{label!r} was already unmasked (replayed request)")
    peers = lab["peers"]
    survivors, dropped = list(meta.get("survivors") or []), list(meta.get("dropped") or [])
    if sorted(survivors + dropped) != peers or site.name not in survivors:
        raise ValueError("survivors and dropped sites must split the peers, with this site a survivor")
    if len(survivors) < lab["t"]:
        raise ValueError(f"{len(survivors)} survivors are fewer than the threshold {lab['t']}")
    cts = np.asarray(request.arrays.get(_SHARES))
    if cts.dtype != np.uint8 or cts.shape != (len(peers), _CT_BYTES):
        raise ValueError(f"unmask needs ({len(peers)}, {_CT_BYTES}) uint8 shares")
    lab["unmasked"] = True  # from here on, never answer this label again
    b_shares = np.zeros((len(survivors), shamir.SHARE_BYTES), dtype=np.uint8)
    for k, sender in enumerate(survivors):
        if sender == site.name:
            raw = bytes.fromhex(lab["own"])
        else:
            j = peers.index(sender)
            blob = bytes(cts[j])
            shared = _shared(st["sk"], bytes.fromhex(lab["pks"][j]))
            try:
                raw = AESGCM(_share_key(shared, session, label)).decrypt(
                    blob[:_NONCE], blob[_NONCE:], _aad(session, label, sender, site.name))
            except InvalidTag:
                raise ValueError(f"the share from site {sender!r} does not authenticate (forged or altered)") from None
        b_shares[k] = np.frombuffer(raw, dtype=np.uint8)
    seeds = np.zeros((len(dropped), 32), dtype=np.uint8)
    for k, peer in enumerate(dropped):
        shared = _shared(st["sk"], bytes.fromhex(lab["pks"][peers.index(peer)]))
        seeds[k] = np.frombuffer(_pair_seed(shared, session, label), dtype=np.uint8)
    return Message("secagg_unmask", {"b_shares": b_shares, "seeds": seeds}, {"label": label})


# ------------------------------------------------------------------ server side
@dataclass
class SecureSum:
    """What a secure exchange gives the server.

    Attributes:
        sums: ``{array name: summed array}`` (decoded floats), plus :data:`WEIGHT` when
            the exchange was weighted.
        replies: each survivor's reply without the masked arrays (its other contents).
        survivors: sites whose masked vector is in the sum; dropped: the other peers.
    """

    sums: dict[str, np.ndarray]
    replies: dict[str, "Message"]
    survivors: list[str]
    dropped: list[str] = field(default_factory=list)
    #: survivors that did not answer the unmasking (their values are in the sum)
    late: list[str] = field(default_factory=list)

    @property
    def weight(self) -> float | None:
        w = self.sums.get(WEIGHT)
        return None if w is None else float(w[0])


class SecureAggregator:
    """Runs secure sums over a :class:`~fedtab.federation.protocol.Federation`.

    One aggregator is one session (one key exchange); each :meth:`ask` is one secure sum
    with a fresh label (a site answers each label once). Create one per workflow run.

    Args:
        federation: the engine's federation.
        threshold: Shamir threshold ``t`` (default: a majority, ``n // 2 + 1``); the sum
            survives up to ``n - t`` sites dropping out after masking.
        frac_bits: default fixed-point fractional bits of :meth:`ask`'s fields.

    Raises:
        FederationError: (at the key exchange) a site failed, naming it.
    """

    def __init__(self, federation: "Federation", *, threshold: int | None = None, frac_bits: int = FRAC_BITS) -> None:
        self.federation = federation
        self.session = _secrets.token_hex(8)
        self.threshold = threshold
        self.frac_bits = int(frac_bits)
        self._keys: dict[str, bytes] | None = None
        self._count = 0

    @property
    def peers(self) -> list[str]:
        return sorted(self._setup())

    def _setup(self) -> dict[str, bytes]:
        from ..federation.messages import Message
        from ..federation.protocol import FederationError, collect

        if self._keys is None:
            replies = collect(self.federation.broadcast(Message("secagg_keys", meta={"session": self.session})),
                              "secagg_keys")
            keys = {}
            for name, reply in replies.items():
                pk = np.asarray(reply.arrays.get("pk"))
                if pk.dtype != np.uint8 or pk.shape != (32,):
                    raise FederationError(f"site {name!r}: invalid secure-aggregation public key")
                keys[name] = pk.tobytes()
            if len(set(keys.values())) != len(keys):
                raise FederationError("two sites sent the same secure-aggregation public key")
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
            on_error: ``"skip"`` tolerates sites that fail before masking (their pairwise
                masks are removed with the seeds the survivors reveal).

        Raises:
            FederationError: a site failed (with ``"raise"``); a masked reply is malformed
                (wrong length, replayed label, bad shares), naming the site; fewer than
                ``threshold`` survivors; a self-mask that cannot be rebuilt (forged
                shares, naming the site(s) whose shares disagree).
        """
        from ..federation.messages import Message
        from ..federation.protocol import FederationError, collect

        keys = self._setup()
        peers = sorted(keys)
        unknown = sorted(set(requests) - set(peers))
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
        pk = np.stack([np.frombuffer(keys[p], dtype=np.uint8) for p in peers])
        out = {s: Message(r.kind, {**r.arrays, _PK: pk}, {**r.meta, SECAGG_META: spec}) for s, r in requests.items()}
        good = collect(self.federation.ask(out), kind, on_error)

        masked, commits, bad = {}, {}, {}
        shapes_seen = {s: _shapes_key(r) for s, r in good.items()}
        usual = Counter(v for v in shapes_seen.values() if v is not None).most_common(1)
        expected = usual[0][0] if usual else None
        shapes = dict(expected) if expected is not None else None
        length = (sum(int(np.prod(shapes[f], dtype=np.int64)) for f in fracs) + (weight is not None)) if shapes else 0
        for s, r in good.items():
            info, y, cts = r.meta.get(SECAGG_META), r.arrays.get(_Y), r.arrays.get(_SHARES)
            if not isinstance(info, dict) or info.get("label") != label:
                bad[s] = "its masked reply is not for this exchange (replayed or stale)"
            elif (expected is None or shapes_seen[s] != expected or y is None or y.dtype != np.uint64
                  or y.shape != (length,)):
                bad[s] = f"masked values of the wrong length or shape (expected {length} uint64)"
            elif cts is None or cts.dtype != np.uint8 or cts.shape != (len(peers), _CT_BYTES):
                bad[s] = "malformed encrypted shares"
            elif not (isinstance(info.get("commit"), str) and len(info["commit"]) == 64):
                bad[s] = "no commitment to its self-mask"
            else:
                masked[s] = r
                commits[s] = info["commit"]
        if bad:
            text = "; ".join(f"site {s!r}: {e}" for s, e in bad.items())
            if on_error == "raise":
                raise FederationError(f"{kind} (secure sum): {text}")
        survivors = sorted(masked)
        if len(survivors) < t:
            raise FederationError(f"{kind} (secure sum): only {len(survivors)} masked replies, threshold is {t}")
        dropped = [p for p in peers if p not in masked]

        # unmasking round
        unmask = {}
        for s in survivors:
            cts = np.zeros((len(peers), _CT_BYTES), dtype=np.uint8)
            for k in survivors:
                cts[peers.index(k)] = masked[k].arrays[_SHARES][peers.index(s)]
            unmask[s] = Message("secagg_unmask", {_SHARES: cts},
                                {"session": self.session, "label": label, "survivors": survivors, "dropped": dropped})
        answers = collect(self.federation.ask(unmask), "secagg_unmask", "skip")
        answers = {s: a for s, a in answers.items() if a.meta.get("label") == label
                   and _arr_ok(a, "b_shares", (len(survivors), shamir.SHARE_BYTES))
                   and _arr_ok(a, "seeds", (len(dropped), 32))}
        if len(answers) < t:
            raise FederationError(f"{kind} (secure sum): {len(answers)} sites answered the unmasking, threshold is {t}")
        missing = [s for s in survivors if s not in answers]
        if dropped and missing:
            raise FederationError(f"{kind} (secure sum): sites {missing} dropped after masking while {dropped} had "
                                  "dropped before; this sum cannot be recovered")

        total = np.zeros(length, dtype=np.uint64)
        for s in survivors:
            total += masked[s].arrays[_Y]
        for k, s in enumerate(survivors):
            shares = [(peers.index(a) + 1, shamir.share_from_bytes(ans.arrays["b_shares"][k].tobytes()))
                      for a, ans in answers.items()]
            b = _rebuild(shares, t, commits[s], s, [a for a in answers])
            total -= _prg(b, length)
        for a, ans in answers.items():
            for k, d in enumerate(dropped):
                total -= np.uint64(_sign(a, d) % 2**64) * _prg(ans.arrays["seeds"][k].tobytes(), length)
        signed = total.view(np.int64).astype(np.float64)
        sums, offset = {}, 0
        for f, b in fracs.items():
            size = int(np.prod(shapes[f], dtype=np.int64))
            sums[f] = (signed[offset:offset + size] / 2.0**b).reshape(shapes[f])
            offset += size
        if weight is not None:
            sums[WEIGHT] = signed[offset:offset + 1] / 2.0**FRAC_BITS
        stripped = {s: Message(r.kind, {k: v for k, v in r.arrays.items() if k not in (_Y, _SHARES)},
                               {k: v for k, v in r.meta.items() if k != SECAGG_META}) for s, r in masked.items()}
        participation = getattr(self.federation, "participation", None)
        if isinstance(participation, list):  # who is in this sum, as for every other exchange
            participation.append({"step": kind, "sites": list(survivors)})
        return SecureSum(sums, stripped, survivors, dropped, missing)


def _shapes_key(reply: "Message") -> tuple | None:
    info = reply.meta.get(SECAGG_META)
    shapes = info.get("shapes") if isinstance(info, dict) else None
    if not isinstance(shapes, dict):
        return None
    try:
        return tuple((str(k), tuple(int(d) for d in v)) for k, v in shapes.items())
    except (TypeError, ValueError):
        return None


def _arr_ok(msg: "Message", name: str, shape: tuple[int, ...]) -> bool:
    a = msg.arrays.get(name)
    return a is not None and a.dtype == np.uint8 and a.shape == shape


def _rebuild(shares: list[tuple[int, int]], t: int, commit: str, owner: str, holders: list[str]) -> bytes:
    """The self-mask seed of ``owner`` from ``shares`` (x = holder index + 1), checked
    against its commitment; tries other ``t``-subsets when a share is forged.

    Raises:
        FederationError: no ``t``-subset matches the commitment (naming the holders).
    """
    from ..federation.protocol import FederationError

    for n_tried, subset in enumerate(combinations(range(len(shares)), t)):
        b = shamir.combine([shares[i] for i in subset])
        if hashlib.sha256(b).hexdigest() == commit:
            if n_tried:
                good = {holders[i] for i in subset}
                suspects = [h for i, h in enumerate(holders) if h not in good
                            and shamir.combine([shares[j] for j in list(subset)[:-1]] + [shares[i]]) != b]
                log.warning("secure sum: shares of %r from %s do not match its commitment (forged?)", owner, suspects)
            return b
        if n_tried > 200:
            break
    raise FederationError(f"secure sum: the shares of site {owner!r}'s self-mask do not match its commitment "
                          f"(forged shares among {holders})")
