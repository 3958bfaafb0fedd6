"""The NVIDIA FLARE ``project.yml`` for a consortium, for ``nvflare provision`` / POC mode.

``nvflare provision -p project.yml -w WORKSPACE`` turns it into one startup kit per
participant (``WORKSPACE/<name>/prod_00/<participant>/startup``: certificates signed by
the project's root CA, ``fed_server.json`` / ``fed_client.json``, start scripts); the
same file drives POC mode (``nvflare poc prepare -i project.yml``). The participants are
the server, one client per site (the client name is the fedtab site name, which the
FLARE job's executor reads as ``site_name``) and one project admin who submits jobs.

The file is written as YAML by PyYAML (installed with NVIDIA FLARE); this module
imports nothing of FLARE.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

__all__ = ["BUILDERS", "project_config", "write_project"]

#: FLARE 2.9's standard builders (as in its ``dummy_project.yml``): workspace layout,
#: static configuration files, certificates from the project's own root CA, signatures.
BUILDERS: list[dict[str, Any]] = [
    {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
     "args": {"template_file": ["master_template.yml"]}},
    {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
    {"path": "nvflare.lighter.impl.cert.CertBuilder"},
    {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ADMIN = re.compile(r"^[A-Za-z0-9._+-]+@[A-Za-z0-9.-]+$")


def project_config(sites: Iterable[str], *, name: str = "fedtab", server: str = "localhost",
                   fed_learn_port: int = 8002, admin_port: int = 8003, org: str = "fedtab",
                   admin: str = "admin@fedtab.org", site_orgs: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``project.yml`` content (api_version 3) as a dict.

    Args:
        sites: client names, one per site (FLARE client name = fedtab site name).
        name: the project's name (the provisioned folder under the workspace).
        server: the server's host name as clients reach it (its certificate's name;
            ``localhost`` for POC on one machine).
        fed_learn_port, admin_port: the server's client and admin ports.
        org: the organisation of the server and the admin.
        admin: the project admin's e-mail-like name.
        site_orgs: organisation per site (default ``org``).

    Raises:
        ValueError: no site, a repeated name, a name FLARE rejects, equal ports.
    """
    sites = list(sites)
    if not sites:
        raise ValueError("a FLARE project needs at least one site")
    for label, value in [("project", name), ("server", server), *(("site", s) for s in sites)]:
        if not _NAME.match(value):
            raise ValueError(f"{label} name {value!r}: use letters, digits, '.', '_' or '-' (at most 63)")
    if len(set(sites)) != len(sites) or server in sites:
        raise ValueError(f"site and server names must be distinct: server {server!r}, sites {sites}")
    if not _ADMIN.match(admin):
        raise ValueError(f"admin {admin!r} must look like an e-mail address (FLARE's admin naming)")
    if fed_learn_port == admin_port:
        raise ValueError("fed_learn_port and admin_port must differ")
    orgs = dict(site_orgs or {})
    participants: list[dict[str, Any]] = [
        {"name": server, "type": "server", "org": org, "fed_learn_port": int(fed_learn_port),
         "admin_port": int(admin_port)},
        *({"name": s, "type": "client", "org": orgs.get(s, org)} for s in sites),
        {"name": admin, "type": "admin", "org": org, "role": "project_admin"},
    ]
    return {"api_version": 3, "name": name, "description": f"fedtab consortium: {', '.join(sites)}",
            "participants": participants, "builders": [dict(b) for b in BUILDERS]}


def write_project(path: str | Path, sites: Iterable[str], **options: Any) -> Path:
    """Write :func:`project_config` ``(sites, **options)`` to ``path`` as YAML; returns ``path``."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(project_config(sites, **options), sort_keys=False))
    return path
