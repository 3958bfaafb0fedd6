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
* ``state/<site>/`` — each site's state folder (mode 0700), the ``state-dir`` of its printed
  SuperNode command: its ledger (rounds, evaluations and releases per run, DP ε spent per
  period) outlives runs and restarts there; a FLARE site keeps its own in
  ``local/fedtab-state`` (the ``state-dir`` of its ``local/fedtab-site.json``);
* ``flare/project.yml`` — the NVIDIA FLARE project for ``nvflare provision``;
* ``flare/sites/<site>/fedtab-site.json`` — each FLARE site's own configuration, for its kit's
  ``local/`` folder: its table (``--data``), its disclosure policy (the defaults, written out for
  the site to edit), its state folder and its identity files (names relative to ``local/``). A
  FLARE job is written by whoever submits it: the site reads this file, and a job's policy
  settings can only tighten it (:func:`fedtab.engines.site_config.own_over_job`);
* ``fab-guard/`` — the SuperNodes' ``flwr-clientapp`` and ``fab-hashes.json``
  (:mod:`fedtab.engines.flower_guard`): started with this folder first on ``PATH`` (as printed), a
  SuperNode runs only the FAB of the fedtab installed here and refuses any other FAB a server
  submits, before installing it; its node config sets ``require-fab-guard``;
* ``flwr/config.toml`` — the Flower connection ``consortium`` (the SuperLink's address and
  the absolute path of ``ca.pem``) for the ``flwr`` commands (``FLWR_HOME=OUT/flwr``).

Then prints the exact commands, with the absolute paths of the files it wrote: start the
SuperLink (bound to ``0.0.0.0`` when a ``--host`` other than loopback is named, else to
127.0.0.1), register the keys, start each SuperNode (each on its own ``--port``, so they
can share a trial machine) and run the job. Refuses to overwrite an existing CA unless ``--force``,
and refuses in one line an ``OUT`` that is not a writable folder, a FLARE port outside 1-65534 and
a ``--host`` that is neither an IP address nor a host name.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import PlainHelp, console, fail

__all__ = ["deploy_command", "flower_commands"]

COMMAND_SETTINGS = {"cls": PlainHelp}

#: the connection ``fedtab deploy`` writes into ``OUT/flwr/config.toml``
CONNECTION = "consortium"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


#: a site's state folder under ``OUT`` (its ledger, see :mod:`fedtab.privacy.ledger`)
STATE_FOLDER = "state"
#: the state folder a FLARE site keeps in its own ``local/`` (:data:`fedtab.engines.nvflare.STATE_FOLDER`)
FLARE_STATE_FOLDER = "fedtab-state"
#: a FLARE site's own configuration file in its kit's ``local/`` (:data:`fedtab.engines.nvflare.SITE_FILE`)
FLARE_SITE_FILE = "fedtab-site.json"
#: the Flower SuperNodes' FAB guard under ``OUT`` (:func:`fedtab.engines.flower_guard.write_fab_guard`)
GUARD_FOLDER = "fab-guard"
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def _node_config(site: str, data: str, keys, state_dir: Path | None = None,  # noqa: ANN001 - ConsortiumKeys
                 guarded: bool = False) -> str:
    """A SuperNode's ``--node-config``: its name, table, state folder and secure-aggregation identity
    (absolute paths), and ``require-fab-guard`` when its command runs with the FAB guard."""
    state = {} if state_dir is None else {"state-dir": str(state_dir)}
    guard = {"require-fab-guard": "true"} if guarded else {}
    cfg = {"name": site, "data-path": data, **state, **keys.identity_config(site), **guard}
    return " ".join(f"{k}={json.dumps(str(v))}" for k, v in cfg.items())


def _flare_site_files(root: Path, sites: list[str], data: dict[str, str]) -> Path:
    """``root/<site>/fedtab-site.json`` for every site (see the module docstring); returns ``root``."""
    from ..privacy.policy import DisclosurePolicy

    for s in sites:
        (root / s).mkdir(parents=True, exist_ok=True)
        own = {"data-path": data[s], "state-dir": FLARE_STATE_FOLDER, "identity-key": f"{s}.key",
               "consortium-keys": "site-keys.json", "root-certificates": "ca.pem",
               "policy": DisclosurePolicy().to_dict()}
        (root / s / FLARE_SITE_FILE).write_text(json.dumps(own, indent=2) + "\n")
    return root


def _fab_guard(folder: Path) -> tuple[str | None, Path | None]:
    """``(pinned FAB hash, guard folder)`` written by :func:`fedtab.engines.flower_guard.write_fab_guard`
    for the fedtab installed here; ``(None, None)`` without Flower."""
    try:
        from ..engines.flower_guard import fedtab_fab_hash, write_fab_guard

        pinned = fedtab_fab_hash()
    except ImportError:
        return None, None
    return pinned, write_fab_guard(folder, [pinned])


