"""The job's settings (``result["job"]``) and where it ran (``engine`` + ``result["deployment"]``).

Settings are shown as they were run: one row per setting, ``section.key = value``, a step
that was not run (``null``) as one row "not run", the sites as a table of their own. The
deployment block names the engine, how it ran (in this process, a simulator, a SuperLink,
a FLARE project) and the identities the run recorded (fedtab's run id ``result["run_id"]``,
SuperLink address, Flower run id, the server's identity, FLARE job id, excluded nodes).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .data import mapping
from .markup import absent, esc, table

__all__ = ["job_settings", "deployment", "flatten"]

_STEP_SECTIONS = ("impute", "election", "training")
_SKIP = {"source"}


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted key, leaf value)]`` of nested mappings (lists are leaves)."""
    if isinstance(value, Mapping) and value:
        return [kv for k, v in value.items() for kv in flatten(v, f"{prefix}{k}.")]
    return [(prefix[:-1], value)]


def _value(v: Any) -> str:
    if v is None:
        return '<span class="default">default</span>'
    if isinstance(v, bool):
        return f"<code>{'true' if v else 'false'}</code>"
    if isinstance(v, (dict, list)):
        return f"<code>{esc(json.dumps(v))}</code>"
    return f"<code>{esc(v)}</code>"


def job_settings(result: Mapping[str, Any]) -> str:
    """The ``settings`` section's HTML."""
    job = mapping(result.get("job"))
    if not job and mapping(result.get("settings")):  # a command's own settings (fedtab impute)
        return table(["Setting", "Value"], [[esc(k), _value(v)] for k, v in result["settings"].items()],
                     table_id="settings-table")
    if not job:
        return absent("The job's settings are not in this result.")
    out = ['<p class="note">The settings this run used (the job file with every default filled in; '
           "“default” = the value the step chooses itself).</p>"]
    rows = []
    for key, v in job.items():
        if key in _SKIP or key == "sites":
            continue
        if v is None and key in _STEP_SECTIONS:
            rows.append([esc(key), '<span class="default">not run</span>'])
            continue
        rows += [[esc(k), _value(x)] for k, x in flatten(v, f"{key}.")]
    out.append(table(["Setting", "Value"], rows, table_id="settings-table"))
    sites = [s for s in job.get("sites") or [] if isinstance(s, Mapping)]
    if sites:
        keys = list(dict.fromkeys(k for s in sites for k in s if k != "name"))
        out.append(table(["Site", *keys], [[esc(s.get("name", "")), *(_value(s.get(k)) for k in keys)] for s in sites]))
    return "".join(out)


_HOW = {"local": "every site in this process (the in-process engine)",
        "flower": "Flower: ServerApp and ClientApps in this process",
        "nvflare": "NVIDIA FLARE's simulator"}


def deployment(result: Mapping[str, Any]) -> str:
    """The ``deployment`` section's HTML."""
    engine = result.get("engine")
    dep = mapping(result.get("deployment"))
    if engine is None and not dep and not result.get("run_id"):
        return absent("This result does not say which engine ran it.")
    how = _HOW.get(str(engine), str(engine))
    if dep.get("superlink"):
        how = f"Flower deployment: the SuperLink at {dep['superlink']} and one SuperNode per site"
    elif "flare_job_id" in dep:
        how = "NVIDIA FLARE deployment: a provisioned FLARE server and one client per site"
    rows = [["Engine", f"<code>{esc(engine)}</code>"], ["How it ran", esc(how)]]
    if result.get("run_id"):  # fedtab's own id of the run (result.json, MLflow's fedtab.run_id tag)
        rows.insert(0, ["fedtab run id", f"<code>{esc(result['run_id'])}</code>"])
    labels = {"superlink": "SuperLink address", "run_id": "Flower run id", "identity": "Server identity",
              "flare_job_id": "FLARE job id", "excluded_nodes": "Nodes excluded"}
    for k, v in dep.items():
        if k == "superlink" or v in (None, {}, []):
            continue
        rows.append([esc(labels.get(k, k)), _value(v)])
    version = result.get("fedtab_version")
    if version:
        rows.append(["fedtab version", f"<code>{esc(version)}</code>"])
    if result.get("created"):
        rows.append(["Finished", esc(result["created"])])
    return table(["Item", "Value"], rows, table_id="deployment-table")
