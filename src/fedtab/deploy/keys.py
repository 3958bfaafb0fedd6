"""Keys and certificates for a Flower deployment with TLS and SuperNode authentication.

A consortium needs three kinds of material, all made here with ``cryptography``:

* a **CA** (``ca.pem`` / ``ca.key``): every SuperNode trusts it (``--root-certificates``)
  and so connects only to a SuperLink whose certificate it signed;
* the **SuperLink certificate** (``superlink.pem`` / ``superlink.key``), signed by the CA,
  valid for 127.0.0.1, ``localhost`` and the hosts the consortium names;
* one **authentication key pair per site** (``sites/<site>.key`` in OpenSSH private-key
  format for ``flower-supernode --auth-supernode-private-key``, ``sites/<site>.pub`` in
  OpenSSH public-key format for ``flwr supernode register``), EC on NIST P-384 as
  Flower requires.

``site-keys.json`` maps each site name to the SHA-256 fingerprint of its public key
(:func:`fingerprint`); the ServerApp receives it as the ``site-keys`` run-config value
and names a node by the key it authenticated with, never by the name it declares.
``site-keys.json.sig`` is the CA's detached signature of that file: each site checks it
with ``ca.pem`` and then trusts the list for secure aggregation, where a site's
authentication key doubles as its identity (signing) key
(:mod:`fedtab.privacy.identity`; :meth:`ConsortiumKeys.identity_config` gives a site's
node-config keys).

Private keys are written with mode 0600. In a real consortium each site generates its
own key pair (:func:`write_site_key`) and sends only the ``.pub`` file to the coordinator.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..privacy.identity import fingerprint, parse_key_list, sign_key_list

__all__ = [
    "ConsortiumKeys",
    "fingerprint",
    "load_site_keys",
    "sign_site_keys",
    "write_consortium_keys",
    "write_site_key",
]

_CURVE = ec.SECP384R1
_SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ConsortiumKeys:
    """Paths of the files :func:`write_consortium_keys` wrote (all under ``folder``)."""

    folder: Path
    ca_cert: Path
    ca_key: Path
    superlink_cert: Path
    superlink_key: Path
    site_private: dict[str, Path]
    site_public: dict[str, Path]
    site_keys: Path  # site-keys.json: {site: fingerprint}
    site_keys_signature: Path  # site-keys.json.sig: the CA's signature of site-keys.json

    def fingerprints(self) -> dict[str, str]:
        """``{site: fingerprint}`` as stored in ``site-keys.json``."""
        return load_site_keys(self.site_keys)

    def identity_config(self, site: str) -> dict[str, str]:
        """Site ``site``'s node-config keys for secure aggregation (paths on this machine):
        ``identity-key``, ``consortium-keys``, ``root-certificates``."""
        return {"identity-key": str(self.site_private[site]), "consortium-keys": str(self.site_keys),
                "root-certificates": str(self.ca_cert)}


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _check_site(site: str) -> None:
    if not _SITE_NAME.match(site):
        raise ValueError(f"site name {site!r} must be 1-64 letters, digits, '.', '_' or '-' (used as a file name)")


def write_site_key(site: str, folder: str | Path) -> tuple[Path, Path]:
    """Generate site ``site``'s SuperNode key pair; returns ``(private, public)`` paths.

    ``<folder>/<site>.key`` (OpenSSH private key, mode 0600) stays at the site;
    ``<folder>/<site>.pub`` (OpenSSH public key) goes to the coordinator.

    Raises:
        ValueError: ``site`` is not a safe file name.
    """
    _check_site(site)
    folder = Path(folder)
    key = ec.generate_private_key(_CURVE())
    private = _write(folder / f"{site}.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()), private=True)
    public = _write(folder / f"{site}.pub", key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedtab consortium"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # ordered, without repeats
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def write_consortium_keys(folder: str | Path, sites: Iterable[str], *, hosts: Iterable[str] = (),
                          days: int = 365, ca_name: str = "fedtab consortium CA") -> ConsortiumKeys:
    """Write a CA, the SuperLink's certificate and one key pair per site into ``folder``.

    Args:
        folder: output folder (created); existing files of the same names are replaced.
        sites: site names (each becomes ``sites/<site>.key|.pub``).
        hosts: extra host names or IP addresses the SuperLink is reached at (the
            certificate always covers 127.0.0.1 and ``localhost``).
        days: validity of the certificates.
        ca_name: the CA's common name.

    Raises:
        ValueError: no site, a repeated site, or a site name unsafe as a file name.
    """
    sites = list(sites)
    if not sites:
        raise ValueError("write_consortium_keys needs at least one site")
    if len(set(sites)) != len(sites):
        raise ValueError(f"repeated site names in {sites}")
    for site in sites:
        _check_site(site)
    folder = Path(folder)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=days)

    ca_key = ec.generate_private_key(_CURVE())
    ca_cert = (x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(until)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA384()))

    link_key = ec.generate_private_key(_CURVE())
    link_cert = (x509.CertificateBuilder().subject_name(_name("fedtab SuperLink")).issuer_name(ca_cert.subject)
                 .public_key(link_key.public_key()).serial_number(x509.random_serial_number())
                 .not_valid_before(now).not_valid_after(until)
                 .add_extension(_san([*_DEFAULT_HOSTS, *hosts]), critical=False)
                 .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                 .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                 .sign(ca_key, hashes.SHA384()))

    pem = serialization.Encoding.PEM
    private, public = {}, {}
    for site in sites:
        private[site], public[site] = write_site_key(site, folder / "sites")
    site_keys = folder / "site-keys.json"
    site_keys.write_text(json.dumps({s: fingerprint(public[s].read_bytes()) for s in sites}, indent=2) + "\n")
    signature = _write(folder / "site-keys.json.sig", sign_key_list(site_keys.read_bytes(), ca_key))
    return ConsortiumKeys(
        folder=folder,
        ca_cert=_write(folder / "ca.pem", ca_cert.public_bytes(pem)),
        ca_key=_write(folder / "ca.key", _key_pem(ca_key), private=True),
        superlink_cert=_write(folder / "superlink.pem", link_cert.public_bytes(pem)),
        superlink_key=_write(folder / "superlink.key", _key_pem(link_key), private=True),
        site_private=private, site_public=public, site_keys=site_keys, site_keys_signature=signature,
    )


def sign_site_keys(site_keys: str | Path, ca_key: str | Path) -> Path:
    """(Re-)sign a key list after editing it (a site joined): writes ``<site_keys>.sig``, the
    CA's detached signature of the file's bytes, and returns its path.

    Raises:
        ValueError: the CA key cannot be read, or the file is not a valid key list.
    """
    site_keys = Path(site_keys)
    data = site_keys.read_bytes()
    load_site_keys(data.decode())
    try:
        key = serialization.load_pem_private_key(Path(ca_key).read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"CA key {ca_key}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"CA key {ca_key} is not an EC private key")
    return _write(Path(f"{site_keys}.sig"), sign_key_list(data, key))


def load_site_keys(source: str | Path | Mapping[str, str]) -> dict[str, str]:
    """``{site: fingerprint}`` from a mapping, a JSON string or a ``site-keys.json`` path.

    Values may be fingerprints (``sha256:<64 hex>``) or public keys (PEM / OpenSSH text),
    which are turned into fingerprints.

    Raises:
        ValueError: not a JSON object of strings, a malformed key or fingerprint, or two
            sites sharing one key (the key would not tell them apart).
    """
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        text = str(source)
        if not text.lstrip().startswith(("{", "[")):
            text = Path(text).read_text()
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"site-keys is not valid JSON: {exc}") from None
    return parse_key_list(raw)  # its IdentityError is a ValueError
