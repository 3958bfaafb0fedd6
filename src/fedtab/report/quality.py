"""The report's model-quality sections: the metrics table (with 95 % AUROC intervals and
few-row warnings) and the per-site baselines comparison (negative differences marked)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .data import FEDERATED, LOCAL, MAJORITY, METRICS, evaluated_models, headline_metric, mapping
from .intervals import FEW_ROWS, auroc_bounds, auroc_interval
from .markup import absent, bound, esc, figure, num, signed, table
from .verdict import TIE

__all__ = ["metrics", "baselines", "interval_text"]


def interval_text(m: Mapping[str, Any] | None) -> str:
    """The 95 % AUROC interval of one evaluation as ``0.41–0.78`` (plus "⚠" when a class has fewer
    than :data:`FEW_ROWS` test rows), "—" without one."""
    ci = auroc_interval(m)
    if ci is None:
        return "—"
    text = "— (at its bound)" if ci["low"] is None else f"{ci['low']:.2f}–{ci['high']:.2f}"
    if ci["few"]:
        text += (f' <span class="warn" title="fewer than {FEW_ROWS} test rows of a class: {ci["negatives"]} '
                 f'negative, {ci["positives"]} positive">⚠ few</span>')
    return text


def _bounds_text(m: Mapping[str, Any], key: str) -> str:
    """`` [lo–hi]`` after a pooled AUROC / PR-AUC that is bounded but not exact, `` (no bound)``
    after one that is neither, "" after an exact one."""
    if m.get(key) is None:
        return ""
    b = auroc_bounds(m, key)
    if b is None:
        return ' <span class="warn" title="an estimate from smoothed histograms, without a bound">(no bound)</span>'
    return "" if b[1] - b[0] < TIE else f' <span class="bounds">[{b[0]:.3f}–{b[1]:.3f}]</span>'


def _cells(m: Mapping[str, Any] | None, keys: Sequence[str], interval: bool = True) -> list[str]:
    """The metric cells of one row; after the AUROC its interval (a majority-class guess, which
    scores every row alike, has none)."""
    m = m or {}
    out = []
    for k in keys:
        out.append(num(m.get(k)) + (_bounds_text(m, k) if k in ("auroc", "pr_auc") else ""))
        if k == "auroc":
            out.append(interval_text(m) if interval else "—")
    return out


def _few_rows_note(models: Sequence[tuple[str, str, Mapping[str, Any]]]) -> str:
    fed = models[0][2]
    few = [(s, ci) for s, ci in ((s, auroc_interval(mapping(m))) for s, m in mapping(fed.get("per_site")).items())
           if ci and ci["few"]]
    pooled = auroc_interval(mapping(fed.get("pooled")))
    if pooled and pooled["few"]:
        few.insert(0, ("all sites", pooled))
    if not few:
        return ""
    return (f'<p class="note"><span class="warn">⚠ few</span> = fewer than {FEW_ROWS} test rows of a class behind '
            "the AUROC, so its interval (an approximation) is wide and unreliable: "
            + "; ".join(f"{esc(s)}: {ci['negatives']} negative, {ci['positives']} positive" for s, ci in few) + ".</p>")


def _confusion(cm: Any, classes: Sequence[Any]) -> str:
    if not isinstance(cm, list) or not cm:
        return ""
    labels = [str(c) for c in classes] if len(classes) == len(cm) else [str(i) for i in range(len(cm))]
    return table(["true \\ predicted", *labels], [[esc(labels[i]), *(num(v) for v in row)] for i, row in enumerate(cm)],
                 num_cols=range(1, len(cm) + 1))


def metrics(result: Mapping[str, Any]) -> str:
    """The ``metrics`` section's HTML."""
    models = evaluated_models(result)
    if not models:
        return absent("No model was trained in this job.")
    present = [(k, h) for k, h in METRICS if any(k in mapping(m.get("pooled")) for _, _, m in models)]
    keys = [k for k, _ in present]
    headers = [h for k, h in present for h in ((h, "AUROC 95 % CI") if k == "auroc" else (h,))]
    out = ['<p class="note">All models are scored on the same held-out test rows of every site. AUROC: chance '
           "that a random positive case scores above a random negative one (0.5 = coin toss); its 95 % interval is "
           "Hanley and McNeil's, from the AUROC and the test rows of each class (widened by the AUROC's bounds where "
           "it has them). PR-AUC: average precision over all thresholds. Brier: mean squared error of the "
           "predicted probabilities (lower is better). Pooled = over the test rows of all sites together; computed "
           "from per-site counts and histograms, no prediction left a site. A value followed by [lo–hi] is not "
           "exact: the exact value on the same predictions lies between lo and hi (the value shown is an estimate "
           "inside them); a value without brackets is exact (to the last digit shown).</p>"]
    rows = [[esc(label), "all sites", *_cells(m.get("pooled"), keys, role != MAJORITY)] for role, label, m in models]
    sites = list(dict.fromkeys(s for _, _, m in models for s in mapping(m.get("per_site"))))
    for s in sites:
        rows += [[esc(label), esc(s), *_cells(mapping(m.get("per_site")).get(s), keys, role != MAJORITY)]
                 for role, label, m in models]
    out.append(table(["Model", "Test rows of", *headers], rows, num_cols=range(2, 2 + len(headers)),
                     table_id="metrics-table"))
    out.append(_few_rows_note(models))
    fed_label, fed = models[0][1], mapping(models[0][2].get("pooled"))
    secure = bool(mapping(result.get("privacy")).get("secure_aggregation"))
    if secure and auroc_bounds(fed) is not None and auroc_bounds(fed)[1] - auroc_bounds(fed)[0] >= TIE:
        lo, hi = auroc_bounds(fed)
        out.append(f'<p class="note">How the pooled AUROC of {esc(fed_label)} was computed: from the sum of the '
                   "sites' score histograms on a grid of 1,000 bins, summed exactly under secure aggregation; only a "
                   "positive and a negative row in the same bin cannot be ordered, so the exact pooled AUROC is "
                   f"somewhere in [{lo:.3f}, {hi:.3f}] (the PR-AUC within {bound(fed.get('pr_auc_error_bound'))}).</p>")
    elif auroc_bounds(fed) is not None and auroc_bounds(fed)[1] - auroc_bounds(fed)[0] >= TIE:
        lo, hi = auroc_bounds(fed)
        out.append(f'<p class="note">How the pooled AUROC of {esc(fed_label)} was computed: pairs of test rows of '
                   "one site are ranked exactly (each site sends its own AUROC's pair count); pairs of rows of "
                   "different sites are ranked from the sites' score histograms, which each site's release gate "
                   "smooths into runs of at least <code>min_rows</code> rows. A pair whose two runs overlap cannot "
                   f"be ordered, so the exact pooled AUROC is somewhere in [{lo:.3f}, {hi:.3f}]; the value shown "
                   "counts each such pair as the sites' own pairs score on average, an estimate at most "
                   f"{bound(fed.get('auroc_error_bound'))} from the exact one. The PR-AUC is bounded likewise (within "
                   f"{bound(fed.get('pr_auc_error_bound'))}). Secure aggregation sums exact histograms instead: the "
                   "bound is then that of the 1,000-bin grid.</p>")
    elif fed.get("auroc") is not None and auroc_bounds(fed) is None:
        out.append('<p class="note"><span class="warn">⚠</span> The pooled AUROC / PR-AUC of this result were '
                   "estimated from smoothed score histograms without a bound (a result written by an older "
                   "fedtab): read them as rough indications; the per-site AUROCs are exact.</p>")
    schema = mapping(result.get("schema"))
    classes = mapping(result.get("training")).get("classes") or schema.get("classes") or []
    if fed.get("confusion"):
        out.append(f"<h3>Confusion matrix of {esc(fed_label)}, all sites</h3>" + _confusion(fed["confusion"], classes))
        for s, m in mapping(models[0][2].get("per_site")).items():
            if mapping(m).get("confusion"):
                out.append(f"<h3>Confusion matrix, test rows of {esc(s)}</h3>" + _confusion(m["confusion"], classes))
    return "".join(out)


