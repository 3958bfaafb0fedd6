"""Secure aggregation the site can verify: the server learns the sum of the sites' vectors, not one site's.

SecAgg (Bonawitz et al., CCS 2017) in fedtab's exchanges, so it runs unchanged on every
engine (the engines only move :class:`~fedtab.federation.protocol.messages.Message` s). Every site
holds an identity key and the consortium's key list from its own configuration
(:mod:`fedtab.privacy.identity`); the server relays keys and signatures but cannot make
them up.

1. ``"secagg_keys"`` (once per :class:`~fedtab.federation.protocol.secure_aggregator.SecureAggregator`, the server side) -- every site makes an X25519
   key pair and an Ed25519 signing key for this session and returns both public keys, its
   identity key's signature of (session, site, both keys) and its public identity key. A
   site without a verified key list refuses.
2. The workflow's own request (``"fit"``, ``"describe"`` ...) carries ``meta["secagg"]``
   (session, a fresh label, the peers, the threshold ``t``, which reply arrays are
   summed) and every peer's session keys, signature and identity key. Before its handler
   runs, the site **refuses** unless every peer's identity key is the one its key list
   holds for that name and signed that peer's session keys (naming the peer that fails),
   its own session keys are unchanged, the peers number at least the policy's
   ``min_peers`` (default 3, the site included) and ``t`` is a strict majority of them
   and at least 2. Then :func:`mask_reply` replaces the summed arrays by one ``uint64``
   vector ``y_i = enc(x_i) + PRG(b_i) + Σ_{j>i} PRG(s_ij) - Σ_{j<i} PRG(s_ij)  (mod 2**64)``:
   ``enc`` is fixed-point (``round(x * 2**frac)``, per array), ``s_ij`` a seed both sites
   derive from their X25519 shared secret and the label (HKDF-SHA256), PRG a ChaCha20
   keystream, ``b_i`` a fresh random 128-bit self-mask seed (its ChaCha20 key is derived
   with HKDF; one 16-byte Shamir chunk). The site also sends Shamir shares of
   ``b_i`` (threshold ``t``; :mod:`fedtab.privacy.shamir`), each with a random salt and
   encrypted for its recipient with AES-GCM under a key derived from their shared secret,
   a SHA-256 commitment to each (share, salt) and a SHA-256 commitment to ``b_i``.
   Pairwise masks cancel in the sum.
3. ``"secagg_sign"`` (the consistency round) -- the server sends the survivors ``U`` (the
   sites whose masked vector arrived) to each survivor; each signs (session, label, ``t``,
   peers, ``U``) once per label with its session signing key (certified by its identity
   key in step 1, so a survivor list costs an Ed25519 signature, not a P-384 one) and
   returns the signature.
4. ``"secagg_unmask"`` -- the server sends each signer ``U``, the signatures and its
   encrypted shares. A survivor answers only if ``U`` is the list it signed and it holds
   at least ``t`` valid signatures from members of ``U`` on that same list: a server that
   tells one site that a peer dropped and the others that it survived cannot collect
   ``t`` signatures on both lists (``t`` is a majority), so it is refused. The survivor
   returns its shares of ``b_k`` (with their salts) for every ``k`` in ``U`` and, for each
   peer ``j`` not in ``U``, the pairwise seed ``s_ij``. A share that does not decrypt or
   does not match its commitment is left out and its sender named (``unreadable``). The
   server checks every returned share against its dealer's commitment (a forged share
   names its holder), rebuilds every ``b_k`` from ``t`` valid shares (checked against its
   commitment: inconsistent shares name their dealer), removes the self-masks and the
   masks shared with dropped sites, and decodes the sum. A survivor that drops *after*
   masking costs nothing as long as ``t`` survivors answer.

What the server sees of one site: uniformly random ``uint64`` vectors, encrypted shares,
hashes of random values, signatures. A site never reveals, for the same label, both a
share of ``b_k`` and its seed with ``k``. Limits (documented in ``docs/privacy.md``): the
server still chooses the peer set and may truthfully report dropouts, so a quantity asked
twice over peer sets that differ by one site reveals that site's value (the site's release
ledger, not secure aggregation, must bound repeated releases); a site that drops before
masking *and* another that drops after it in the same sum make that sum fail; sites can
corrupt (not read) the sum, so robust reducers cannot be combined with it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import shamir
from .identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, IdentityError, signed_message, verify

if TYPE_CHECKING:  # pragma: no cover
    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.site.core import Site

__all__ = ["mask_reply", "unmask_reply", "sign_survivors", "new_session", "refused", "masking_refusal", "masked_fields",
           "left_in_clear", "SECAGG_META", "FRAC_BITS", "MOMENT_BITS", "WEIGHT"]

#: request/reply meta key that carries the secure-aggregation spec.
SECAGG_META = "secagg"
log = logging.getLogger("fedtab.privacy")

#: default fractional bits of the fixed-point encoding (resolution 2**-24 ≈ 6e-8).
FRAC_BITS = 24
#: fractional bits for sums of raw data moments (sums of squares need range: ~7e13 / sites).
MOMENT_BITS = 16
#: name of the summed weight in :attr:`~fedtab.federation.protocol.secure_aggregator.SecureSum.sums` when a reply is weighted.
WEIGHT = "__weight__"

_PK, _SPK, _KSIG, _ID = "secagg:pk", "secagg:spk", "secagg:ksig", "secagg:id"
_Y, _SHARES, _HASHES, _SIGS = "secagg:y", "secagg:shares", "secagg:share_hashes", "secagg:sigs"
_SEED = 16  # bytes of a self-mask seed: one Shamir chunk; the mask's ChaCha20 key is derived from it
_NONCE, _SALT, _TAG = 12, 16, 16
_CT_BYTES = _NONCE + _SEED + _SALT + _TAG  # nonce + (share + salt) + GCM tag
_STATE = "secagg"
_RANGE_BITS = 62  # |sum of encoded values| stays below 2**62 (room for the sign in int64)
_MAX_SUBSETS = 50
_SIG = 64  # an Ed25519 signature (survivor lists)


class _Refused(ValueError):
    """A request this site will not answer (a refusal, not an error: nothing is revealed)."""


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


def _self_mask(seed: bytes, n: int) -> np.ndarray:
    """The self-mask of ``n`` words from a 16-byte seed (ChaCha20 under an HKDF-derived key)."""
    return _prg(_hkdf(seed, "fedtab-secagg/self-mask"), n)


def _pair_seed(shared: bytes, session: str, label: str) -> bytes:
    return _hkdf(shared, f"fedtab-secagg/mask/{session}/{label}")


def _share_key(shared: bytes, session: str, label: str) -> bytes:
    return _hkdf(shared, f"fedtab-secagg/share/{session}/{label}")


def _aad(session: str, label: str, sender: str, recipient: str) -> bytes:
    return f"{session}|{label}|{sender}|{recipient}".encode()


def _key_message(session: str, site: str, pk: bytes, spk: bytes) -> bytes:
    """What a site's identity key signs about its session keys (X25519 and Ed25519)."""
    return signed_message("key", session, site, pk, spk)


