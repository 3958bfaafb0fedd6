"""The model section: coefficients and odds ratios of a linear model, importances of others.

:func:`model_summary` turns the job workflow's ``"model"`` section (what the model file holds:
``features``, ``classes``, ``mean``/``std`` of the standardisation, ``model.name`` and
``params``) into the small ``result["model"]`` the report reads: for a linear model (``coef``
``(k, d)`` and ``intercept`` ``(k,)`` on standardised inputs) the coefficients per feature;
for any other model only its name (and ``importances`` ``{feature: value}`` when a model
provides them). Kept small on purpose: ``result.json`` never holds a network's or a forest's
parameters.

The coefficients are on the standardised scale (one unit = one pooled standard deviation
of the feature, as the model was trained). For the logistic model the section shows the
odds ratio per standard deviation, ``exp(coef)``, and per unit of the raw feature,
``exp(coef / std)``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .data import mapping
from .markup import absent, esc, num, table

__all__ = ["model_summary", "model_section", "LINEAR"]

#: models whose ``coef``/``intercept`` are a linear score of the standardised features
LINEAR = ("logistic", "sgd")


def _floats(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


def model_summary(model: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``result["model"]`` from the workflow's model section (``None`` without one): ``name``,
    ``params`` (the model's settings), ``features``, ``classes`` and, for a linear model,
    ``coef`` (``k`` lists of ``d`` floats), ``intercept``, ``mean`` and ``std``."""
    if not isinstance(model, Mapping):
        return None
    spec = mapping(model.get("model"))
    out: dict[str, Any] = {"name": spec.get("name"), "params": dict(mapping(spec.get("params"))),
                           "features": list(model.get("features") or []), "classes": list(model.get("classes") or [])}
    params = mapping(model.get("params"))
    if spec.get("name") in LINEAR and "coef" in params and "intercept" in params:
        import numpy as np

        out.update(coef=np.asarray(params["coef"], np.float64).tolist(),
                   intercept=np.asarray(params["intercept"], np.float64).ravel().tolist(),
                   mean=np.asarray(model.get("mean", []), np.float64).ravel().tolist(),
                   std=np.asarray(model.get("std", []), np.float64).ravel().tolist())
    if isinstance(model.get("importances"), Mapping):
        out["importances"] = dict(model["importances"])
    return out


def _exp(x: float) -> str:
    try:
        v = math.exp(x)
    except OverflowError:
        return "&gt; 1e300"
    return f"{v:.3g}" if v < 1e4 else f"{v:.3e}"


def _coefficients(m: Mapping[str, Any]) -> str:
    feats, coef, std = m.get("features") or [], m.get("coef") or [], m.get("std") or []
    classes = [str(c) for c in m.get("classes") or []]
    intercept = m.get("intercept") or []
    if not coef or any(len(row) != len(feats) for row in coef):
        return absent("The coefficients in this result do not match its features.")
    odds = m.get("name") == "logistic" and len(coef) == 1
    out = ['<p class="note">Coefficients on the standardised features (one unit = one pooled standard deviation '
           "of the column, as the model was trained), largest effect first."
           + (" Odds ratio per SD = exp(coefficient): above 1 the odds of class "
              f"“{esc(classes[-1] if classes else 1)}” rise with the feature, below 1 they fall. Per unit of "
              "the raw column = exp(coefficient / SD)." if odds else "") + "</p>"]
    for k, row in enumerate(coef):
        order = sorted(range(len(feats)), key=lambda j: -abs(float(row[j])))
        rows = []
        for j in order:
            c = float(row[j])
            cells = [esc(feats[j]), num(c)]
            if odds:
                sd = float(std[j]) if j < len(std) and float(std[j]) > 0 else None
                cells += [_exp(c), _exp(c / sd) if sd else "—", num(sd)]
            rows.append(cells)
        b = float(intercept[k]) if k < len(intercept) else None
        rows.append(["<em>intercept</em>", num(b), *(["—", "—", "—"] if odds else [])])
        if len(coef) > 1:
            out.append(f"<h3>Score of class “{esc(classes[k] if k < len(classes) else k)}” (softmax)</h3>")
        header = ["Feature", "Coefficient (per SD)"] + (["Odds ratio per SD", "Odds ratio per unit", "SD"]
                                                         if odds else [])
        out.append(table(header, rows, num_cols=range(1, len(header))))
    return "".join(out)


def model_section(result: Mapping[str, Any]) -> str:
    """The ``model`` section's HTML."""
    m = mapping(result.get("model"))
    if isinstance(m.get("model"), Mapping):  # the workflow's whole model section (fedtab elect): summarise it
        m = model_summary(m) or {}
    tr = mapping(result.get("training"))
    if not m and not tr:
        return absent("No model was trained in this job.")
    name = m.get("name") or tr.get("model")
    feats = m.get("features") or tr.get("features") or []
    settings = ", ".join(f"{esc(k)} = {esc(v)}" for k, v in mapping(m.get("params")).items())
    out = [f"<p>Model: <strong>{esc(name)}</strong>{' (' + settings + ')' if settings else ''} on "
           f"{num(len(feats))} feature(s)"
           + _training_rounds(name, mapping(m.get("params")), tr) + ".</p>"]
    if m.get("coef") is not None:
        out.append(_coefficients(m))
    elif isinstance(m.get("importances"), Mapping):
        imp = sorted(m["importances"].items(), key=lambda kv: -float(kv[1] or 0))
        out.append(table(["Feature", "Importance"], [[esc(k), num(v)] for k, v in imp], num_cols=(1,)))
    elif mapping(tr.get("importance")).get("pooled"):
        out.append('<p class="note">A tree model has no coefficients: its feature importance by gain follows.</p>')
    else:
        out.append(absent("No coefficients or importances for this model in the result."))
    return "".join(out)


def _training_rounds(name: Any, params: Mapping[str, Any], tr: Mapping[str, Any]) -> str:
    """``", N Newton–Raphson iteration(s)"`` / ``", N FedAvg round(s) of E local epoch(s)"`` (nothing
    for boosted trees or a run without rounds), then why a logistic model trained by FedAvg when the
    result says (``solver_reason``: a run mode Newton–Raphson does not serve, or a model too wide)."""
    rounds = tr.get("rounds")
    if not rounds or name == "gbdt":
        return ""
    if name == "logistic" and params.get("solver", "newton") == "newton" and not params.get("mu"):
        return f", {num(rounds)} Newton–Raphson iteration(s)"
    if not tr.get("local_epochs"):
        return ""
    why = f" — {esc(tr['solver_reason'])}" if isinstance(tr.get("solver_reason"), str) else ""
    return f", {num(rounds)} FedAvg round(s) of {num(tr.get('local_epochs'))} local epoch(s){why}"
