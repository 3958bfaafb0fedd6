"""``report.html``: one self-contained page a clinician can read, from a job's result data.

:func:`write_report` turns the ``result.json`` content of a job into one HTML file with
no external request (no script, font, stylesheet or image is fetched: CSS is inline,
figures are base64 PNG ``data:`` URIs drawn by :mod:`fedtab.report.plots`). Every
string that comes from the sites (site and column names, class labels, reasons) is
escaped, so a column called ``<script>`` is shown as text, never run.

Sections, each a ``<section id=...>`` with an ``<h2>`` heading (stable, for tests and
links; :data:`SECTIONS`): ``sites``, ``guarantees``, ``imputation``, ``election``, ``tuning``,
``metrics``, ``baselines``, ``steps``. A section whose data is absent says so in one line.

Result keys read (all optional): those of the job's ``result.json`` (``docs/job.md``) —
``sites`` (list of ``{name, rows, rows_train, rows_test, rows_without_label, columns}``),
``imputation`` (``validation_rmse_z.per_column``, ``mean_fill_rmse_z.per_column``,
``best_round``), ``election`` (``freedom_degree``, ``stats``, ``features``: ``{name,
selected, votes, rank, reason, chosen_by}``, and in a simulation ``pooled_agreement``:
``[{freedom_degree, jaccard, kept, pooled_kept}]`` from
:func:`fedtab.election.agreement.pooled_agreement`, shown as a table with
``id="pooled-agreement"``), ``tuning`` (``method``, ``freedom_degree``,
``score``, ``kept``, ``curve``), ``training`` (``model``), ``evaluation`` (``pooled``,
``per_site``: :func:`fedtab.learn.metrics.evaluation_scores` dicts), ``baselines``
(:func:`fedtab.federation.baseline_flow.run_baselines`), ``privacy`` / ``trust`` /
``participation`` (:mod:`fedtab.job.guarantees`), ``schema.classes``, ``steps``
(``{name, seconds, bytes_down, bytes_up}``), ``fedtab_version`` and ``job``. The names of
the Python objects are accepted too: ``sites`` as ``{name: {...}}``, election rows of
:meth:`ElectionResult.explain` (``feature``, ``kept``, ``vote``, ``held_by``,
``selected_by``), ``training.metrics`` (``TrainingOutcome.metrics``), an imputation
``validation`` dict (``per_column``, ``per_column_mean_fill``) and ``step`` for ``name``.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .selection import selection_section

__all__ = ["write_report", "render_report", "site_summaries", "SECTIONS"]

#: section id -> heading, in page order.
SECTIONS: dict[str, str] = {
    "sites": "Sites and their columns",
    "guarantees": "Privacy, trust and participation: what the server could learn, which sites took part",
    "imputation": "Imputation quality per column",
    "election": "Feature election: why each column was kept or dropped",
    "tuning": "Tuning of the freedom degree",
    "selection": "Model selection by cross-validation: columns, personalisation and each site's contribution",
    "metrics": "Model quality, pooled and per site",
    "baselines": "Did federating help? Baselines per site",
    "steps": "Traffic and time per step",
}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2a33;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:2px solid #2a9d8f;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em} th,td{border:1px solid #ccd5db;padding:.3em .6em;
text-align:left} th{background:#eef3f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.kept td{background:#eaf6f3} tr.dropped td{color:#6b7780} tr.better td.delta{color:#1f7a4d;font-weight:600}
tr.worse td.delta{color:#b23a2a;font-weight:600} p.absent{color:#6b7780;font-style:italic}
.note{color:#4a5a66;font-size:.9em} img{max-width:100%;height:auto} code{background:#f3f5f6;padding:0 .2em}
nav a{margin-right:1em}
"""


def _e(value: Any) -> str:
    """Escaped text of ``value`` (every site-derived string goes through here)."""
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return _e(value)
    if not math.isfinite(v):
        return "—"
    return f"{v:.{digits}f}"


def _bound(value: Any) -> str:
    """An error bound: 0 as "0", tiny ones as "< 0.0001", else 4 decimals."""
    if value is None:
        return "—"
    v = float(value)
    return "0" if v == 0 else "< 0.0001" if v < 1e-4 else f"{v:.4f}"


