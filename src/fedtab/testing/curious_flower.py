"""A curious server as a Flower app: it sends the requests its run config lists, whatever they are.

For tests of what a site keeps across real ``flwr run`` s (its ledger, issue 28 item 6): the
server of a consortium chooses the ServerApp it submits, so a test submits this one to a
loopback deployment (:class:`fedtab.engines.flower_deploy.LoopbackDeployment`) with
``dep.run(run_config={"probe": probe_plan(...)}, app=write_app(folder))``. The sites still run
fedtab's own ClientApp (:data:`fedtab.engines.flower.client_app`).

The run config's ``probe`` is JSON: a list of *groups*, each a list of requests
``{"kind": ..., "arrays": {name: nested list}, "meta": {...}}``. The requests of a group go to
every site one after another; a site that refuses one (or answers with an error) is asked
nothing more in that group. The result has, per group and site, ``answered`` (requests
answered before the refusal) and ``reason`` (the refusal's or error's text, ``""`` when every
request was answered).

Needs the ``flower`` extra (it imports :mod:`fedtab.engines.flower`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.engines.flower import app_dir, make_server_app
from fedtab.federation.protocol import Federation
from fedtab.federation.protocol.messages import Message

__all__ = ["RUN_CONFIG_KEY", "probe_plan", "probe_workflow", "server_app", "write_app"]

#: the run-config key holding the probe's groups of requests (JSON text)
RUN_CONFIG_KEY = "probe"


def probe_plan(groups: Sequence[Sequence[Message]]) -> str:
    """The run config's ``probe`` text for ``groups`` of requests (arrays as nested lists of floats)."""
    return json.dumps([[{"kind": m.kind, "meta": m.meta,
                         "arrays": {k: np.asarray(a, dtype=float).tolist() for k, a in m.arrays.items()}}
                        for m in group] for group in groups])


def _groups(text: str) -> list[list[Message]]:
    """Inverse of :func:`probe_plan`. Raises ValueError: not a list of lists of requests."""
    data = json.loads(text or "[]")
    if not isinstance(data, list) or not all(isinstance(g, list) for g in data):
        raise ValueError("run config 'probe' must be a JSON list of lists of requests")
    return [[Message(str(r["kind"]), {k: np.asarray(v, dtype=float) for k, v in r.get("arrays", {}).items()},
                     dict(r.get("meta", {}))) for r in group] for group in data]


def probe_workflow(federation: Federation, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Send the run config's ``probe`` groups (see the module docstring); returns
    ``{"groups": [{site: {"answered": int, "reason": str}}]}``."""
    out = []
    for group in _groups(str(run_config.get(RUN_CONFIG_KEY, ""))):
        seen = {s: {"answered": 0, "reason": ""} for s in federation.sites}
        for request in group:
            live = [s for s, v in seen.items() if not v["reason"]]
            if not live:
                break
            for site, reply in federation.ask({s: request for s in live}).items():
                if reply.is_refusal or reply.is_error:
                    seen[site]["reason"] = str(reply.meta.get("reason") or reply.meta.get("error") or reply.kind)
                else:
                    seen[site]["answered"] += 1
        out.append(seen)
    return {"groups": out}


server_app = make_server_app(probe_workflow)


def write_app(folder: str | Path) -> Path:
    """Write the probe's Flower app directory into ``folder`` (created): fedtab's app metadata
    with this module's ServerApp and one more run-config key, ``probe``. Returns ``folder``."""
    text = (app_dir() / "pyproject.toml").read_text()
    text, n = re.subn(r'^serverapp = ".*"$', f'serverapp = "{__name__}:server_app"', text, flags=re.M)
    if n != 1 or "[tool.flwr.app.config]" not in text:
        raise RuntimeError("fedtab's Flower app pyproject.toml has no serverapp component to replace")
    text = text.replace("[tool.flwr.app.config]", f'[tool.flwr.app.config]\n{RUN_CONFIG_KEY} = ""', 1)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(text)
    return folder
