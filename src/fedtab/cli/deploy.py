"""``fedtab deploy OUT --site A --site B ...``: a consortium's deployment material.

Writes into ``OUT``:

* ``ca.pem`` / ``ca.key`` — the consortium's CA (keep ``ca.key`` offline);
* ``superlink.pem`` / ``superlink.key`` — the Flower SuperLink's TLS certificate, valid for
  127.0.0.1, ``localhost`` and every ``--host``;
* ``sites/<site>.key`` / ``sites/<site>.pub`` — each site's SuperNode authentication key
  pair (the ``.key`` goes to that site only; the ``.pub`` is registered with
  ``flwr supernode register``);
* ``site-keys.json`` — ``{site: public-key fingerprint}``; its path (on the SuperLink's
  machine) or content is the ``site-keys`` run-config value that binds each site name to
  its key;
* ``site-keys.json.sig`` — the CA's signature of ``site-keys.json``: every site gets both
  files and ``ca.pem``, checks the signature, and trusts only that list's keys for secure
  aggregation (node-config ``identity-key``, ``consortium-keys``, ``root-certificates``;
  a site's authentication key is also its identity key);
* ``flare/project.yml`` — the NVIDIA FLARE project for ``nvflare provision``.

Then prints the commands that start the SuperLink, register the keys, start each
SuperNode and run the job. Refuses to overwrite an existing CA unless ``--force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import console, fail

__all__ = ["deploy_command"]


def _identity(site: str) -> str:
    """A site's secure-aggregation node-config keys, as paths at that site."""
    return (f"identity-key='<dir>/{site}.key' consortium-keys='<dir>/site-keys.json' "
            "root-certificates='<dir>/ca.pem'")


def deploy_command(
    out: Annotated[Path, typer.Argument(help="Folder for the keys, certificates and FLARE project.")],
    site: Annotated[list[str], typer.Option("--site", help="A site name (repeat for each site).")],
    host: Annotated[Optional[list[str]], typer.Option(
        "--host", help="Host name or IP the SuperLink is reached at (repeatable; 127.0.0.1 and localhost "
                       "are always included).")] = None,
    days: Annotated[int, typer.Option("--days", min=1, help="Validity of the certificates in days.")] = 365,
    flare_server: Annotated[str, typer.Option("--flare-server", help="FLARE server host name.")] = "localhost",
    flare_port: Annotated[int, typer.Option("--flare-port", help="FLARE server port for clients "
                                                                 "(admin port = this + 1).")] = 8002,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing CA in OUT.")] = False,
) -> None:
    """Generate a CA, the SuperLink certificate, one key pair per site and a FLARE project.yml."""
    from ..deploy.flare_project import write_project
    from ..deploy.keys import write_consortium_keys

    if (out / "ca.key").exists() and not force:
        fail(f"{out / 'ca.key'} exists: a new CA would invalidate every issued certificate (use --force)")
    try:
        keys = write_consortium_keys(out, site, hosts=host or [], days=days)
        project = write_project(out / "flare" / "project.yml", site, server=flare_server,
                                fed_learn_port=flare_port, admin_port=flare_port + 1)
    except ValueError as exc:
        fail(str(exc))
    address = f"{(host or ['127.0.0.1'])[0]}:9093"
    console.print(f"wrote {keys.folder}: ca.pem, superlink.pem/.key, sites/<site>.key/.pub, site-keys.json(.sig), "
                  f"{project.relative_to(out)}", highlight=False)
    console.print("each site keeps in one folder <dir>: ca.pem, site-keys.json, site-keys.json.sig and its own "
                  "sites/<site>.key (absolute paths in the node config)", highlight=False)
    console.print("\n[bold]Flower[/] (see docs/deployment.md):", highlight=False)
    lines = [
        f"flower-superlink --ssl-ca-certfile {keys.ca_cert} --ssl-certfile {keys.superlink_cert} "
        f"--ssl-keyfile {keys.superlink_key} --enable-supernode-auth --port {address.rsplit(':', 1)[1]}",
        *(f"flwr supernode register {keys.site_public[s]} <connection>" for s in site),
        *(f"(site {s}:) flower-supernode --superlink {address} --root-certificates ca.pem "
          f"--auth-supernode-private-key {s}.key --node-config \"name='{s}' data-path='...' {_identity(s)}\""
          for s in site),
        f"fedtab run job.toml --engine flower --superlink {address} --root-certificates {keys.ca_cert} "
        f"--site-keys {keys.site_keys}",
    ]
    for line in lines:
        console.print("  " + line, highlight=False, soft_wrap=True)
    console.print("\n[bold]NVIDIA FLARE[/] (see docs/deployment.md):", highlight=False)
    kits = "<workspace>/fedtab/prod_00"
    for line in [f"nvflare provision -p {project} -w <workspace>",
                 f"(every participant:) python -c \"from fedtab.engines.nvflare import allow_fedtab_components as a; "
                 f"a('{kits}/<participant>')\"",
                 *(f"(site {s}:) copy those files into {kits}/{s}/local/ and write "
                   f"{kits}/{s}/local/fedtab-identity.json: "
                   f"{{\"identity-key\": \"{s}.key\", \"consortium-keys\": \"site-keys.json\", "
                   f"\"root-certificates\": \"ca.pem\"}}" for s in site),
                 f"{kits}/{flare_server}/startup/start.sh",
                 *(f"(site {s}:) {kits}/{s}/startup/start.sh" for s in site),
                 f"fedtab run job.toml --engine nvflare --flare-project {kits}/admin@fedtab.org"]:
        console.print("  " + line, highlight=False, soft_wrap=True)
