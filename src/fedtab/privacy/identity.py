"""A site's long-term identity and the consortium's key list: whom a site trusts, not the server.

Secure aggregation (:mod:`fedtab.privacy.secagg`) masks a site's reply with keys it shares
with its peers. A site trusts a peer's session key only when the peer's **identity key**
signed it and that identity key is in the **consortium's key list** -- a list that comes
from the site's own configuration, never from the server:

* the identity key: the site's EC P-384 private key -- ``fedtab deploy``'s
  ``sites/<site>.key``, the key its Flower SuperNode authenticates with (OpenSSH or PEM);
* the key list: ``site-keys.json`` (``{site: "sha256:<fingerprint>"}`` or public keys),
  checked against the consortium CA (``ca.pem``): ``fedtab deploy`` writes a detached CA
  signature ``site-keys.json.sig`` (DER ECDSA/SHA-384 over the file's exact bytes; it
  verifies with ``openssl dgst -sha384 -verify <(openssl x509 -in ca.pem -pubkey -noout)
  -signature site-keys.json.sig site-keys.json``). A list whose signature does not verify,
  or that does not hold the site's own key under its own name, is not used.

Signatures are ECDSA P-384 / SHA-384 over domain-separated, length-prefixed messages
(:func:`signed_message`), so a secure-aggregation signature can never be taken for anything
else the same key signs (Flower's SuperNode authentication signs its own, differently
shaped messages). On the wire a public key is its DER SubjectPublicKeyInfo
(:data:`PUBLIC_KEY_BYTES`) and a signature is ``r || s`` (:data:`SIGNATURE_BYTES`).

For in-process runs (no deployment), :func:`provision` makes a consortium in memory; the
code that builds the sites hands each its identity (never the server, by a request).
Nothing here imports an engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

__all__ = ["IdentityError", "KeyList", "SiteIdentity", "PUBLIC_KEY_BYTES", "SIGNATURE_BYTES", "fingerprint",
           "load_private_key", "parse_key_list", "provision", "read_key_list", "sign_key_list", "signed_message",
           "verify", "verify_key_list"]

log = logging.getLogger("fedtab.privacy")

#: bytes of a P-384 public key as DER SubjectPublicKeyInfo (what the wire carries).
PUBLIC_KEY_BYTES = 120
#: bytes of a P-384 ECDSA signature as ``r || s``.
SIGNATURE_BYTES = 96
_CURVE = ec.SECP384R1
_HASH = hashes.SHA384
_DOMAIN = b"fedtab-secagg/v1/"
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")


class IdentityError(ValueError):
    """An identity key, key list, CA signature or peer signature is missing or invalid."""


# ------------------------------------------------------------------ keys and fingerprints
def fingerprint(public_key: bytes | ec.EllipticCurvePublicKey) -> str:
    """``"sha256:<hex>"`` of a public key's DER SubjectPublicKeyInfo.

    Accepts a key object or its PEM (as Flower's ``NodeInfo.public_key`` holds it),
    OpenSSH (as ``sites/<site>.pub`` holds it) or DER encoding, so every side agrees.

    Raises:
        IdentityError: the bytes are not a public key.
    """
    key = _public_key(public_key) if isinstance(public_key, (bytes, bytearray)) else public_key
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _public_key(data: bytes) -> Any:
    data = bytes(data)
    try:
        if data.lstrip().startswith(b"-----"):
            return serialization.load_pem_public_key(data)
        if data.lstrip().startswith((b"ecdsa-", b"ssh-")):
            return serialization.load_ssh_public_key(data)
        return serialization.load_der_public_key(data)
    except Exception as exc:  # noqa: BLE001 - cryptography raises several types
        raise IdentityError(f"not a PEM, OpenSSH or DER public key: {exc}") from None


def public_key_from_der(der: bytes) -> ec.EllipticCurvePublicKey:
    """An identity public key from its DER SubjectPublicKeyInfo.

    Raises:
        IdentityError: not DER, or not an EC P-384 key.
    """
    try:
        key = serialization.load_der_public_key(bytes(der))
    except Exception:  # noqa: BLE001
        raise IdentityError("not a DER public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, _CURVE):
        raise IdentityError("identity keys are EC P-384 keys")
    return key


def load_private_key(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """A site's identity key from ``path`` (OpenSSH or PEM private key, unencrypted).

    Raises:
        IdentityError: unreadable, encrypted, or not an EC P-384 private key.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise IdentityError(f"identity key {path}: {exc.strerror or exc}") from None
    try:
        key = (serialization.load_ssh_private_key(data, None) if b"OPENSSH PRIVATE KEY" in data
               else serialization.load_pem_private_key(data, None))
    except Exception as exc:  # noqa: BLE001
        raise IdentityError(f"identity key {path} cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, _CURVE):
        raise IdentityError(f"identity key {path} is not an EC P-384 private key")
    return key


def _der(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> bytes:
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


# ------------------------------------------------------------------ signatures
def signed_message(tag: str, *fields: str | bytes) -> bytes:
    """The bytes a secure-aggregation signature covers: a domain prefix, ``tag`` and each
    field length-prefixed (4 bytes, big-endian), so no two field lists encode alike."""
    out = bytearray(_DOMAIN + tag.encode() + b"\0")
    for f in fields:
        raw = f.encode() if isinstance(f, str) else bytes(f)
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def _sign(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(message, ec.ECDSA(_HASH())))
    return r.to_bytes(48, "big") + s.to_bytes(48, "big")


def verify(public_der: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` (``r || s``) is ``public_der``'s signature of ``message``;
    ``False`` for any malformed key or signature (never raises)."""
    sig = bytes(signature)
    if len(sig) != SIGNATURE_BYTES:
        return False
    try:
        key = public_key_from_der(public_der)
        key.verify(encode_dss_signature(int.from_bytes(sig[:48], "big"), int.from_bytes(sig[48:], "big")),
                   message, ec.ECDSA(_HASH()))
    except (IdentityError, InvalidSignature, ValueError):
        return False
    return True


# ------------------------------------------------------------------ the key list
def parse_key_list(raw: Any) -> dict[str, str]:
    """``{site: fingerprint}`` from a mapping whose values are fingerprints
    (``sha256:<64 hex>``) or public keys (PEM / OpenSSH text).

    Raises:
        IdentityError: not a mapping of strings, a malformed key or fingerprint, or two
            sites sharing one key (the key would not tell them apart).
    """
    if not isinstance(raw, Mapping):
        raise IdentityError("site-keys must map site names to public keys or fingerprints")
    out: dict[str, str] = {}
    for site, value in raw.items():
        if not isinstance(value, str):
            raise IdentityError(f"site-keys: the key of site {site!r} must be a string")
        value = value.strip()
        if _FINGERPRINT.fullmatch(value):
            out[str(site)] = value
        else:
            try:
                out[str(site)] = fingerprint(value.encode())
            except IdentityError as exc:
                raise IdentityError(f"site-keys: site {site!r}: {exc}") from None
    owners: dict[str, str] = {}
    for site, fp in out.items():
        if fp in owners:
            raise IdentityError(f"site-keys: sites {owners[fp]!r} and {site!r} share one public key")
        owners[fp] = site
    return out


def sign_key_list(data: bytes, ca_key: ec.EllipticCurvePrivateKey) -> bytes:
    """The CA's detached signature (DER ECDSA/SHA-384) of a key list's exact bytes."""
    return ca_key.sign(bytes(data), ec.ECDSA(_HASH()))


def verify_key_list(data: bytes, signature: bytes, ca_cert_pem: bytes) -> None:
    """Check that the consortium CA (``ca.pem``, a CA certificate) signed ``data``.

    Raises:
        IdentityError: not a CA certificate, or the signature does not verify.
    """
    from cryptography import x509  # only where a key list is read: a ClientApp answering other steps skips it

    try:
        cert = x509.load_pem_x509_certificate(bytes(ca_cert_pem))
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except Exception as exc:  # noqa: BLE001
        raise IdentityError(f"the root certificate is not a CA certificate: {exc}") from None
    key = cert.public_key()
    if not constraints.ca or not isinstance(key, ec.EllipticCurvePublicKey):
        raise IdentityError("the root certificate is not an EC CA certificate")
    try:
        key.verify(bytes(signature), bytes(data), ec.ECDSA(_HASH()))
    except (InvalidSignature, ValueError):
        raise IdentityError("the consortium key list's CA signature does not verify (altered list, or "
                            "another CA)") from None


@dataclass(frozen=True)
class KeyList:
    """The consortium's verified key list: ``{site: fingerprint of its identity key}``."""

    fingerprints: Mapping[str, str]

    def check_peer(self, site: str, public_der: bytes) -> str | None:
        """Why ``public_der`` is not ``site``'s listed identity key, or ``None`` if it is."""
        listed = self.fingerprints.get(site)
        if listed is None:
            return f"site {site!r} is not in the consortium key list"
        try:
            if fingerprint(public_key_from_der(public_der)) != listed:
                return f"the identity key of site {site!r} is not the one in the consortium key list"
        except IdentityError as exc:
            return f"the identity key of site {site!r} is invalid: {exc}"
        return None


def read_key_list(path: str | Path, root_certificates: str | Path, signature: str | Path | None = None) -> KeyList:
    """The key list at ``path`` after checking its CA signature (default ``<path>.sig``).

    Raises:
        IdentityError: a file cannot be read, the signature does not verify against
            ``root_certificates``, or the list is malformed.
    """
    sig_path = Path(signature) if signature else Path(f"{path}.sig")
    try:
        data, sig, ca = Path(path).read_bytes(), sig_path.read_bytes(), Path(root_certificates).read_bytes()
    except OSError as exc:
        raise IdentityError(f"consortium key list: {exc.filename}: {exc.strerror or exc}") from None
    verify_key_list(data, sig, ca)
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise IdentityError(f"consortium key list {path} is not valid JSON: {exc}") from None
    return KeyList(parse_key_list(raw))


# ------------------------------------------------------------------ the site's identity
@dataclass
class SiteIdentity:
    """A site's signing key and the consortium key list it verified.

    Build with :meth:`from_files` (read on first use, so a process that answers no secure
    request never reads a key) or directly with a key and a list (in memory). A site
    whose identity has a :attr:`problem` refuses to take part in secure aggregation and
    says why.
    """

    name: str
    private_key: ec.EllipticCurvePrivateKey | None = field(default=None, repr=False)
    key_list: KeyList | None = None
    _load: Callable[[], tuple[ec.EllipticCurvePrivateKey, KeyList]] | None = field(default=None, repr=False)
    _problem: str | None = field(default=None, repr=False)
    _checked: bool = field(default=False, repr=False)

    @classmethod
    def from_files(cls, name: str, identity_key: str | Path, consortium_keys: str | Path,
                   root_certificates: str | Path, signature: str | Path | None = None) -> "SiteIdentity":
        """The identity of site ``name`` from its configured files, read when first used."""
        return cls(str(name), _load=lambda: (load_private_key(identity_key),
                                             read_key_list(consortium_keys, root_certificates, signature)))

    @classmethod
    def unusable(cls, name: str, problem: str) -> "SiteIdentity":
        """An identity that cannot be used, for the reason ``problem`` (a misconfiguration)."""
        return cls(str(name), _problem=str(problem))

    def _ready(self) -> None:
        if self._checked:
            return
        self._checked = True
        if self._load is not None:
            load, self._load = self._load, None
            try:
                self.private_key, self.key_list = load()
            except IdentityError as exc:
                self._problem = str(exc)
                log.warning("site %s: secure aggregation unavailable: %s", self.name, exc)
        if self._problem is None and (self.private_key is None or self.key_list is None):
            self._problem = "no identity key or consortium key list"
        if self._problem is None:
            own = self.key_list.check_peer(self.name, _der(self.private_key))
            if own is not None:
                self._problem = f"the consortium key list does not hold this site's identity key ({own})"

    @property
    def problem(self) -> str | None:
        """Why this identity cannot be used (no key, no verified list, a list without this
        site's key under its name), or ``None``."""
        self._ready()
        return self._problem

    @property
    def public_der(self) -> bytes:
        """This site's identity public key (DER SubjectPublicKeyInfo).

        Raises:
            IdentityError: the identity cannot be used (:attr:`problem`).
        """
        self._usable()
        return _der(self.private_key)

    def sign(self, message: bytes) -> bytes:
        """This site's signature (``r || s``) of ``message``.

        Raises:
            IdentityError: the identity cannot be used (:attr:`problem`).
        """
        self._usable()
        return _sign(self.private_key, message)

    def check_peer(self, site: str, public_der: bytes) -> str | None:
        """Why ``public_der`` is not ``site``'s identity key per the verified list (or ``None``)."""
        self._usable()
        return self.key_list.check_peer(site, public_der)

    def _usable(self) -> None:
        if self.problem is not None:
            raise IdentityError(self.problem)


def provision(names: Iterable[str]) -> dict[str, SiteIdentity]:
    """A consortium made in memory: a fresh identity key per site and one key list holding
    them all (for in-process runs; the caller hands each site its identity).

    Raises:
        ValueError: repeated names.
    """
    names = [str(n) for n in names]
    if len(set(names)) != len(names):
        raise ValueError(f"repeated site names in {names}")
    keys = {n: ec.generate_private_key(_CURVE()) for n in names}
    key_list = KeyList({n: fingerprint(k.public_key()) for n, k in keys.items()})
    return {n: SiteIdentity(n, keys[n], key_list) for n in names}
