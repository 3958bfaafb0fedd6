"""fedtab.deploy.keys: the CA, the SuperLink certificate, the site keys and site-keys.json."""

from __future__ import annotations

import ipaddress
import json
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedtab.deploy.keys import fingerprint, load_site_keys, write_consortium_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return write_consortium_keys(tmp_path_factory.mktemp("keys"), ["site-1", "site-2"], hosts=["link.example.org",
                                                                                              "10.0.0.5"])


def test_superlink_certificate_is_signed_by_the_ca_for_the_named_hosts(keys):
    ca = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(keys.superlink_cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if another key signed it
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "link.example.org"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1"),
                                                            ipaddress.ip_address("10.0.0.5")}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    other = write_consortium_keys(keys.folder / "other", ["x"])
    with pytest.raises(Exception):
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(other.ca_cert.read_bytes()))


def test_site_keys_are_flower_supernode_keys_and_private_files_are_0600(keys):
    for site in ("site-1", "site-2"):
        private = serialization.load_ssh_private_key(keys.site_private[site].read_bytes(), None)
        public = serialization.load_ssh_public_key(keys.site_public[site].read_bytes())
        assert isinstance(private.curve, ec.SECP384R1)  # Flower requires a NIST curve
        assert fingerprint(private.public_key()) == fingerprint(keys.site_public[site].read_bytes())
        assert fingerprint(public.public_bytes(serialization.Encoding.PEM,  # as NodeInfo.public_key holds it
                                               serialization.PublicFormat.SubjectPublicKeyInfo)) == \
            keys.fingerprints()[site]
    for path in [keys.ca_key, keys.superlink_key, *keys.site_private.values()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert json.loads(keys.site_keys.read_text()) == keys.fingerprints()


def test_site_keys_json_is_validated(keys):
    fps = keys.fingerprints()
    pub = keys.site_public["site-1"].read_text()
    assert load_site_keys({"site-1": pub})["site-1"] == fps["site-1"]  # public key text accepted
    assert load_site_keys(str(keys.site_keys)) == fps  # a path
    with pytest.raises(ValueError, match="share one public key"):
        load_site_keys({"a": fps["site-1"], "b": pub})
    with pytest.raises(ValueError, match="site 'a'"):
        load_site_keys('{"a": "sha256:not-hex"}')
    with pytest.raises(ValueError, match="must map"):
        load_site_keys("[1, 2]")
    with pytest.raises(ValueError, match="safe file name|letters"):
        write_consortium_keys(keys.folder / "bad", ["../escape"])
    with pytest.raises(ValueError, match="repeated"):
        write_consortium_keys(keys.folder / "bad", ["a", "a"])


def test_fedtab_deploy_writes_keys_and_flare_project_and_never_replaces_a_ca(tmp_path):
    from typer.testing import CliRunner

    from fedtab.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["deploy", str(tmp_path / "c"), "--site", "site-1", "--site", "site-2",
                              "--host", "link.example.org", "--data", f"site-2={tmp_path / 'b.csv'}"],
                        env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    out = tmp_path / "c"
    fps = load_site_keys(out / "site-keys.json")
    assert set(fps) == {"site-1", "site-2"}
    assert fps["site-1"] == fingerprint((out / "sites" / "site-1.pub").read_bytes())
    assert "site-1" in (out / "flare" / "project.yml").read_text()
    assert "--enable-supernode-auth" in res.output and str(out / "site-keys.json") in res.output
    # the key list's CA signature, checked as a site checks it, and the node-config keys that load it
    from fedtab.privacy.identity import read_key_list

    assert read_key_list(out / "site-keys.json", out / "ca.pem").fingerprints == fps
    text = " ".join(res.output.split())
    for key in (f'identity-key="{out}/sites/site-1.key"', f'consortium-keys="{out}/site-keys.json"',
                f'root-certificates="{out}/ca.pem"', f'data-path="{tmp_path}/b.csv"',
                "site-2/local/ (fedtab-site.json", "runs the python3 on PATH"):
        assert key in text, key
    # each FLARE site's own file: its table, its default policy written out, its state folder and identity
    own = json.loads((out / "flare" / "sites" / "site-2" / "fedtab-site.json").read_text())
    assert own["data-path"] == f"{tmp_path}/b.csv" and own["state-dir"] == "fedtab-state"
    assert own["identity-key"] == "site-2.key" and own["policy"]["min_rows"] == 10
    assert own["policy"]["allow_server_row_sets"] is False
    # the real commands: a SuperLink reachable from the consortium (and the firewall said), a port per
    # SuperNode, and the flwr connection with an absolute CA path (Flower 1.42 refuses a relative one)
    assert "--host 0.0.0.0 --port 9093" in text and "open TCP port 9093" in text
    assert "--port 9094 " in text and "--port 9095 " in text and "<dir>" not in text and "<connection>" not in text
    assert f"FLWR_HOME={out}/flwr flwr supernode register {out}/sites/site-1.pub consortium" in text
    config = (out / "flwr" / "config.toml").read_text()
    assert 'address = "link.example.org:9093"' in config and f'root-certificates = "{out}/ca.pem"' in config
    trial = runner.invoke(app, ["deploy", str(tmp_path / "t"), "--site", "a", "--port", "7000"], env={"COLUMNS": "400"})
    assert "--host 127.0.0.1 --port 7000" in trial.output and "firewall" not in trial.output
    wrong = runner.invoke(app, ["deploy", str(tmp_path / "w"), "--site", "a", "--data", "b=x.csv"])
    assert wrong.exit_code == 2 and "SITE=PATH" in wrong.output
    ca = (out / "ca.pem").read_bytes()
    again = runner.invoke(app, ["deploy", str(out), "--site", "site-1"])
    assert again.exit_code == 2 and "ca.key exists" in again.output
    assert (out / "ca.pem").read_bytes() == ca
    bad = runner.invoke(app, ["deploy", str(tmp_path / "d"), "--site", "../x"])
    assert bad.exit_code == 2 and "site name" in bad.output
