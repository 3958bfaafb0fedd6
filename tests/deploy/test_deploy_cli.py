"""``fedtab deploy`` gives every site a state folder (issue 28 item 6) and refuses bad values
of ``OUT`` and its options in one line (item 7)."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat

import pytest
from typer.testing import CliRunner

from fedtab.cli import app

runner = CliRunner()


def _deploy(*args) -> "object":
    return runner.invoke(app, ["deploy", *map(str, args)])


def _one_line_error(res, *fragments) -> None:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    text = " ".join(res.output.split())
    assert text.startswith("error:") and all(f in text for f in fragments), text
    assert "Traceback" not in res.output


def _node_config(output: str, site: str) -> dict[str, str]:
    """The ``--node-config`` of site ``site``'s printed SuperNode command, as a dict."""
    line = next(l for l in output.splitlines() if "flower-supernode" in l and f'name="{site}"' in l)
    argv = shlex.split(line)
    text = argv[argv.index("--node-config") + 1]
    return {k: json.loads(v) for k, v in re.findall(r'([\w-]+)=("(?:[^"\\]|\\.)*")', text)}


def test_every_site_gets_a_state_folder_of_its_own(tmp_path):
    out = tmp_path / "consortium"
    res = _deploy(out, "--site", "alpha", "--site", "beta")
    assert res.exit_code == 0, res.output
    for site in ("alpha", "beta"):
        cfg = _node_config(res.output, site)
        folder = out / "state" / site
        assert cfg["state-dir"] == str(folder) and folder.is_dir()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # the site's ledger: its operator's only
        flare = next(l for l in res.output.splitlines() if f"(site {site}:) copy" in l)
        assert f"flare/sites/{site}/fedtab-site.json" in flare  # a FLARE site's own local/ config names one too
        own = json.loads((out / "flare" / "sites" / site / "fedtab-site.json").read_text())
        assert own["state-dir"] == "fedtab-state"


def test_the_node_config_a_deploy_prints_builds_a_site_with_a_file_ledger(tmp_path):
    """The printed node config, read as a SuperNode's, gives the site its ledger file there."""
    from fedtab.engines.site_config import build_lazy_site

    out = tmp_path / "c"
    data = tmp_path / "a.csv"
    data.write_text("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(40)))
    res = _deploy(out, "--site", "a", "--data", f"a={data}")
    assert res.exit_code == 0, res.output
    site = build_lazy_site(_node_config(res.output, "a"))
    assert site.ledger.path == out / "state" / "a" / "ledger.json"


def test_an_out_that_is_a_file_or_under_one_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_error(_deploy(blocker, "--site", "a"), "exists and is not a directory")
    _one_line_error(_deploy(blocker / "sub", "--site", "a"), "is not a directory")
    assert blocker.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_out_is_a_one_line_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _one_line_error(_deploy(locked, "--site", "a"), "cannot write")
        _one_line_error(_deploy(locked / "sub", "--site", "a"), "cannot write")
    finally:
        locked.chmod(0o700)


def test_an_unwritable_out_found_while_writing_is_a_one_line_error(tmp_path, monkeypatch):
    """A folder that stops being writable between the check and the write (or a full disk)."""
    import fedtab.deploy.keys as keys

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keys, "write_site_key", full)
    _one_line_error(_deploy(tmp_path / "o", "--site", "a"), "cannot write the deployment", "No space left")


@pytest.mark.parametrize("args, fragment", [
    (["--flare-port", "65535"], "--flare-port 65535 must be in 1-65534"),
    (["--flare-port", "0"], "--flare-port 0 must be in 1-65534"),
    (["--host", "bad host!"], "--host 'bad host!' is neither an IP address nor a host name"),
    (["--host", "a..b"], "is neither an IP address nor a host name"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, fragment):
    _one_line_error(_deploy(tmp_path / "o", "--site", "a", *args), fragment)
    assert not (tmp_path / "o" / "ca.key").exists()


def test_good_hosts_are_accepted(tmp_path):
    res = _deploy(tmp_path / "o", "--site", "a", "--host", "10.0.0.5", "--host", "link.example.org", "--host", "::1")
    assert res.exit_code == 0, res.output
