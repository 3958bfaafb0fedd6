"""A SuperNode that runs only the Flower app its site pinned (issue 28: the server chooses the FAB).

On Flower the app a SuperNode runs — its FAB, with the ``clientapp`` it names — is built and
submitted by whoever starts the run, i.e. the server's side. A curious server could ship a FAB
whose ``clientapp`` is not fedtab's (or that carries a ``fedtab`` package of its own, which Flower
puts first on ``sys.path``), and its code would run at the site, next to the site's table.

What Flower 1.42 offers a SuperNode against this, and why fedtab does not rely on it:

* ``flower-supernode --trusted-entities FILE`` verifies a FAB's Ed25519 signatures, but the
  signatures it checks are the *Flower Hub*'s verification records (``flwr app review``), which
  the SuperLink attaches only to apps it fetched from the Hub; a FAB submitted with ``flwr run
  <folder>`` has none, so such a SuperNode refuses every locally built app, fedtab's included.
  It is usable only by a consortium that publishes its app on Flower Hub and signs it there.
* There is no allow-list of FAB hashes, and ``--isolation process`` only moves the start of the
  same ``flwr-clientapp`` process to a SuperExec the operator runs.

So fedtab pins the app where the site controls the code that runs: ``flwr-clientapp``, the
command Flower's SuperExec starts (found on ``PATH``) for every message. :func:`write_fab_guard`
writes a ``flwr-clientapp`` of the site's own into a folder, with the SHA-256 hashes of the FABs
the site accepts (by default the FAB of the fedtab it has installed, :func:`fedtab_fab_hash`);
started with that folder first on its ``PATH`` (``fedtab deploy`` prints the command), the
SuperNode's ClientApp processes run :func:`main`, which hashes the FAB it pulled and refuses one
that is not pinned **before it is installed or any of its code imported**: the reply is an error
naming the refused hash, and the server learns nothing else. The check never trusts the hash the
SuperLink states; it hashes the bytes.

What it cannot do: it does not stop a server that controls the site's machine or its
``PATH``, nor a SuperNode started without the folder (:func:`main` sets
``FEDTAB_FAB_CHECKED`` in its process, and a ClientApp whose node config sets
``require-fab-guard = true`` refuses to answer without it, which catches a missing ``PATH``
only while the FAB is fedtab's). A FAB that replaces the ClientApp is stopped only here, in the
site's ``flwr-clientapp``; nothing inside fedtab's ClientApp can stop it, because that code is
then not run.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["CHECKED_ENV", "FabRefused", "GUARD_COMMAND", "PINS_FILE", "check_fab", "fedtab_fab_hash", "install_guard",
           "load_pins", "main", "write_fab_guard"]

#: the command Flower's SuperExec starts for every ClientApp message (found on ``PATH``)
GUARD_COMMAND = "flwr-clientapp"
#: the pinned hashes next to the guard: ``{"fab-sha256": [hex, ...]}``
PINS_FILE = "fab-hashes.json"
#: set by :func:`main` in its process to the hash of the FAB it checked
CHECKED_ENV = "FEDTAB_FAB_CHECKED"


class FabRefused(RuntimeError):
    """The FAB a run asks this site to execute is not one the site pinned."""


def fedtab_fab_hash(app: str | Path | None = None) -> str:
    """SHA-256 (hex) of the FAB ``flwr run`` builds from ``app`` (default: the Flower app of the
    installed fedtab, ``fedtab/engines/flower_app``): Flower builds a FAB with fixed file dates,
    so the same app folder always gives the same hash.

    Raises:
        ValueError: ``app`` is not a Flower app folder Flower can build.
    """
    from flwr.cli.build import build_fab_from_disk

    folder = Path(app) if app is not None else Path(__file__).resolve().parent / "flower_app"
    return hashlib.sha256(build_fab_from_disk(folder)).hexdigest()


def check_fab(content: bytes, pinned: Iterable[str]) -> str:
    """The SHA-256 (hex) of the FAB ``content`` if it is one of ``pinned``.

    Raises:
        FabRefused: it is not (or nothing is pinned), naming the hash.
    """
    digest = hashlib.sha256(bytes(content)).hexdigest()
    allowed = {str(h).strip().lower() for h in pinned}
    if digest not in allowed:
        raise FabRefused(f"this site runs only the Flower apps it pinned ({len(allowed)} FAB hash(es)); the run's FAB "
                         f"has sha256 {digest}, which is not one of them: refused before installing or loading it")
    return digest


def load_pins(path: str | Path) -> list[str]:
    """The pinned hashes of a :data:`PINS_FILE` (``{"fab-sha256": [hex, ...]}``).

    Raises:
        ValueError: unreadable, not that shape, or a value that is not 64 hex digits.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the pinned FAB hashes: {exc}") from None
    hashes = doc.get("fab-sha256") if isinstance(doc, dict) else None
    if not isinstance(hashes, list) or not all(isinstance(h, str) and len(h) == 64 and
                                               all(c in "0123456789abcdefABCDEF" for c in h) for h in hashes):
        raise ValueError(f'{path}: must be {{"fab-sha256": [64 hex digits, ...]}}')
    return [h.lower() for h in hashes]