def _session_sign(ssk_hex: str, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(ssk_hex)).sign(message)


def _session_verify(spk: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the session signing key ``spk``'s signature of ``message`` (never raises)."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes(spk)).verify(bytes(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _survivor_message(session: str, label: str, t: int, peers: Sequence[str], survivors: Sequence[str]) -> bytes:
    """What a survivor signs in the consistency round: the sum (session, label, threshold,
    peers) and the survivor list it was told."""
    return signed_message("survivors", session, label, str(t), str(len(peers)), *peers, *survivors)


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


def _names(value: Any) -> list[str] | None:
    """``value`` as a sorted list of distinct site names, or ``None`` if it is not one."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value if value == sorted(set(value)) else None


def masked_fields(meta: Mapping[str, Any]) -> frozenset[str]:
    """The reply arrays a secure-aggregation request (``meta["secagg"]``) asks to mask: the
    names of its ``fields`` (empty when there is no spec or it is malformed; such a request is
    refused by :func:`masking_refusal` anyway)."""
    spec = meta.get(SECAGG_META)
    fields = spec.get("fields") if isinstance(spec, dict) else None
    if not isinstance(fields, list):
        return frozenset()
    return frozenset(f[0] for f in fields if isinstance(f, list) and f and isinstance(f[0], str))


def left_in_clear(masked: frozenset[str], arrays: Mapping[str, Any], summable: Callable[[str], bool]) -> list[str]:
    """The arrays of a reply that its kind declares summable (``summable(name)``, see
    ``fedtab.federation.protocol.kinds.MessageKind.summable``) but that are not among the ``masked``
    fields, sorted. Masking is the site's decision: a secure-aggregation request that leaves
    one of them out is refused, never answered with that array in the clear."""
    return sorted(name for name in arrays if name not in masked and summable(name))


# ------------------------------------------------------------------ site side
def identity_problem(site: "Site") -> str | None:
    """Why ``site`` cannot take part in secure aggregation (no identity, no verified key
    list), or ``None``."""
    identity = getattr(site, "identity", None)
    if identity is None:
        return ("this site has no identity key and verified consortium key list (site config identity-key, "
                "consortium-keys, root-certificates)")
    problem = identity.problem
    return None if problem is None else f"this site's consortium key list is not usable: {problem}"


def _session_state(site: "Site", session: Any) -> dict[str, Any]:
    sessions = site.state.get(_STATE) or {}
    st = sessions.get(session) if isinstance(session, str) else None
    if st is None:
        raise _Refused(f"secure aggregation session {str(session)[:80]!r} was not set up at this site")
    return st


def new_session(site: "Site", session: str) -> dict[str, np.ndarray]:
    """Site side of ``"secagg_keys"``: fresh X25519 and Ed25519 key pairs; returns the reply
    arrays ``pk`` and ``spk`` (32 bytes each), ``sig`` (its identity key's signature of
    session, site and both keys) and ``id`` (its public identity key, DER).

    Raises:
        _Refused: no usable identity, or the session already exists here (a replayed request).
    """
    problem = identity_problem(site)
    if problem:
        raise _Refused(problem)
    sessions = site.state.setdefault(_STATE, {})
    if session in sessions:
        raise _Refused(f"secure aggregation session {session!r} already exists at this site (replayed request)")
    private, signer = X25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pk, spk = private.public_key().public_bytes_raw(), signer.public_key().public_bytes_raw()
    sig = site.identity.sign(_key_message(session, site.name, pk, spk))
    sessions[session] = {"sk": private.private_bytes_raw().hex(), "pk": pk.hex(),
                         "ssk": signer.private_bytes_raw().hex(), "spk": spk.hex(), "labels": {}, "verified": {}}
    return {"pk": np.frombuffer(pk, dtype=np.uint8), "spk": np.frombuffer(spk, dtype=np.uint8),
            "sig": np.frombuffer(sig, dtype=np.uint8), "id": np.frombuffer(site.identity.public_der, dtype=np.uint8)}


def _spec(meta: Mapping[str, Any]) -> dict[str, Any]:
    spec = meta.get(SECAGG_META)
    if not isinstance(spec, dict):
        raise _Refused("secure aggregation spec must be a JSON object")
    for key, kind in (("session", str), ("label", str), ("peers", list), ("threshold", int), ("fields", list)):
        if not isinstance(spec.get(key), kind) or isinstance(spec.get(key), bool):
            raise _Refused(f"secure aggregation spec lacks a valid {key!r}")
    for f in spec["fields"]:
        if not (isinstance(f, list) and len(f) == 3 and isinstance(f[0], str) and isinstance(f[1], int)
                and 0 <= f[1] <= 48 and isinstance(f[2], bool)):
            raise _Refused("secure aggregation fields must be [name, fractional bits 0..48, weighted]")
    return spec


def _check_threshold(t: int, n: int) -> None:
    """The site's own rule: ``t`` is a strict majority of the ``n`` peers, at least 2, at most ``n``."""
    if not (max(2, n // 2 + 1) <= t <= n):
        raise _Refused(f"secure aggregation threshold {t} is not a majority of {n} peers (at least 2)")


def _verified_peers(site: "Site", st: dict[str, Any], session: str, peers: list[str],
                    arrays: Mapping[str, np.ndarray]) -> list[bytes]:
    """Every peer's session key, checked against the site's key list; returns them in peer order.

    A peer passes when its identity key is the one the key list holds for its name and
    that key signed (session, peer, session key). Verified peers are remembered per
    session (``st["verified"]``), so later requests of the session cost a comparison.

    Raises:
        _Refused: malformed key arrays, this site's own key replaced, or a peer that does
            not verify (naming it).
    """
    n = len(peers)
    pks, spks, sigs, ids = (np.asarray(arrays.get(k)) for k in (_PK, _SPK, _KSIG, _ID))
    for a, width, what in ((pks, 32, "session keys"), (spks, 32, "session signing keys"),
                           (sigs, SIGNATURE_BYTES, "key signatures"), (ids, PUBLIC_KEY_BYTES, "identity keys")):
        if a.dtype != np.uint8 or a.shape != (n, width):
            raise _Refused(f"secure aggregation needs {n} {what} of {width} bytes")
    verified = st.setdefault("verified", {})
    bad = []
    for j, peer in enumerate(peers):
        pk, spk, ident = pks[j].tobytes(), spks[j].tobytes(), ids[j].tobytes()
        if peer == site.name:
            if pk.hex() != st["pk"] or spk.hex() != st["spk"]:
                bad.append(f"its own session key was replaced (peer {peer!r})")
            continue
        if verified.get(peer) == [pk.hex(), spk.hex(), ident.hex()]:
            continue
        why = site.identity.check_peer(peer, ident)
        if why is None and not verify(ident, sigs[j].tobytes(), _key_message(session, peer, pk, spk)):
            why = (f"the session key of peer {peer!r} is not signed by its identity key "
                   "(substituted or forged)")
        if why is not None:
            bad.append(why)
        else:
            verified[peer] = [pk.hex(), spk.hex(), ident.hex()]
    if bad:
        raise _Refused("secure aggregation refused: " + "; ".join(bad))
    return [pks[j].tobytes() for j in range(n)]


def _checked_masking(site: "Site", request: "Message",
                     min_peers: int) -> tuple[dict, dict, list[str], int, list[bytes]]:
    """``(spec, session state, peers, threshold, session keys)`` of a masking request.

    Raises:
        _Refused: as :func:`masking_refusal` explains.
    """
    problem = identity_problem(site)
    if problem:
        raise _Refused(problem)
    spec = _spec(request.meta)
    session, label = spec["session"], spec["label"]
    st = _session_state(site, session)
    if label in st["labels"]:
        raise _Refused(f"secure aggregation label {label!r} was already answered (replayed request)")
    peers = _names(spec["peers"])
    if peers is None or site.name not in peers:
        raise _Refused("secure aggregation peers must be distinct, sorted site names including this site")
    if len(peers) < max(2, int(min_peers)):
        raise _Refused(f"secure aggregation over {len(peers)} peer(s) {peers[:8]}: this site requires at least "
                       f"min_peers={max(2, int(min_peers))} (itself included)")
    t = int(spec["threshold"])
    _check_threshold(t, len(peers))
    return spec, st, peers, t, _verified_peers(site, st, session, peers, request.arrays)


def masking_refusal(site: "Site", request: "Message", min_peers: int = 3) -> str | None:
    """Why ``site`` refuses to mask its reply to ``request`` (``None`` to go on): no usable
    identity or key list, an unknown session, a replayed label, peers that are not sorted
    distinct names including the site, fewer than ``min_peers`` peers, a threshold that is
    not a strict majority (and ≥ 2), a peer whose session key does not verify against the
    site's key list (named), or this site's own session key replaced."""
    try:
        _checked_masking(site, request, min_peers)
    except _Refused as exc:
        return str(exc)
    return None


def _min_peers(site: "Site") -> int:
    return int(getattr(site.policy, "min_peers", 3))


def mask_reply(site: "Site", request: "Message", reply: "Message",
               summable: Callable[[str], bool] | None = None) -> "Message":
    """Replace the summed arrays of ``reply`` by this site's masked vector (step 2 above).

    ``summable(name)``: whether the reply's kind declares array ``name`` a number the server
    needs only summed; every such array must be among the request's fields (``Site.handle``
    refuses the request before this otherwise; checked again here).

    ``request.meta["secagg"]``: ``session``, ``label``, ``peers`` (site names, sorted),
    ``threshold``, ``fields`` (``[[array name, frac bits, weighted], ...]``), optional
    ``weight`` (a reply meta key: weighted arrays are multiplied by it, and it is summed
    as :data:`WEIGHT`) and ``drop_meta`` (reply meta keys not to send).
    ``request.arrays``: ``secagg:pk`` ``(n, 32)`` session keys, ``secagg:ksig`` ``(n, 96)``
    their signatures, ``secagg:id`` ``(n, 120)`` identity keys, in peer order.

    Raises:
        ValueError: everything :func:`masking_refusal` refuses (checked again here), missing
            arrays, values out of range, a summable array left out of the fields, or arrays left
            unmasked at a site that requires secure aggregation.
    """
    spec, st, peers, t, pks = _checked_masking(site, request, _min_peers(site))
    clear = left_in_clear(masked_fields(request.meta), reply.arrays, summable or (lambda name: False))
    if clear:
        raise ValueError(f"secure aggregation: the request leaves summable array(s) {clear[:8]} unmasked")
    session, label = spec["session"], spec["label"]
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
    if arrays and getattr(site.policy, "require_secure_aggregation", False):
        raise ValueError(f"the request leaves reply arrays {sorted(arrays)[:8]} unmasked; this site requires "
                         "secure aggregation")
    y = np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    b = os.urandom(_SEED)
    y = y + _self_mask(b, len(y))
    me = peers.index(site.name)
    shares = shamir.split(b, len(peers), t)
    cts = np.zeros((len(peers), _CT_BYTES), dtype=np.uint8)
    commits = np.zeros((len(peers), 32), dtype=np.uint8)
    own = ""
    for j, peer in enumerate(peers):
        plain = shares[j][1] + os.urandom(_SALT)  # the salt keeps the commitment from revealing the share
        commits[j] = np.frombuffer(hashlib.sha256(plain).digest(), dtype=np.uint8)
        if j == me:
            own = plain.hex()
            continue
        shared = _shared(st["sk"], pks[j])
        y = y + np.uint64(_sign(site.name, peer) % 2**64) * _prg(_pair_seed(shared, session, label), len(y))
        nonce = os.urandom(_NONCE)
        ct = AESGCM(_share_key(shared, session, label)).encrypt(nonce, plain, _aad(session, label, site.name, peer))
        cts[j] = np.frombuffer(nonce + ct, dtype=np.uint8)
    st["labels"][label] = {"peers": peers, "t": t, "pks": [p.hex() for p in pks], "own": own, "signed": None,
                           "unmasked": False}
    arrays[_Y] = y
    arrays[_SHARES] = cts
    arrays[_HASHES] = commits
    meta[SECAGG_META] = {"label": label, "shapes": shapes, "commit": hashlib.sha256(b).hexdigest()}
    return type(reply)(reply.kind, arrays, meta)  # replies are the engine's message class


def _masked_label(site: "Site", meta: Mapping[str, Any]) -> tuple[dict, dict, str, str, list[str]]:
    """``(session state, label state, session, label, survivors)`` of a consistency or
    unmasking request, after the checks both share.

    Raises:
        _Refused: unknown session or label, a label already unmasked, survivors that are not
            sorted distinct peers including this site, or fewer than the threshold.
    """
    session, label = meta.get("session"), meta.get("label")
    st = _session_state(site, session)
    lab = st["labels"].get(label) if isinstance(label, str) else None
    if lab is None:
        raise _Refused(f"this site did not mask {str(label)[:80]!r}; nothing to sign or unmask")
    if lab["unmasked"]:
        raise _Refused(f"{label!r} was already unmasked (replayed request)")
    survivors = _names(meta.get("survivors"))
    if survivors is None or site.name not in survivors or not set(survivors) <= set(lab["peers"]):
        raise _Refused("the survivors must be sorted distinct peers of this sum, with this site among them")
    if len(survivors) < lab["t"]:
        raise _Refused(f"{len(survivors)} survivors are fewer than the threshold {lab['t']}")
    return st, lab, str(session), str(label), survivors


def sign_survivors(site: "Site", request: "Message") -> "Message":
    """Site side of ``"secagg_sign"`` (step 3): this site's signature of the survivor list.

    A site signs one survivor list per label; asked again with the same list it returns
    the same signature, asked with another list it refuses (the server told the sites
    different lists).
    """
    try:
        st, lab, session, label, survivors = _masked_label(site, request.meta)
        if lab["signed"] is not None and lab["signed"] != survivors:
            raise _Refused(f"asked to sign a second, different survivor list for {label!r} (the server sent "
                           "inconsistent survivor lists)")
        if lab["signed"] is None:
            sig = _session_sign(st["ssk"], _survivor_message(session, label, lab["t"], lab["peers"], survivors))
            lab["signed"], lab["signature"] = survivors, sig.hex()
    except (_Refused, IdentityError) as exc:
        return type(request).refusal(str(exc))
    return type(request)("secagg_sign", {"sig": np.frombuffer(bytes.fromhex(lab["signature"]), dtype=np.uint8)},
                   {"label": label})


def _consistent(site: "Site", st: dict, lab: dict, session: str, label: str, survivors: list[str],
                request: "Message") -> None:
    """Check the survivors' signatures on the list this site signed.

    Raises:
        _Refused: the list is not the one this site signed, or fewer than ``t`` valid
            signatures from members of it (naming the signers whose signatures fail).
    """
    if lab["signed"] is None:
        raise _Refused(f"this site has not signed a survivor list for {label!r}")
    if lab["signed"] != survivors:
        raise _Refused(f"the survivor list {survivors[:8]} is not the one this site signed {lab['signed'][:8]} "
                       "(inconsistent survivor lists)")
    signers = _names(request.meta.get("signers"))
    sigs = np.asarray(request.arrays.get(_SIGS))
    if signers is None or not set(signers) <= set(survivors) or sigs.dtype != np.uint8 \
            or sigs.shape != (len(signers), _SIG):
        raise _Refused("the unmask request needs one signature per signer, signers being survivors")
    message = _survivor_message(session, label, lab["t"], lab["peers"], survivors)
    valid, failed = 0, []
    for k, signer in enumerate(signers):  # until t are valid: more prove nothing more
        if valid >= lab["t"]:
            break
        if signer == site.name:
            ok = sigs[k].tobytes().hex() == lab["signature"]
        else:
            spk = (st["verified"].get(signer) or ["", "", ""])[1]
            ok = bool(spk) and _session_verify(bytes.fromhex(spk), sigs[k].tobytes(), message)
        if ok:
            valid += 1
        else:
            failed.append(signer)
    if valid < lab["t"]:
        detail = f"; the signatures of {failed[:8]} are not on this list" if failed else ""
        raise _Refused(f"only {valid} survivor(s) signed the survivor list {survivors[:8]} of {label!r}, the "
                       f"threshold is {lab['t']}{detail} (inconsistent survivor lists: this site reveals nothing)")


def unmask_reply(site: "Site", request: "Message") -> "Message":
    """Site side of ``"secagg_unmask"`` (step 4): shares of the survivors' self-masks,
    seeds shared with dropped peers -- only for the survivor list this site signed, when
    at least ``t`` survivors signed it too.

    Returns a refusal for any request outside the protocol (unknown or replayed label,
    another survivor list than the signed one, too few valid signatures). A share that
    does not decrypt or does not match its commitment is left out and named in
    ``meta["unreadable"]`` (``{sender: reason}``).
    """
    try:
        st, lab, session, label, survivors = _masked_label(site, request.meta)
        _consistent(site, st, lab, session, label, survivors, request)
        peers = lab["peers"]
        cts, commits = np.asarray(request.arrays.get(_SHARES)), np.asarray(request.arrays.get(_HASHES))
        if cts.dtype != np.uint8 or cts.shape != (len(peers), _CT_BYTES) or commits.dtype != np.uint8 \
                or commits.shape != (len(peers), 32):
            raise _Refused(f"unmask needs ({len(peers)}, {_CT_BYTES}) encrypted shares and ({len(peers)}, 32) "
                           "share commitments")
    except (_Refused, IdentityError) as exc:
        return type(request).refusal(str(exc))
    lab["unmasked"] = True  # from here on, never answer this label again
    dropped = [p for p in peers if p not in survivors]
    b_shares = np.zeros((len(survivors), _SEED), dtype=np.uint8)
    salts = np.zeros((len(survivors), _SALT), dtype=np.uint8)
    unreadable: dict[str, str] = {}
    for k, sender in enumerate(survivors):
        j = peers.index(sender)
        if sender == site.name:
            raw = bytes.fromhex(lab["own"])
        else:
            blob = cts[j].tobytes()
            shared = _shared(st["sk"], bytes.fromhex(lab["pks"][j]))
            try:
                raw = AESGCM(_share_key(shared, session, label)).decrypt(
                    blob[:_NONCE], blob[_NONCE:], _aad(session, label, sender, site.name))
            except InvalidTag:
                unreadable[sender] = f"the share from site {sender!r} does not authenticate (forged or altered)"
                continue
        if hashlib.sha256(raw).digest() != commits[j].tobytes():
            unreadable[sender] = f"the share from site {sender!r} does not match its commitment (forged)"
            continue
        b_shares[k] = np.frombuffer(raw[:_SEED], dtype=np.uint8)
        salts[k] = np.frombuffer(raw[_SEED:], dtype=np.uint8)
    if unreadable:
        log.warning("site %s, secure sum %s: %s", site.name, label, "; ".join(unreadable.values()))
    seeds = np.zeros((len(dropped), 32), dtype=np.uint8)
    for k, peer in enumerate(dropped):
        shared = _shared(st["sk"], bytes.fromhex(lab["pks"][peers.index(peer)]))
        seeds[k] = np.frombuffer(_pair_seed(shared, session, label), dtype=np.uint8)
    return type(request)("secagg_unmask", {"b_shares": b_shares, "b_salts": salts, "seeds": seeds},
                   {"label": label, "unreadable": unreadable})


def refused(fn: Callable[["Site", "Message"], "Message"]) -> Callable[["Site", "Message"], "Message"]:
    """Wrap a site-side step so that a :class:`_Refused` becomes a refusal reply."""
    import functools

    @functools.wraps(fn)
    def run(site: "Site", request: "Message") -> "Message":
        try:
            return fn(site, request)
        except _Refused as exc:
            return type(request).refusal(str(exc))  # the request's own message class

    return run