def flower_commands(keys, sites: list[str], *, address: str, bind: str, data: dict[str, str],  # noqa: ANN001
                    flwr_home: Path, database: Path, state: Path | None = None,
                    guard: Path | None = None) -> list[tuple[str, str]]:
    """``[(who, command line)]`` of a Flower consortium, in order, with absolute paths.

    ``who`` is ``coordinator``, ``site <name>`` or ``analyst``; SuperNode ``i`` listens on the
    SuperLink's port + 1 + ``i`` (several SuperNodes on one trial machine need their own port).
    With ``state`` (a folder), site ``s``'s node config sets ``state-dir`` = ``state/s``. With
    ``guard`` (a folder of :func:`fedtab.engines.flower_guard.write_fab_guard`), every SuperNode
    starts with it first on its ``PATH`` (its ClientApps run only the pinned FAB) and its node
    config sets ``require-fab-guard``.
    """
    path = "" if guard is None else f"PATH={shlex.quote(str(guard))}:$PATH "
    port = int(address.rsplit(":", 1)[1])
    q = shlex.quote
    out = [("coordinator", f"flower-superlink --ssl-ca-certfile {q(str(keys.ca_cert))} --ssl-certfile "
                           f"{q(str(keys.superlink_cert))} --ssl-keyfile {q(str(keys.superlink_key))} "
                           f"--enable-supernode-auth --host {bind} --port {port} --database {q(str(database))}")]
    out += [("coordinator", f"FLWR_HOME={q(str(flwr_home))} flwr supernode register "
                            f"{q(str(keys.site_public[s]))} {CONNECTION} --format json") for s in sites]
    out += [(f"site {s}", f"{path}flower-supernode --superlink {address} --root-certificates {q(str(keys.ca_cert))} "
                          f"--auth-supernode-private-key {q(str(keys.site_private[s]))} --port {port + 1 + i} "
                          f"--node-config {q(_node_config(s, data[s], keys, None if state is None else state / s, guard is not None))}")
            for i, s in enumerate(sites)]
    out.append(("analyst", f"fedtab run job.toml --engine flower --superlink {address} --root-certificates "
                           f"{q(str(keys.ca_cert))} --site-keys {q(str(keys.site_keys))}"))
    return out