def _bytes(n: Any) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], row_classes: Iterable[str] | None = None,
           num_cols: Iterable[int] = ()) -> str:
    """An HTML table; ``header`` is escaped, cells must already be HTML (escaped)."""
    nums = set(num_cols)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    classes = list(row_classes) if row_classes is not None else None
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in nums else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _absent(what: str) -> str:
    return f'<p class="absent">{_e(what)}</p>'


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{_e(alt)}">' if uri.startswith("data:image/png;base64,") else ""


# --------------------------------------------------------------------------- sections
def site_summaries(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The sites as ``{name, columns, rows, rows_train, rows_test, rows_without_label}`` dicts."""
    sites = result.get("sites")
    if isinstance(sites, Mapping):
        sites = [{"name": k, **(v if isinstance(v, Mapping) else {})} for k, v in sites.items()]
    out = []
    for s in sites or []:
        s = {"name": s} if isinstance(s, str) else dict(s) if isinstance(s, Mapping) else None
        if s is None:
            continue
        for old, new in (("n_rows", "rows"), ("n_train", "rows_train"), ("n_test", "rows_test"),
                         ("dropped_unlabelled", "rows_without_label")):
            s.setdefault(new, s.get(old))
        s["columns"] = list(s.get("columns") or [])
        out.append(s)
    return out


def _sites(result: Mapping[str, Any]) -> str:
    sites = site_summaries(result)
    if not sites:
        return _absent("No site information in this result.")
    out = [_table(["Site", "Rows", "Training rows", "Test rows", "Rows without a label (dropped)", "Columns held"],
                  [[_e(s["name"]), _num(s.get("rows")), _num(s.get("rows_train")), _num(s.get("rows_test")),
                    _num(s.get("rows_without_label")), _num(len(s["columns"]))] for s in sites],
                  num_cols=range(1, 6))]
    schema = result.get("schema") if isinstance(result.get("schema"), Mapping) else {}
    union = list(dict.fromkeys([*(schema.get("columns") or []), *(c for s in sites for c in s["columns"])]))
    if union:
        out.append('<p class="note">Which site holds which column (✓ = measured there). A column a site lacks '
                   "is structurally unavailable there; the imputer (if run) fills it.</p>")
        held = [set(s["columns"]) for s in sites]
        out.append(_table(["Column", *(s["name"] for s in sites)],
                          [[_e(c), *("✓" if c in h else "" for h in held)] for c in union]))
    return "".join(out)


def _default(value: Any, default: str) -> str:
    return _e(default) if value is None else _num(value)


def _guarantees(result: Mapping[str, Any]) -> str:
    """The job's ``privacy``, ``trust`` and ``participation`` (:mod:`fedtab.job.guarantees`)."""
    privacy, trust, part = (result.get(k) for k in ("privacy", "trust", "participation"))
    if not any(isinstance(x, Mapping) for x in (privacy, trust, part)):
        return _absent("No privacy, trust or participation record in this result.")
    out = []
    if isinstance(privacy, Mapping):
        secure = bool(privacy.get("secure_aggregation"))
        out.append("<p>Secure aggregation: " + ("<strong>on</strong> — the server saw only sums over the sites, "
                                               "never one site's statistics, updates or scores." if secure else
                                               "off — the server saw each site's statistics and updates.") + "</p>")
        dp = privacy.get("dp")
        if isinstance(dp, Mapping):
            out.append(f"<p>Differential privacy: budget ε = {_num(dp.get('epsilon'))}, δ = {_e(dp.get('delta'))} for "
                       f"the whole run; spent ε = <strong>{_num(dp.get('epsilon_spent'))}</strong>. One accountant "
                       "composes every release of the election and training steps; the imputation has a share of "
                       "its own; each spends at most its share.</p>")
            steps = dp.get("steps") if isinstance(dp.get("steps"), Mapping) else {}

            def _paid(k: str, v: Mapping[str, Any]) -> str:
                names = v.get("steps")
                return _e(", ".join(map(str, names))) if isinstance(names, list) and names else _e(k)

            out.append(_table(["Steps", "ε share", "ε spent", "Noise multiplier"],
                              [[_paid(k, v), _num(v.get("epsilon")), _num(v.get("epsilon_spent")),
                                _num(v.get("noise_multiplier"))] for k, v in steps.items() if isinstance(v, Mapping)],
                              num_cols=(1, 2, 3)))
        else:
            out.append("<p>Differential privacy: off.</p>")
    if isinstance(trust, Mapping):
        rows = [["Robust reducers", "on" if trust.get("robust") else "off"],
                ["Largest share of a pooled sum one site may carry (robust)", _num(trust.get("max_site_share"))],
                ["Quorum (sites that must remain)", _default(trust.get("min_sites"), "every site")],
                ["Seconds a site may take per exchange", _default(trust.get("timeout"), "the engine's")],
                ["Sites that must hold a column for consensus", _default(trust.get("min_holders"), "2")]]
        out.append(_table(["Trust setting", "Value"], rows))
    if isinstance(part, Mapping):
        steps = [s for s in part.get("steps") or [] if isinstance(s, Mapping)]
        if steps:
            out.append(_table(["Step", "Sites that took part", "Sites dropped (why)"],
                              [[_e(s.get("step", "")), ", ".join(_e(x) for x in s.get("sites") or []) or "—",
                                "; ".join(f"{_e(k)}: {_e(v)}" for k, v in (s.get("dropped") or {}).items()) or "—"]
                               for s in steps]))
        dropped = part.get("dropped") or {}
        out.append("<p>" + ("Sites left out of the run: " + "; ".join(f"<strong>{_e(k)}</strong> ({_e(v)})"
                                                                     for k, v in dropped.items())
                            if dropped else "No site was left out of the run.") + "</p>")
    return "".join(out)


def _imputation(result: Mapping[str, Any]) -> str:
    imp = result.get("imputation")
    if not isinstance(imp, Mapping):
        return _absent("Imputation was not run in this job (missing cells were filled with the pooled mean).")
    val = imp.get("validation_rmse_z") or imp.get("validation") or {}
    per_col = val.get("per_column") or {}
    mean_fill = (imp.get("mean_fill_rmse_z") or {}).get("per_column") or val.get("per_column_mean_fill") or {}
    if not per_col:
        return _absent("Imputation ran, but no site had held-out cells to measure its quality on.")
    out = ['<p class="note">Error on observed cells hidden from the imputer, in standard deviations of the '
           "column (RMSE on the z-scale). The baseline fills every missing cell with the pooled mean; an "
           "imputer below it recovers information from the other columns.</p>"]
    rows, classes = [], []
    for col, rmse in per_col.items():
        base = mean_fill.get(col)
        gain = None if rmse is None or base in (None, 0) else 1 - rmse / base
        rows.append([_e(col), _num(rmse), _num(base), "—" if gain is None else f"{100 * gain:+.0f} %"])
        classes.append("" if gain is None else ("better" if gain > 0 else "worse"))
    out.append(_table(["Column", "Imputer RMSE", "Mean-fill RMSE", "Improvement"], rows, classes, num_cols=(1, 2, 3)))
    out.append(f"<p>Overall RMSE: {_num(val.get('overall'))}"
               + (f"; model of round {_num(imp.get('best_round'))} kept." if imp.get("best_round") else ".") + "</p>")
    return "".join(out)


def _election(result: Mapping[str, Any]) -> str:
    el = result.get("election")
    if not isinstance(el, Mapping):
        return _absent("No feature election in this job (every column was used).")
    feats = el.get("features") or el.get("explain") or []
    out = ['<p class="note">Each site ranked its columns with its own selector and voted. A column every '
           "holding site selected is kept by consensus; disputed columns are ranked by their sample-weighted "
           "normalised score (the vote) and the best ones are admitted, as many as the freedom degree allows.</p>"]
    stats = el.get("stats") or {}
    out.append(f"<p>Freedom degree {_num(el.get('freedom_degree'), 2)}; "
               f"kept {_num(stats.get('kept'))} "
               f"of {_num(len(feats) if feats else stats.get('union'))} columns.</p>")
    if not feats:
        selected = el.get("selected") or []
        out.append("<p>Elected columns: " + ", ".join(_e(c) for c in selected) + "</p>" if selected
                   else _absent("No per-column explanation in this result."))
        out.append(_pooled_agreement(el))
        return "".join(out)
    rows_in = [_feature_row(f) for f in feats if isinstance(f, Mapping)]
    ordered = sorted(rows_in, key=lambda f: (not f["kept"], -(f["vote"] or 0.0)))
    rows = [[_e(f["name"]), "kept" if f["kept"] else "dropped", _e(f["reason"]), f["held_by"], f["selected_by"],
             _num(f["vote"]), _num(f["rank"]) if f["rank"] else "—"] for f in ordered]
    out.append(_table(["Column", "Decision", "Why", "Held by", "Selected by", "Vote", "Disputed rank"],
                      rows, ["kept" if f["kept"] else "dropped" for f in ordered], num_cols=(5, 6)))
    out.append(_pooled_agreement(el))
    return "".join(out)


def _pooled_agreement(el: Mapping[str, Any]) -> str:
    """The Jaccard agreement with the pooled selector per freedom degree (simulations only)."""
    curve = [c for c in (el.get("pooled_agreement") or []) if isinstance(c, Mapping)]
    if not curve:
        return ""
    used = el.get("freedom_degree")
    rows, classes = [], []
    for c in curve:
        fd = c.get("freedom_degree")
        rows.append([_num(fd, 2), _num(c.get("jaccard")), _num(c.get("kept")), _num(c.get("pooled_kept"))])
        classes.append("kept" if isinstance(fd, (int, float)) and isinstance(used, (int, float))
                       and math.isclose(fd, used) else "")
    return ('<h3 id="pooled-agreement">Agreement with the selector on the pooled rows</h3>'
            '<p class="note">A simulation: the same selector was also run on all sites\' rows stacked. Jaccard '
            "agreement |elected ∩ pooled| / |elected ∪ pooled| of the elected columns with its choice, per "
            "freedom degree (the row of this election's freedom degree is highlighted). No real deployment has "
            "the pooled rows.</p>"
            + _table(["Freedom degree", "Jaccard with pooled", "Columns elected", "Columns pooled selector kept"],
                     rows, classes, num_cols=(0, 1, 2, 3)))


def _feature_row(f: Mapping[str, Any]) -> dict[str, Any]:
    """One election row in one shape, from the job's result or :meth:`ElectionResult.explain`."""
    chosen = f.get("chosen_by")
    selected_by = ", ".join(_e(s) for s in chosen) if isinstance(chosen, list) else _num(f.get("selected_by"))
    held = f.get("held_by")
    return {"name": f.get("name", f.get("feature", "")), "kept": bool(f.get("selected", f.get("kept"))),
            "reason": f.get("reason", ""), "vote": f.get("votes", f.get("vote")), "rank": f.get("rank"),
            "selected_by": selected_by or "none",
            "held_by": ", ".join(_e(s) for s in held) if isinstance(held, list) else _num(held)}


def _tuning(result: Mapping[str, Any]) -> str:
    tun = result.get("tuning")
    if isinstance(tun, Mapping) and isinstance(tun.get("summary"), Mapping):
        tun = {**tun["summary"], **{k: v for k, v in tun.items() if k != "summary" and v is not None}}
    if not isinstance(tun, Mapping) or not tun.get("curve"):
        return _absent("The freedom degree was set in the job file, not tuned.")
    from .plots import figure_data_uri, tuning_curve_figure

    curve = [c for c in tun["curve"] if isinstance(c, Mapping)]
    out = [f"<p>Chosen freedom degree {_num(tun.get('freedom_degree'), 2)} ({_e(tun.get('method', ''))}), keeping "
           f"{_num(tun.get('kept'))} columns, validation F1 {_num(tun.get('score'))}. Scores are measured on a "
           "validation part of each site's training rows; the test rows are never used for this choice.</p>"]
    out.append(_img(figure_data_uri(tuning_curve_figure([{**tun, "curve": curve}])), "tuning curve"))
    out.append(_table(["Freedom degree", "Validation F1", "Columns kept"],
                      [[_num(c.get("freedom_degree"), 2), _num(c.get("score")), _num(c.get("kept"))] for c in curve],
                      num_cols=(0, 1, 2)))
    return "".join(out)


_METRICS = [("auroc", "AUROC"), ("pr_auc", "PR-AUC"), ("brier", "Brier"), ("accuracy", "Accuracy"),
            ("weighted_f1", "F1 (weighted)"), ("macro_f1", "F1 (macro)"), ("n", "Test rows")]


def _metric_cells(m: Mapping[str, Any] | None, keys: Sequence[str]) -> list[str]:
    m = m or {}
    return [_num(m.get(k)) for k in keys]


def _models(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, {"pooled", "per_site"}) of the federated model and the baselines present."""
    tr = result.get("training") or {}
    ev = result.get("evaluation") if isinstance(result.get("evaluation"), Mapping) else {}
    base = result.get("baselines") or ev.get("baselines") or {}
    label = f"Federated ({tr.get('model', 'model')})"
    out = []
    for found in (tr.get("metrics"), ev, {"pooled": tr.get("pooled"), "per_site": tr.get("per_site") or {}}):
        if isinstance(found, Mapping) and isinstance(found.get("pooled"), Mapping):
            out.append((label, found))
            break
    if not out:
        return []
    if isinstance(base.get("local_only"), Mapping):
        out.append(("Local-only (each site alone)", base["local_only"]))
    if isinstance(base.get("majority"), Mapping):
        out.append((f"Majority class ({base['majority'].get('class', '')})", base["majority"]))
    return out


def _confusion(cm: Any, classes: Sequence[Any]) -> str:
    if not isinstance(cm, list) or not cm:
        return ""
    labels = [str(c) for c in classes] if len(classes) == len(cm) else [str(i) for i in range(len(cm))]
    return _table(["true \\ predicted", *labels], [[_e(labels[i]), *(_num(v) for v in row)] for i, row in enumerate(cm)],
                  num_cols=range(1, len(cm) + 1))


def _metrics(result: Mapping[str, Any]) -> str:
    models = _models(result)
    if not models:
        return _absent("No model was trained in this job.")
    present = [(k, h) for k, h in _METRICS if any(k in (m.get("pooled") or {}) for _, m in models)]
    keys = [k for k, _ in present]
    out = ['<p class="note">All models are scored on the same held-out test rows of every site. AUROC: chance '
           "that a random positive case scores above a random negative one (0.5 = coin toss). PR-AUC: average "
           "precision over all thresholds. Brier: mean squared error of the predicted probabilities (lower is "
           "better). Pooled = over the test rows of all sites together; computed from per-site counts and "
           "histograms, no prediction left a site.</p>"]
    rows = [[_e(label), "all sites", *_metric_cells(m.get("pooled"), keys)] for label, m in models]
    sites = list(dict.fromkeys(s for _, m in models for s in (m.get("per_site") or {})))
    for s in sites:
        rows += [[_e(label), _e(s), *_metric_cells((m.get("per_site") or {}).get(s), keys)] for label, m in models]
    out.append(_table(["Model", "Test rows of", *(h for _, h in present)], rows, num_cols=range(2, 2 + len(keys))))
    fed = models[0][1].get("pooled") or {}
    if fed.get("auroc_error_bound") is not None:
        out.append(f'<p class="note">AUROC and PR-AUC come from histograms of predicted probabilities on a '
                   f"fixed grid; their distance to the exact values is at most {_bound(fed['auroc_error_bound'])} "
                   f"(AUROC) and {_bound(fed.get('pr_auc_error_bound'))} (PR-AUC) for the pooled federated model.</p>")
    schema = result.get("schema") if isinstance(result.get("schema"), Mapping) else {}
    classes = (result.get("training") or {}).get("classes") or schema.get("classes") or []
    cm = fed.get("confusion")
    if cm:
        out.append(f"<h3>Confusion matrix of {_e(models[0][0])}, all sites</h3>" + _confusion(cm, classes))
        for s, m in (models[0][1].get("per_site") or {}).items():
            if m.get("confusion"):
                out.append(f"<h3>Confusion matrix, test rows of {_e(s)}</h3>" + _confusion(m["confusion"], classes))
    return "".join(out)


def _baselines(result: Mapping[str, Any]) -> str:
    models = _models(result)
    local_models = [m for label, m in models if label.startswith("Local-only")]
    if len(models) < 2:
        return _absent("No baselines were computed in this job.")
    fed = models[0][1]
    local = (local_models[0] if local_models else {}).get("per_site") or {}
    metric = "auroc" if (fed.get("pooled") or {}).get("auroc") is not None else "weighted_f1"
    label = dict(_METRICS)[metric]
    out = [f'<p class="note">For each site, its {label} with the federated model against a model of the same '
           "kind trained on that site's rows alone (scored on the same test rows). A positive difference means "
           "the site gained by federating.</p>"]
    rows, classes = [], []
    for s, m in (fed.get("per_site") or {}).items():
        f, loc = m.get(metric), (local.get(s) or {}).get(metric)
        d = None if f is None or loc is None else f - loc
        rows.append([_e(s), _num(f), _num(loc), "—" if d is None else f"{d:+.3f}"])
        classes.append("" if d is None else ("better" if d > 0 else "worse"))
    out.append(_table(["Site", f"Federated {label}", f"Local-only {label}", "Difference"], rows, classes,
                      num_cols=(1, 2, 3)))
    from .plots import figure_data_uri, metric_by_site_figure

    values = {lbl: {s: v.get(metric) for s, v in (m.get("per_site") or {}).items()} for lbl, m in models}
    out.append(_img(figure_data_uri(metric_by_site_figure(values, label)), f"{label} per site"))
    return "".join(out)


def _steps(result: Mapping[str, Any]) -> str:
    steps = result.get("steps")
    if isinstance(steps, Mapping):
        steps = [{"step": k, **(v if isinstance(v, Mapping) else {"seconds": v})} for k, v in steps.items()]
    steps = [s for s in (steps or []) if isinstance(s, Mapping)] if isinstance(steps, list) else []
    if not steps:
        return _absent("No step timings in this result.")
    rows = [[_e(s.get("name", s.get("step", ""))), _num(s.get("seconds"), 2), _bytes(s.get("bytes_down")),
             _bytes(s.get("bytes_up"))] for s in steps]
    total = [sum(float(s.get(k) or 0) for s in steps) for k in ("seconds", "bytes_down", "bytes_up")]
    rows.append(["<strong>total</strong>", _num(total[0], 2), _bytes(total[1]), _bytes(total[2])])
    return ('<p class="note">Wall time on the server and bytes sent to (down) and received from (up) all '
            "sites. No row of any table was sent.</p>"
            + _table(["Step", "Seconds", "Sent to sites", "Received from sites"], rows, num_cols=(1, 2, 3)))


_RENDER = {"sites": _sites, "guarantees": _guarantees, "imputation": _imputation, "election": _election, "tuning": _tuning,
           "metrics": _metrics, "baselines": _baselines, "steps": _steps}
_RENDER["selection"] = selection_section


def render_report(result: Mapping[str, Any]) -> str:
    """The report page as one HTML string (see the module docstring for what is read)."""
    job = result.get("job") if isinstance(result.get("job"), Mapping) else {}
    title = job.get("title") or job.get("name") or "fedtab job report"
    version = result.get("fedtab_version") or job.get("fedtab_version")
    created = result.get("created")
    nav = "".join(f'<a href="#{sid}">{_e(h.split(":")[0])}</a>' for sid, h in SECTIONS.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1>",
        f'<p class="note">Federated run by fedtab{" " + _e(version) if version else ""}'
        f'{" on " + _e(created) if created else ""}{" (" + _e(result["engine"]) + " engine)" if result.get("engine") else ""}. '
        "Only counts, sums and model parameters left the sites.</p>",
        f"<nav>{nav}</nav></header>",
    ]
    for sid, heading in SECTIONS.items():
        parts.append(f'<section id="{sid}"><h2>{_e(heading)}</h2>{_RENDER[sid](result)}</section>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: Mapping[str, Any], path: str | Path) -> Path:
    """Write :func:`render_report` of ``result`` to ``path`` (UTF-8; parent folders created).

    Returns the written path.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(result), encoding="utf-8")
    return out