def write_fab_guard(folder: str | Path, hashes: Iterable[str] | None = None, *,
                    python: str | Path | None = None) -> Path:
    """Write the site's ``folder/flwr-clientapp`` (executable, running :func:`main` with this
    ``python``, default this interpreter) and ``folder/``:data:`PINS_FILE`; returns ``folder``,
    which the SuperNode's ``PATH`` must list first.

    ``hashes``: the FABs the site accepts (default: :func:`fedtab_fab_hash`, the app of the
    fedtab installed here; the analyst must run the same fedtab version).

    Raises:
        ValueError: a hash that is not 64 hex digits.
    """
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    pins = list(hashes) if hashes is not None else [fedtab_fab_hash()]
    (folder / PINS_FILE).write_text(json.dumps({"fab-sha256": pins}, indent=2) + "\n")
    load_pins(folder / PINS_FILE)  # refuses a malformed hash now, not at the first message
    script = folder / GUARD_COMMAND
    script.write_text(f"#!{Path(python or sys.executable)}\n"
                      "# fedtab's FAB guard: runs Flower's flwr-clientapp only for a pinned FAB (fedtab.engines.flower_guard)\n"
                      "import sys\n"
                      "from fedtab.engines.flower_guard import main\n"
                      f"sys.exit(main({str(folder / PINS_FILE)!r}))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def install_guard(pinned: Iterable[str], runtime: Any = None) -> Callable[..., Any]:
    """Make Flower's ClientApp runner (``flwr.supernode.runtime.run_clientapp``, or ``runtime``)
    check every FAB against ``pinned`` before it installs it; returns the checking function.

    On a pinned FAB it sets :data:`CHECKED_ENV` and installs it as Flower does; on any other it
    raises :class:`FabRefused`, which Flower's runner turns into an error reply to the server.
    """
    if runtime is None:
        from flwr.supernode.runtime import run_clientapp as runtime
    allowed = list(pinned)
    install = runtime.install_from_fab

    def install_pinned(fab_file: Any, *args: Any, **kwargs: Any) -> Any:
        content = fab_file if isinstance(fab_file, (bytes, bytearray)) else Path(fab_file).read_bytes()
        os.environ[CHECKED_ENV] = check_fab(content, allowed)
        return install(fab_file, *args, **kwargs)

    runtime.install_from_fab = install_pinned
    return install_pinned


def main(pins_file: str | Path) -> int:
    """The site's ``flwr-clientapp``: Flower's, with the FAB checked against ``pins_file`` first.
    An unreadable pins file refuses every FAB (the error says why)."""
    try:
        pinned = load_pins(pins_file)
    except ValueError as exc:
        print(f"fedtab FAB guard: {exc}; every FAB is refused", file=sys.stderr)
        pinned = []
    install_guard(pinned)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    flwr_clientapp()  # exits with Flower's own status
    return 0
