"""Secure aggregation the site can verify: the server learns the sum of the sites' vectors, not one site's.

SecAgg (Bonawitz et al., CCS 2017) in fedtab's exchanges, so it runs unchanged on every
engine (the engines only move :class:`~fedtab.federation.messages.Message` s). Every site
holds an identity key and the consortium's key list from its own configuration
(:mod:`fedtab.privacy.identity`); the server relays keys and signatures but cannot make
them up.

1. ``"secagg_keys"`` (once per :class:`SecureAggregator`) -- every site makes an X25519
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
import secrets as _secrets
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

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
from .identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, IdentityError, fingerprint, public_key_from_der, \
    signed_message, verify

if TYPE_CHECKING:  # pragma: no cover
    from ..federation.messages import Message
    from ..federation.protocol import Federation
    from ..federation.site import Site

__all__ = ["SecureAggregator", "SecureSum", "mask_reply", "masking_refusal", "is_summed_request", "SUMMED_KINDS",
           "SECAGG_META", "FRAC_BITS", "MOMENT_BITS", "WEIGHT"]

#: request/reply meta key that carries the secure-aggregation spec.
SECAGG_META = "secagg"
log = logging.getLogger("fedtab.privacy")

#: default fractional bits of the fixed-point encoding (resolution 2**-24 ≈ 6e-8).
FRAC_BITS = 24
#: fractional bits for sums of raw data moments (sums of squares need range: ~7e13 / sites).
MOMENT_BITS = 16
#: name of the summed weight in :attr:`SecureSum.sums` when a reply is weighted.
WEIGHT = "__weight__"

#: Request kinds whose replies the server needs only as sums: moments (``describe``, the
#: election's ``set_mask`` when it carries a description, ``class_moments``, the moments of
#: ``impute_schema``, ``impute_stats``), model updates (``fit``, ``impute_fit``) and
#: evaluation sums (``evaluate``, ``score_sums``, ``impute_eval``). A site whose policy
#: sets ``require_secure_aggregation`` (or ``require_dp``) refuses them unless they arrive
#: masked (or with DP settings); see :func:`is_summed_request`. The release gate
#: (``privacy/gate.py``) will own this set once each handler declares what it releases.
SUMMED_KINDS = frozenset({"describe", "set_mask", "fit", "evaluate", "class_moments", "score_sums", "impute_schema",
                          "impute_stats", "impute_fit", "impute_eval"})

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


def is_summed_request(request: "Message") -> bool:
    """Whether ``request`` asks for quantities the server needs only summed
    (:data:`SUMMED_KINDS`; ``set_mask`` only with a description, ``impute_schema`` only
    for its moments, not for the column names alone)."""
    if request.kind not in SUMMED_KINDS:
        return False
    if request.kind == "set_mask":
        return request.meta.get("describe") is not None
    if request.kind == "impute_schema":
        return not request.meta.get("columns_only")
    return True


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


def mask_reply(site: "Site", request: "Message", reply: "Message") -> "Message":
    """Replace the summed arrays of ``reply`` by this site's masked vector (step 2 above).

    ``request.meta["secagg"]``: ``session``, ``label``, ``peers`` (site names, sorted),
    ``threshold``, ``fields`` (``[[array name, frac bits, weighted], ...]``), optional
    ``weight`` (a reply meta key: weighted arrays are multiplied by it, and it is summed
    as :data:`WEIGHT`) and ``drop_meta`` (reply meta keys not to send).
    ``request.arrays``: ``secagg:pk`` ``(n, 32)`` session keys, ``secagg:ksig`` ``(n, 96)``
    their signatures, ``secagg:id`` ``(n, 120)`` identity keys, in peer order.

    Raises:
        ValueError: everything :func:`masking_refusal` refuses (checked again here), missing
            arrays, values out of range, or arrays left unmasked at a site that requires
            secure aggregation.
    """
    from ..federation.messages import Message

    spec, st, peers, t, pks = _checked_masking(site, request, _min_peers(site))
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
    return Message(reply.kind, arrays, meta)


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
    from ..federation.messages import Message

    try:
        st, lab, session, label, survivors = _masked_label(site, request.meta)
        if lab["signed"] is not None and lab["signed"] != survivors:
            raise _Refused(f"asked to sign a second, different survivor list for {label!r} (the server sent "
                           "inconsistent survivor lists)")
        if lab["signed"] is None:
            sig = _session_sign(st["ssk"], _survivor_message(session, label, lab["t"], lab["peers"], survivors))
            lab["signed"], lab["signature"] = survivors, sig.hex()
    except (_Refused, IdentityError) as exc:
        return Message.refusal(str(exc))
    return Message("secagg_sign", {"sig": np.frombuffer(bytes.fromhex(lab["signature"]), dtype=np.uint8)},
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
    from ..federation.messages import Message

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
        return Message.refusal(str(exc))
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
    return Message("secagg_unmask", {"b_shares": b_shares, "b_salts": salts, "seeds": seeds},
                   {"label": label, "unreadable": unreadable})


def refused(fn: Callable[["Site", "Message"], "Message"]) -> Callable[["Site", "Message"], "Message"]:
    """Wrap a site-side step so that a :class:`_Refused` becomes a refusal reply."""
    import functools

    from ..federation.messages import Message

    @functools.wraps(fn)
    def run(site: "Site", request: "Message") -> "Message":
        try:
            return fn(site, request)
        except _Refused as exc:
            return Message.refusal(str(exc))

    return run


# ------------------------------------------------------------------ server side
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
        from ..federation.messages import Message
        from ..federation.protocol import FederationError, exchange

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
        from ..federation.messages import Message
        from ..federation.protocol import FederationError, exchange

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
            dropped = [p for p in peers if p not in masked]
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
        from ..federation.protocol import SiteError, reject_text

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
        from ..federation.protocol import QuorumError, exchange

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
        from ..federation.messages import Message
        from ..federation.protocol import FederationError, SiteError

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
    from ..federation.protocol import FederationError, SiteError

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
    from ..federation.messages import Message

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
