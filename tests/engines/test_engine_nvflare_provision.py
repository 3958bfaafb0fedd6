"""fedtab's FLARE project.yml: ``nvflare provision`` accepts it and makes a startup kit per site.

(Running the provisioned project — server + 3 clients started from their kits, a job
submitted with the admin's kit — is ``tests/job/test_job.py::test_flare_project_job_matches_local_engine``.)
Here the generated file goes through FLARE's real provisioner and the kits are checked: every
site has a client certificate signed by the project's root CA (FLARE's mutual TLS), the
server's kit names the server host and port the file asked for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cryptography import x509

from fedtab.deploy.flare_project import project_config, write_project

pytestmark = pytest.mark.requires("nvflare", "yaml")  # checked when a test runs: importing FLARE costs ~1 s

SITES = ["site-1", "site-2", "site-3"]


def _nvflare() -> str:
    path = Path(sys.executable).with_name("nvflare")
    return str(path) if path.exists() else (shutil.which("nvflare") or "nvflare")


@pytest.mark.skipif(not (Path(sys.executable).with_name("nvflare").exists() or shutil.which("nvflare")),
                    reason="nvflare CLI not installed")
def test_nvflare_provision_accepts_project_and_makes_a_kit_per_site(tmp_path):
    project = write_project(tmp_path / "project.yml", SITES, server="localhost", fed_learn_port=18002,
                            admin_port=18003)
    proc = subprocess.run([_nvflare(), "provision", "-p", str(project), "-w", str(tmp_path / "ws")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, start_new_session=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    prod = tmp_path / "ws" / "fedtab" / "prod_00"
    root = x509.load_pem_x509_certificate((prod / "localhost" / "startup" / "rootCA.pem").read_bytes())
    for site in SITES:
        startup = prod / site / "startup"
        cert = x509.load_pem_x509_certificate((startup / "client.crt").read_bytes())
        cert.verify_directly_issued_by(root)
        assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == site
        client = json.loads((startup / "fed_client.json").read_text())
        assert client["client"]["fqsn"] == site
        assert client["client"]["connection_security"] == "mtls"
        assert client["servers"][0]["service"]["target"] == "localhost:18002"
        assert (startup / "start.sh").is_file()
    server = json.loads((prod / "localhost" / "startup" / "fed_server.json").read_text())
    assert server["servers"][0]["admin_port"] == 18003
    assert (prod / "admin@fedtab.org" / "startup").is_dir()

    # a site allows fedtab's components without losing the provisioned defaults (FLARE reads
    # resources.json instead of resources.json.default once it exists)
    from fedtab.engines.nvflare import allow_fedtab_components
    from fedtab.engines.nvflare_remote import find_admin_kit

    default = json.loads((prod / "site-1" / "local" / "resources.json.default").read_text())
    resources = json.loads(allow_fedtab_components(prod / "site-1").read_text())
    assert "fedtab.engines." in resources["class_allow_list"]
    assert set(default["class_allow_list"]) < set(resources["class_allow_list"])
    assert resources["components"] == default["components"] and resources["components"]
    # the admin's kit is found from the kit, the provisioned folder or the workspace
    for where in (prod / "admin@fedtab.org", prod, tmp_path / "ws"):
        assert find_admin_kit(where) == (prod / "admin@fedtab.org", "admin@fedtab.org")
    with pytest.raises(ValueError, match="no admin startup kit"):
        find_admin_kit(prod / "site-1")
    # no server runs on the kit's port: a one-line RunError, not a hang or a FLARE traceback
    from fedtab.engines.errors import RunError
    from fedtab.engines.nvflare_remote import run_on_project

    with pytest.raises(RunError, match="cannot open a FLARE admin session as admin@fedtab.org"):
        run_on_project([{"name": s, "data-path": f"/data/{s}.csv"} for s in SITES], {}, prod, tmp_path / "run",
                       connect_timeout=2)


def test_project_config_rejects_what_flare_would_misread():
    cfg = project_config(SITES)
    assert [p["name"] for p in cfg["participants"] if p["type"] == "client"] == SITES
    with pytest.raises(ValueError, match="distinct"):
        project_config(["a", "a"])
    with pytest.raises(ValueError, match="distinct"):
        project_config(["localhost"], server="localhost")
    with pytest.raises(ValueError, match="site name"):
        project_config(["bad/name"])
    with pytest.raises(ValueError, match="e-mail"):
        project_config(SITES, admin="root")
    with pytest.raises(ValueError, match="differ"):
        project_config(SITES, fed_learn_port=1, admin_port=1)
    with pytest.raises(ValueError, match="at least one"):
        project_config([])
