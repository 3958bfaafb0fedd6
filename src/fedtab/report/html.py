"""``report.html``: one self-contained page a clinician can read, from a job's result data.

:func:`write_report` turns the ``result.json`` content of a job (or of ``fedtab impute`` /
``fedtab elect``) into one HTML file with no external request (no script, font, stylesheet
or image is fetched: CSS is inline, figures are base64 PNG ``data:`` URIs drawn by
:mod:`fedtab.report.plots`), and writes each figure as a PNG file beside it too. Every
string that comes from the sites (site and column names, class labels, reasons) is
escaped, so a column called ``<script>`` is shown as text, never run. Tables scroll
sideways inside narrow screens (``overflow-x:auto``) instead of widening the page.

Sections, each a ``<section id=...>`` with an ``<h2>`` heading (stable, for tests and
links; :data:`SECTIONS`, in page order; :data:`RENDERERS` draws each): ``verdict`` (the
federated model against each site alone and the majority class, in words,
:mod:`~fedtab.report.verdict`), ``metrics`` (with 95 % AUROC intervals,
:mod:`~fedtab.report.intervals`), ``baselines``, ``model`` (coefficients / odds ratios,
:mod:`~fedtab.report.model`), ``importance`` (gain of boosted trees, :mod:`~fedtab.report.importance`),
``sites``, ``disclosure`` (what left the sites in this run,
:mod:`~fedtab.report.disclosure`), ``guarantees``, ``imputation``, ``election``, ``tuning``,
``settings`` and ``deployment`` (:mod:`~fedtab.report.settings`), ``steps``. A section whose
data is absent says so in one line on the job's page; the pages of other commands
(:data:`TEMPLATES`: ``impute``, ``elect``) show only their own sections, and leave out those
with no data.

Result keys read (all optional): those of the job's ``result.json`` (``docs/job.md``) —
``sites`` (list of ``{name, rows, rows_train, rows_test, rows_without_label, columns}``; a site
with ``one_class`` true is named in the verdict and the sites section with what its
``participation`` record says it took part in),
``imputation`` (``validation_rmse_z.per_column``, ``mean_fill_rmse_z.per_column``,
``best_round``), ``election`` (``freedom_degree``, ``stats``, ``features``: ``{name,
selected, votes, rank, reason, chosen_by}``, and in a simulation ``pooled_agreement``:
``[{freedom_degree, jaccard, kept, pooled_kept}]`` from
:func:`fedtab.election.agreement.pooled_agreement`, shown as a table with
``id="pooled-agreement"``), ``tuning`` (``method``, ``freedom_degree``,
``score``, ``kept``, ``curve``), ``training`` (``model``), ``model``
(:func:`fedtab.report.model.model_summary`), ``evaluation`` (``pooled``,
``per_site``: :func:`fedtab.learn.metrics.evaluation_scores` dicts), ``baselines``
(:func:`fedtab.federation.steps.baselines.run_baselines`), ``privacy`` / ``trust`` /
``participation`` (:mod:`fedtab.job.guarantees`), ``schema`` (``classes``, ``ranges``,
``categories``), ``steps`` (``{name, seconds, bytes_down, bytes_up}``), ``engine``,
``deployment``, ``run_id``, ``fedtab_version``, ``created`` and ``job`` (or a command's ``settings``).
The names of the Python objects are accepted too: ``sites`` as ``{name: {...}}``, election
rows of :meth:`ElectionResult.explain` (``feature``, ``kept``, ``vote``, ``held_by``,
``selected_by``), ``training.metrics`` (``TrainingOutcome.metrics``), an imputation
``validation`` dict (``per_column``, ``per_column_mean_fill``) and ``step`` for ``name``.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from . import quality, run_sections
from .data import mapping, site_summaries
from .disclosure import disclosure, disclosure_summary
from .importance import importance_section
from .markup import collect_figures
from .markup import esc as _e
from .model import model_section
from .selection import selection_section
from .settings import deployment, job_settings
from .verdict import verdict

__all__ = ["write_report", "render_report", "site_summaries", "SECTIONS", "RENDERERS", "TEMPLATES"]

#: section id -> heading, in page order.
SECTIONS: dict[str, str] = {
    "verdict": "Verdict: did federating help?",
    "selection": "Model selection by cross-validation: columns, personalisation and each site's contribution",
    "metrics": "Model quality, pooled and per site",
    "baselines": "Did federating help? Baselines per site",
    "model": "The model: its settings, coefficients and odds ratios",
    "importance": "Feature importance by gain, pooled and per site",
    "sites": "Sites and their columns",
    "disclosure": "What left the sites in this run",
    "guarantees": "Privacy, trust and participation: what the server could learn, which sites took part",
    "imputation": "Imputation quality per column",
    "election": "Feature election: why each column was kept or dropped",
    "tuning": "Tuning of the freedom degree",
    "settings": "Job settings",
    "deployment": "Where it ran",
    "steps": "Traffic and time per step",
}

#: section id -> ``fn(result) -> HTML``
RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "verdict": verdict,
    "selection": selection_section,
    "metrics": quality.metrics,
    "baselines": quality.baselines,
    "model": model_section,
    "importance": importance_section,
    "sites": run_sections.sites,
    "disclosure": disclosure,
    "guarantees": run_sections.guarantees,
    "imputation": run_sections.imputation,
    "election": run_sections.election,
    "tuning": run_sections.tuning,
    "settings": job_settings,
    "deployment": deployment,
    "steps": run_sections.steps,
}


#: command -> the sections of its page (``None``: every section, absent ones noted); the pages
#: of other commands leave out sections without data.
TEMPLATES: dict[str, tuple[str, ...] | None] = {
    "run": None,
    "impute": ("sites", "disclosure", "guarantees", "imputation", "settings", "steps"),
    "elect": ("verdict", "election", "tuning", "metrics", "baselines", "model", "importance", "sites", "disclosure",
              "guarantees", "settings", "steps"),
}
_TITLES = {"run": "fedtab job report", "impute": "fedtab imputation report", "elect": "fedtab feature election report"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2a33;line-height:1.45;overflow-wrap:break-word}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:2px solid #2a9d8f;padding-bottom:.2em;margin-top:2em}
.scroll{overflow-x:auto;max-width:100%;margin:.8em 0} table{border-collapse:collapse;font-size:.92em}
th,td{border:1px solid #ccd5db;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef3f5} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.kept td{background:#eaf6f3} tr.dropped td{color:#6b7780} tr.better td .delta{color:#1f7a4d;font-weight:600}
tr.worse td .delta{color:#b23a2a;font-weight:600} p.absent{color:#6b7780;font-style:italic}
.note{color:#4a5a66;font-size:.9em} img{max-width:100%;height:auto} code{background:#f3f5f6;padding:0 .2em}
nav{display:flex;flex-wrap:wrap;gap:.2em 1em} .warn{color:#8a5a00} span.warn{font-weight:600;white-space:nowrap}
#verdict .headline{font-size:1.15em} ul.verdict{padding-left:1.2em} ul.verdict li{margin:.3em 0}
ul.verdict li.worse{color:#b23a2a} ul.verdict li.better{color:#1f7a4d} ul.verdict li.warn{color:#8a5a00}
.mark{font-weight:700;white-space:nowrap;margin-right:.3em} .default{color:#6b7780;font-style:italic}
p.disclosure{background:#f6f8f9;border-left:4px solid #2a9d8f;padding:.4em .8em}
td.text{min-width:14em}
@media (max-width:600px){body{margin:1em auto;padding:0 .6em} h1{font-size:1.3em} h2{font-size:1.15em}
th,td{padding:.25em .4em} table{font-size:.85em} td.text{min-width:12em}}
"""