def baselines(result: Mapping[str, Any]) -> str:
    """The ``baselines`` section's HTML."""
    models = evaluated_models(result)
    if len(models) < 2:
        return absent("No baselines were computed in this job.")
    fed = models[0][2]
    local = mapping(next((m for role, _, m in models if role == LOCAL), {}).get("per_site"))
    metric, label = headline_metric(fed)
    out = [f'<p class="note">For each site, its {label} with the federated model against a model of the same '
           "kind trained on that site's rows alone (scored on the same test rows). A positive difference means "
           "the site gained by federating; a negative one (▼, in red) that it lost.</p>"]
    rows, classes = [], []
    for s, m in mapping(fed.get("per_site")).items():
        f, loc = mapping(m).get(metric), mapping(local.get(s)).get(metric)
        d = None if f is None or loc is None else f - loc
        mark = "" if d is None or abs(d) < TIE else (" ▲ better" if d > 0 else " ▼ worse")
        rows.append([esc(s), num(f), num(loc), "—" if d is None else f'<span class="delta">{signed(d)}{mark}</span>'])
        classes.append("" if d is None or abs(d) < TIE else ("better" if d > 0 else "worse"))
    out.append(table(["Site", f"Federated {label}", f"Local-only {label}", "Difference"], rows, classes,
                     num_cols=(1, 2, 3), table_id="baselines-table"))
    from .plots import metric_by_site_figure

    values = {lbl: {s: mapping(v).get(metric) for s, v in mapping(m.get("per_site")).items()} for _, lbl, m in models}
    errors = {}
    if metric == "auroc":
        for role, lbl, m in models:
            if role in (FEDERATED, LOCAL):
                cis = {s: auroc_interval(mapping(v)) for s, v in mapping(m.get("per_site")).items()}
                errors[lbl] = {s: (ci["low"], ci["high"]) for s, ci in cis.items() if ci and ci["low"] is not None}
    out.append(figure(f"{metric}-by-site", metric_by_site_figure(values, label, errors), f"{label} per site"))
    return "".join(out)