def _write_flwr_config(home: Path, address: str, ca: Path) -> Path:
    """``home/config.toml``: the connection :data:`CONNECTION` (absolute CA path: Flower refuses a relative one)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                    f'address = {json.dumps(address)}\nroot-certificates = {json.dumps(str(ca.resolve()))}\n')
    return path


def _data_paths(site: list[str], data: list[str]) -> dict[str, str]:
    out = {}
    for item in data:
        name, sep, path = item.partition("=")
        if not sep or name not in site or not path:
            fail(f"--data {item!r}: give SITE=PATH for one of the sites {', '.join(site)}")
        out[name] = str(Path(path).expanduser().resolve())
    return {s: out.get(s, f"/data/{s}.csv") for s in site}


def _checked_out(out: Path) -> Path:
    """``OUT`` made absolute, or a one-line failure: not a folder, not writable, not a usable path."""
    from ..report.output import OutputError, check_writable

    try:
        out = out.expanduser().resolve()
        check_writable(out)
        if out.is_dir():  # the files go inside OUT itself
            check_writable(out / ".fedtab-deploy-probe")
    except OutputError as exc:
        fail(f"OUT {exc}")
    except (OSError, ValueError) as exc:  # a path the platform refuses (a NUL byte, too long ...)
        fail(f"OUT {str(out)!r} is not a usable path: {getattr(exc, 'strerror', None) or exc}")
    return out


def _check_options(hosts: list[str], flare_port: int) -> None:
    """One-line failures for a ``--host`` that is no IP address or host name and a FLARE port out of range."""
    import ipaddress

    for h in hosts:
        try:
            ipaddress.ip_address(h)
        except ValueError:
            if not _HOST.match(h):
                fail(f"--host {h!r} is neither an IP address nor a host name")
    if not 1 <= flare_port <= 65534:
        fail(f"--flare-port {flare_port} must be in 1-65534 (the admin port is --flare-port + 1)")


def _state_folders(root: Path, sites: list[str]) -> Path:
    """``root/<site>`` for every site, created with mode 0700 (a site's ledger); returns ``root``."""
    import os

    for s in sites:
        (root / s).mkdir(parents=True, exist_ok=True)
        os.chmod(root / s, 0o700)
    return root


def deploy_command(
    out: Annotated[Path, typer.Argument(help="Folder for the keys, certificates and FLARE project.")],
    site: Annotated[list[str], typer.Option("--site", help="A site name (repeat for each site).")],
    host: Annotated[Optional[list[str]], typer.Option(
        "--host", help="Host name or IP the SuperLink is reached at (repeatable; 127.0.0.1 and localhost "
                       "are always included). The first is the address in the printed commands.")] = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65000, help="The SuperLink's port (SuperNode i "
                                                                       "listens on port + 1 + i).")] = 9093,
    data: Annotated[Optional[list[str]], typer.Option(
        "--data", help="SITE=PATH: the table a site reads, for its printed SuperNode command and its FLARE fedtab-site.json (repeatable; "
                       "default /data/SITE.csv).")] = None,
    days: Annotated[int, typer.Option("--days", min=1, help="Validity of the certificates in days.")] = 365,
    flare_server: Annotated[str, typer.Option("--flare-server", help="FLARE server host name.")] = "localhost",
    flare_port: Annotated[int, typer.Option("--flare-port", help="FLARE server port for clients "
                                                                 "(admin port = this + 1).")] = 8002,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing CA in OUT.")] = False,
) -> None:
    """Generate a CA, the SuperLink certificate, one key pair per site, the flwr connection and a
    FLARE project.yml, and print the commands that run them."""
    from ..deploy.flare_project import write_project
    from ..deploy.keys import write_consortium_keys

    out = _checked_out(out)
    if (out / "ca.key").exists() and not force:
        fail(f"{out / 'ca.key'} exists: a new CA would invalidate every issued certificate (use --force)")
    _check_options(host or [], flare_port)
    paths = _data_paths(site, data or [])
    try:
        keys = write_consortium_keys(out, site, hosts=host or [], days=days)
        project = write_project(out / "flare" / "project.yml", site, server=flare_server,
                                fed_learn_port=flare_port, admin_port=flare_port + 1)
        state = _state_folders(out / STATE_FOLDER, site)
        flare_sites = _flare_site_files(out / "flare" / "sites", site, paths)
        pinned, guard = _fab_guard(out / GUARD_FOLDER)
        address = f"{(host or ['127.0.0.1'])[0]}:{port}"
        config = _write_flwr_config(out / "flwr", address, keys.ca_cert)
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the deployment into {out}: {exc.strerror or exc}")
    bind = "127.0.0.1" if set(host or []) <= _LOOPBACK else "0.0.0.0"
    say = lambda text: console.print(text, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    say(f"wrote {keys.folder}: ca.pem, superlink.pem/.key, sites/<site>.key/.pub, site-keys.json(.sig), "
        f"{config.relative_to(out)}, {project.relative_to(out)}, {STATE_FOLDER}/<site>/ (each site's state folder: "
        f"its ledger of rounds, evaluations, releases and DP budget, kept across runs)")
    say("\nFlower (docs/deployment.md); each command in its own terminal, in this order. A site that runs "
        f"its SuperNode elsewhere copies ca.pem, site-keys.json, site-keys.json.sig and sites/<site>.key "
        f"there and changes {out} in its command to that folder (its state-dir: a folder of its own that outlives "
        f"runs; without one its DP budget and caps start afresh in every run).")
    if guard is None:
        say("Flower is not installed here: no FAB guard was written (pip install 'fedtab[flower]' and run "
            "fedtab deploy again); the SuperNode commands below run any FAB the server submits.")
    else:
        say(f"Each SuperNode runs only fedtab's Flower app (FAB sha256 {pinned}, built from the fedtab installed here; "
            f"the analyst must run the same version): {guard}/flwr-clientapp refuses any other FAB before installing "
            "it. A site on another machine makes its own guard with python -c \"from fedtab.engines.flower_guard import "
            f"write_fab_guard; write_fab_guard('/etc/fedtab/fab-guard', ['{pinned}'])\" and puts that folder first on "
            "its SuperNode's PATH.")
    if bind == "0.0.0.0":
        say(f"The SuperLink listens on every interface: open TCP port {port} in the coordinator's firewall "
            "to the sites' and the analyst's addresses only.")
    for who, line in flower_commands(keys, site, address=address, bind=bind, data=paths, flwr_home=out / "flwr",
                                     database=out / "superlink.db", state=state, guard=guard):
        say(f"# {who}:\n  {line}")
    _print_flare(site, project, flare_server, say, flare_sites)


def _print_flare(site: list[str], project: Path, flare_server: str, say, sites: Path) -> None:  # noqa: ANN001
    say("\nNVIDIA FLARE (docs/deployment.md); the kits' start.sh runs the python3 on PATH, which must have "
        "fedtab[nvflare] installed:")
    ws = project.parent / "workspace"
    kits = f"{ws}/fedtab/prod_00"
    for line in [f"nvflare provision -p {project} -w {ws}",
                 f"(every participant:) python -c \"from fedtab.engines.nvflare import allow_fedtab_components as a; "
                 f"a('{kits}/<participant>')\"",
                 *(f"(site {s}:) copy {sites}/{s}/{FLARE_SITE_FILE}, ca.pem, site-keys.json, site-keys.json.sig and "
                   f"sites/{s}.key into {kits}/{s}/local/ ({FLARE_SITE_FILE}: the site's own table, disclosure policy, "
                   f"state folder and identity; edit its data-path and policy there: a job can only tighten them)"
                   for s in site),
                 f"{kits}/{flare_server}/startup/start.sh",
                 *(f"(site {s}:) {kits}/{s}/startup/start.sh" for s in site),
                 f"fedtab run job.toml --engine nvflare --flare-project {kits}/admin@fedtab.org"]:
        say("  " + line)