def _sections(result: Mapping[str, Any], command: str) -> list[tuple[str, str]]:
    """``[(id, HTML)]`` of the page of ``command``."""
    if command not in TEMPLATES:
        raise ValueError(f"unknown report template {command!r}; known: {sorted(TEMPLATES)}")
    ids = TEMPLATES[command]
    out = [(sid, RENDERERS[sid](result)) for sid in (SECTIONS if ids is None else ids)]
    if ids is not None:
        out = [(sid, body) for sid, body in out if not body.startswith('<p class="absent">')]
    return out


def render_report(result: Mapping[str, Any], command: str = "run") -> str:
    """The report page of ``command`` (a :data:`TEMPLATES` key) as one HTML string (see the module
    docstring for what is read).

    Raises:
        ValueError: an unknown ``command``.
    """
    job = mapping(result.get("job"))
    title = job.get("title") or job.get("name") or _TITLES.get(command, "fedtab report")
    version = result.get("fedtab_version") or job.get("fedtab_version")
    created = result.get("created")
    sections = _sections(result, command)
    nav = "".join(f'<a href="#{sid}">{_e(SECTIONS[sid].split(":")[0])}</a>' for sid, _ in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1>",
        f'<p class="note">Federated run{" " + _e(result["run_id"]) if result.get("run_id") else ""} by '
        f'fedtab{" " + _e(version) if version else ""}'
        f'{" on " + _e(created) if created else ""}'
        f'{" (" + _e(result["engine"]) + " engine)" if result.get("engine") else ""}.</p>',
        f'<p class="disclosure" id="disclosure-summary">{disclosure_summary(result)}</p>',
        f"<nav>{nav}</nav></header>",
    ]
    parts += [f'<section id="{sid}"><h2>{_e(SECTIONS[sid])}</h2>{body}</section>' for sid, body in sections]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: Mapping[str, Any], path: str | Path, command: str = "run") -> Path:
    """Write :func:`render_report` of ``result`` to ``path`` (UTF-8; parent folders created) and
    each of its figures beside it as ``<stem>-<figure>.png`` (e.g. ``report-auroc-by-site.png``).
    A ``<stem>-*.png`` left there by an earlier report that this one does not draw is removed, so
    no stale figure sits beside the page.

    Returns the written page's path.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with collect_figures() as figures:
        page = render_report(result, command)
    out.write_text(page, encoding="utf-8")
    files = {out.parent / f"{out.stem}-{re.sub(r'[^A-Za-z0-9_-]+', '-', name)}.png": png for name, png in figures}
    for old in out.parent.glob(f"{glob.escape(out.stem)}-*.png"):
        if old not in files and old.is_file():
            old.unlink()
    for file, png in files.items():
        file.write_bytes(png)
    return out
