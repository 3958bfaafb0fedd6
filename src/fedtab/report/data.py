"""Reading a job's result data for the report, in one shape whatever produced it.

``result.json`` of a job (``docs/job.md``), the documents of ``fedtab elect`` / ``fedtab
impute``, and the names of the Python objects (``TrainingOutcome.metrics``,
:meth:`ElectionResult.explain` rows) are all accepted; these helpers hide the differences.
"""

from __future__ import annotations

from typing import Any, Mapping

from .intervals import bounded

__all__ = ["METRICS", "site_summaries", "evaluated_models", "headline_metric", "pooled_headline", "mapping"]

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
