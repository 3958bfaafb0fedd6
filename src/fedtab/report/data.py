"""Reading a job's result data for the report, in one shape whatever produced it.

``result.json`` of a job (``docs/job.md``), the documents of ``fedtab elect`` / ``fedtab
impute``, and the names of the Python objects (``TrainingOutcome.metrics``,
:meth:`ElectionResult.explain` rows) are all accepted; these helpers hide the differences.
"""

from __future__ import annotations

from typing import Any, Mapping

from .intervals import bounded

__all__ = ["METRICS", "site_summaries", "evaluated_models", "headline_metric", "pooled_headline", "mapping", "run_sites",
           "unscored_sites", "unscored_key", "UNSCORED_KEYS"]

#: metric key -> column heading, in table order
METRICS = [("auroc", "AUROC"), ("pr_auc", "PR-AUC"), ("brier", "Brier"), ("accuracy", "Accuracy"),
           ("weighted_f1", "F1 (weighted)"), ("macro_f1", "F1 (macro)"), ("rmse", "RMSE"), ("mae", "MAE"),
           ("r2", "R²"), ("n", "Test rows")]

FEDERATED, LOCAL, MAJORITY = "federated", "local_only", "majority"


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def site_summaries(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The sites as ``{name, columns, rows, rows_train, rows_test, rows_without_label}`` dicts."""
    sites = result.get("sites")
    if isinstance(sites, Mapping):
        sites = [{"name": k, **(v if isinstance(v, Mapping) else {})} for k, v in sites.items()]
    out = []
    for s in sites if isinstance(sites, list) else []:
        s = {"name": s} if isinstance(s, str) else dict(s) if isinstance(s, Mapping) else None
        if s is None:
            continue
        for old, new in (("n_rows", "rows"), ("n_train", "rows_train"), ("n_test", "rows_test"),
                         ("dropped_unlabelled", "rows_without_label")):
            s.setdefault(new, s.get(old))
        s["columns"] = list(s.get("columns") or [])
        out.append(s)
    return out


def evaluated_models(result: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``(role, label, {"pooled", "per_site"})`` of the federated model and the baselines present;
    role is ``"federated"``, ``"local_only"`` or ``"majority"``. Empty without a federated score."""
    tr = mapping(result.get("training"))
    ev = mapping(result.get("evaluation"))
    base = mapping(result.get("baselines")) or mapping(ev.get("baselines"))
    label = f"Federated ({tr.get('model', 'model')})"
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for found in (tr.get("metrics"), ev, {"pooled": tr.get("pooled"), "per_site": tr.get("per_site") or {}}):
        if isinstance(found, Mapping) and isinstance(found.get("pooled"), Mapping):
            out.append((FEDERATED, label, found))
            break
    if not out:
        return []
    if isinstance(base.get("local_only"), Mapping):
        out.append((LOCAL, "Local-only (each site alone)", base["local_only"]))
    if isinstance(base.get("majority"), Mapping):
        out.append((MAJORITY, f"Majority class ({base['majority'].get('class', '')})", base["majority"]))
    return out


def headline_metric(scores: Mapping[str, Any]) -> tuple[str, str]:
    """``(key, heading)`` of the metric a verdict compares: AUROC when the federated model has
    one (binary with probabilities), else the weighted F1. (A pooled AUROC that is neither exact
    nor bounded is not headlined: :func:`pooled_headline`.)"""
    pooled = mapping(scores.get("pooled"))
    key = "auroc" if pooled.get("auroc") is not None else "rmse" if "rmse" in pooled else "weighted_f1"
    return key, dict(METRICS)[key]


def pooled_headline(scores: Mapping[str, Any]) -> tuple[str, str]:
    """``(key, heading)`` of the pooled metric a verdict may headline: :func:`headline_metric`'s,
    except that a pooled AUROC with neither bounds nor an error bound (an estimate from smoothed
    histograms, :func:`fedtab.report.intervals.bounded`) gives way to the weighted F1, which the
    summed confusion matrices give exactly."""
    key, heading = headline_metric(scores)
    if key == "auroc" and not bounded(mapping(scores.get("pooled"))):
        return "weighted_f1", dict(METRICS)["weighted_f1"]
    return key, heading


def run_sites(result: Mapping[str, Any]) -> list[str]:
    """Every site of the run, in order: those of ``result["sites"]``, then those the run dropped
    (``participation.dropped``) that are not among them."""
    named = [s["name"] for s in site_summaries(result)]
    dropped = mapping(mapping(result.get("participation")).get("dropped"))
    return named + [str(s) for s in dropped if s not in named]


def _class_word(i: int, classes: list[Any]) -> str:
    role = {0: "negative", 1: "positive"}.get(i, "row") if len(classes) == 2 else "row"
    name = f"class “{classes[i]}”" if i < len(classes) else f"class {i}"
    return f"{role} ({name})" if role != "row" else f"row of {name}"


def _dropped_why(result: Mapping[str, Any], site: str) -> str | None:
    part = mapping(result.get("participation"))
    why = mapping(part.get("dropped")).get(site)
    for step in part.get("steps") or []:
        at = mapping(mapping(step).get("dropped")).get(site)
        if at is not None:
            return f"was dropped at the {mapping(step).get('step', '?')} step: {at}"
    return None if why is None else f"was dropped from the run: {why}"


def _missing_classes(metrics: Mapping[str, Any]) -> list[int] | None:
    """Indices of the classes with no row in a site's test part, from its (exact, plain-run)
    confusion matrix (rows = true class); ``None`` without one."""
    cm = metrics.get("confusion")
    if not isinstance(cm, list) or not cm or not all(isinstance(r, list) for r in cm):
        return None
    try:
        totals = [sum(float(v) for v in row) for row in cm]
    except (TypeError, ValueError):
        return None
    return [i for i, t in enumerate(totals) if round(t) == 0]


#: the key of ``result["sites"][s]`` that holds why a site has no per-site score, by the headline metric
UNSCORED_KEYS = {"auroc": "no_auroc", "weighted_f1": "no_score"}


def unscored_key(result: Mapping[str, Any]) -> str | None:
    """``"no_auroc"`` in a run that scores an AUROC per site (a binary model with probabilities,
    evaluated per site: plain, not under secure aggregation, whose per-site scores the server never
    sees, nor under DP, which has no AUROC), ``"no_score"`` in another classification run with
    per-site scores (the weighted F1), ``None`` otherwise (no per-site scores, or regression)."""
    models = {role: m for role, _, m in evaluated_models(result)}
    fed = models.get(FEDERATED)
    if fed is None or not mapping(fed.get("per_site")):
        return None
    return UNSCORED_KEYS.get(headline_metric(fed)[0])


def unscored_sites(result: Mapping[str, Any]) -> dict[str, str]:
    """``{site: why it has no score of its own}`` for every site of the run (:func:`run_sites`)
    the federated model has no per-site headline score at (:func:`unscored_key`: an AUROC, or
    else test rows to give an F1); ``{}`` in a run without per-site scores.

    Each reason is a predicate that follows the site's name, first that applies: it was dropped
    (``participation``, with the step and why), has no test part (``sites.<s>.no_test``), holds
    one class only (``sites.<s>.one_class``; AUROC runs), was not evaluated, has no row of a class
    in its test part (AUROC runs: its evaluation's confusion matrix, whose row sums are the counts
    per class of the part it fixed — nothing beyond what the evaluation released), or else had no
    AUROC in its reply. A reason the job stored (``sites.<s>.no_auroc`` / ``no_score``) is kept.
    """
    key = unscored_key(result)
    if key is None:
        return {}
    auroc = key == "no_auroc"
    per_site = mapping(mapping(dict((r, m) for r, _, m in evaluated_models(result))[FEDERATED]).get("per_site"))
    sites = {s["name"]: s for s in site_summaries(result)}
    classes = list(mapping(result.get("training")).get("classes") or mapping(result.get("schema")).get("classes")
                   or [])
    out: dict[str, str] = {}
    for name in run_sites(result):
        info, scores = sites.get(name, {}), mapping(per_site.get(name))
        if scores.get("auroc") is not None if auroc else bool(scores.get("n")):
            continue
        missing = _missing_classes(scores) if scores else None
        if info.get(key):
            why = str(info[key])
        elif (dropped := _dropped_why(result, name)) is not None:
            why = dropped
        elif info.get("no_test"):
            why = (f"has no test part: its {info.get('rows_train')} rows are too few for a test share and a training "
                   "share of at least min_rows rows each (of every class it holds)")
        elif info.get("rows_test") == 0 and not scores.get("n"):
            why = "has no test part"
        elif auroc and info.get("one_class") is True:
            why = "holds one class only"
        elif not scores:
            why = "was not evaluated"
        elif not auroc:
            why = "has no test rows"
        elif missing:
            held = ", ".join(_class_word(i, classes) for i in missing)
            why = (f"has no {held} among its {scores.get('n', '?')} test rows (its rows of that class are too few "
                   "for a test share of at least min_rows)")
        else:
            why = "has no AUROC in its evaluation"
        out[name] = why
    return out
