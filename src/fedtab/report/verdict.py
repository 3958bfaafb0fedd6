"""The report's verdict: the federated model against each site alone and the majority class, in words.

Read from the federated model's scores and the baselines (``result["baselines"]``): for
each site, the headline metric (:func:`~fedtab.report.data.headline_metric`) of the
federated model against the local-only model of that site, then the pooled score against
always predicting the majority class, with the 95 % AUROC interval
(:mod:`fedtab.report.intervals`) and, when the pooled AUROC is not exact, its bounds. Only an
AUROC that is exact or bounded is headlined (:func:`~fedtab.report.data.headline_metric`;
otherwise the weighted F1, exact from the summed confusion matrices). A worse result is marked three ways: the row class
``worse`` (red), a minus sign (U+2212) and the words "▼ worse" — never by colour alone.
Sites whose AUROC rests on fewer than :data:`~fedtab.report.intervals.FEW_ROWS` test rows of a
class are named, and so is each site that holds one class only, with what it took part in
(:func:`~fedtab.report.run_sections.one_class_notes`).

The counts are over every site of the run, not only the sites with a score: in a run that
scores AUROCs per site, each site without one is named with why
(:func:`~fedtab.report.data.unscored_sites`: dropped, no test part, one class only, no row of a
class in its test part) — "AUROC at 2 of 4 sites: …" — and "worse at 2 of 4 sites" counts it.
"""

from __future__ import annotations

from typing import Any, Mapping

from .data import (FEDERATED, LOCAL, MAJORITY, evaluated_models, headline_metric, mapping, pooled_headline,
                   unscored_sites)
from .intervals import FEW_ROWS, auroc_interval
from .markup import absent, esc, num, signed
from .run_sections import one_class_notes
from .selection import selection_verdict_notes

__all__ = ["verdict", "compare_sites", "auroc_text", "TIE"]

#: differences smaller than this are "the same" (they print as ±0.000)
TIE = 0.0005


def _marker(d: float) -> tuple[str, str]:
    """(row class, text marker) of a difference."""
    if abs(d) < TIE:
        return "same", "= same"
    return ("better", "▲ better") if d > 0 else ("worse", "▼ worse")


def compare_sites(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per site with both scores: ``{site, federated, local, majority, delta}`` of the headline metric
    (``majority`` may be ``None``), in the federated model's site order."""
    models = {role: m for role, _, m in evaluated_models(result)}
    if FEDERATED not in models or LOCAL not in models:
        return []
    key, _ = headline_metric(models[FEDERATED])
    local, major = mapping(models[LOCAL].get("per_site")), mapping(mapping(models.get(MAJORITY)).get("per_site"))
    out = []
    for site, m in mapping(models[FEDERATED].get("per_site")).items():
        f, loc = mapping(m).get(key), mapping(local.get(site)).get(key)
        if f is None or loc is None or mapping(m).get("n") == 0:  # no test rows: nothing was scored there
            continue
        out.append({"site": site, "federated": float(f), "local": float(loc),
                    "majority": mapping(major.get(site)).get(key), "delta": float(f) - float(loc)})
    return out


def _site_list(rows: list[dict[str, Any]], label: str, other: str) -> str:
    return ", ".join(f"{esc(r['site'])} ({label} {num(r['federated'])} vs {num(r[other])}, "
                     f"{signed(r['federated'] - r[other])})" for r in rows)


def _against_sites(rows: list[dict[str, Any]], label: str, n: int) -> list[str]:
    """The sites where the federated model is worse, better and the same, each counted of the run's ``n`` sites."""
    worse = [r for r in rows if r["delta"] <= -TIE]
    better = [r for r in rows if r["delta"] >= TIE]
    same = [r for r in rows if abs(r["delta"]) < TIE]
    items = []
    if worse:
        items.append(f'<li class="worse"><span class="mark">▼ worse</span> The federated model is worse than '
                     f"training alone at {len(worse)} of {n} sites: {_site_list(worse, label, 'local')}.</li>")
    if better:
        items.append(f'<li class="better"><span class="mark">▲ better</span> It is better than training alone at '
                     f"{len(better)} of {n} sites: {_site_list(better, label, 'local')}.</li>")
    if same:
        items.append(f'<li class="same"><span class="mark">= same</span> The same as training alone at {len(same)} '
                     f"of {n} sites: {', '.join(esc(r['site']) for r in same)}.</li>")
    return items


def _overlaps(result: Mapping[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """A caution when the federated and local-only AUROC intervals overlap at a site where they differ."""
    models = {role: m for role, _, m in evaluated_models(result)}
    fed, loc = mapping(models[FEDERATED].get("per_site")), mapping(models[LOCAL].get("per_site"))
    both = [(r["site"], auroc_interval(mapping(fed.get(r["site"]))), auroc_interval(mapping(loc.get(r["site"]))))
            for r in rows if abs(r["delta"]) >= TIE]
    within = [s for s, a, b in both if a and b and None not in (a["low"], b["low"])
              and a["low"] <= b["high"] and b["low"] <= a["high"]]
    if not within:
        return []
    where = ("At the one site where the two differ" if len(both) == 1 else
             f"At {len(within)} of the {len(both)} sites where the two differ")
    return [f'<li class="warn"><span class="mark">⚠ chance?</span> {where} ({", ".join(esc(s) for s in within)}) '
            "their 95 % AUROC intervals overlap: with this many test rows the difference may be chance.</li>"]


def _below_majority(rows: list[dict[str, Any]], label: str, n: int) -> list[str]:
    """The sites where the federated model scores below always predicting the majority class (of ``n``)."""
    below = [r for r in rows if r["majority"] is not None and r["federated"] - float(r["majority"]) <= -TIE]
    if not below:
        return []
    return [f'<li class="worse"><span class="mark">▼ worse</span> It is worse than always predicting the majority '
            f"class at {len(below)} of {n} sites: {_site_list(below, label, 'majority')}.</li>"]


def _headline(rows: list[dict[str, Any]], n: int, what: str) -> str:
    """The verdict's first line, counted of the run's ``n`` sites (``what``: the score the compared
    sites have, for the sites that lack it)."""
    k = len(rows)
    every = "every site" if k == n else f"every site with {what}"
    worse = sum(r["delta"] <= -TIE for r in rows)
    better = sum(r["delta"] >= TIE for r in rows)
    if worse == k:
        return f"The federated model is worse than training alone at {every} ({k} of {n})."
    if worse:
        return f"The federated model is worse than training alone at {worse} of {n} sites."
    if better == k:
        return f"The federated model is better than training alone at {every} ({k} of {n})."
    return f"The federated model is at least as good as training alone at {every} ({better} of {n} better)."


def _unscored(unscored: Mapping[str, str], n: int, label: str) -> list[str]:
    """"AUROC at k of n sites" (or "Scored at …"), naming each site without one and why
    (:func:`unscored_sites`)."""
    if not unscored:
        return []
    what = "AUROC" if label == "AUROC" else "Scored"
    named = "; ".join(f"<strong>{esc(s)}</strong> {esc(why)}" for s, why in unscored.items())
    return [f'<li class="warn not-scored"><span class="mark">⚠ not scored</span> {what} at {n - len(unscored)} of '
            f"{n} sites: {named}. Such a site is in no site-by-site comparison; its test rows, if it has any, count "
            "in the pooled scores.</li>"]


def auroc_text(ci: Mapping[str, Any]) -> str:
    """A pooled AUROC as the verdict states it: the value, its bounds when it is not exact (the
    sites' smoothed histograms leave some pairs of rows unordered) and its 95 % interval."""
    return num(ci["auroc"]) + _auroc_note(ci)


def _auroc_note(ci: Mapping[str, Any] | None) -> str:
    """`` (an estimate: the exact value lies between … and …; 95 % CI …–…)`` of :func:`auroc_text`,
    "" without either."""
    if not ci:
        return ""
    bounds = ci.get("bounds")
    inside = []
    if bounds is not None and bounds[1] - bounds[0] >= TIE:
        inside.append(f"an estimate: the exact value lies between {num(bounds[0])} and {num(bounds[1])}, as the "
                      "sites' smoothed score histograms leave some pairs of rows unordered; secure aggregation "
                      "gives it exactly")
    if ci.get("low") is not None:
        inside.append(f"95 % CI {num(ci['low'])}–{num(ci['high'])}")
    return f" ({'; '.join(inside)})" if inside else ""


def _against_majority(models: dict[str, Mapping[str, Any]], key: str, label: str) -> list[str]:
    fed = mapping(models[FEDERATED].get("pooled"))
    f = fed.get(key)
    if f is None:
        return []
    ci = auroc_interval(fed) if key == "auroc" else None
    ci_text = _auroc_note(ci)
    major = mapping(models.get(MAJORITY))
    m = mapping(major.get("pooled")).get(key)
    if m is None:
        return [f"<li>Over all sites' test rows its {label} is {num(f)}{ci_text}; no majority-class baseline.</li>"]
    d = float(f) - float(m)
    cls, mark = _marker(d)
    covered = bool(ci and ci["low"] is not None and ci["low"] <= float(m) <= ci["high"])
    if covered and cls == "better":
        cls, mark = "same", "≈ not shown better"
    text = (f'<li class="{cls}"><span class="mark">{mark}</span> Over all sites\' test rows its {label} is '
            f"{num(f)}{ci_text} against {num(m)} for always predicting the majority class "
            f"“{esc(major.get('class', ''))}” ({signed(d)}).")
    if covered:
        text += f" The interval includes {num(m)}: this test set does not show it ranks better than chance."
    return [text + "</li>"]


def _unbounded(fed: Mapping[str, Any], pooled_key: str) -> list[str]:
    """A caution when the pooled AUROC is an estimate without a bound (so not headlined)."""
    a = mapping(fed.get("pooled")).get("auroc")
    if a is None or pooled_key == "auroc":
        return []
    return [f'<li class="warn"><span class="mark">⚠ estimate</span> The pooled AUROC ({num(a)}) was estimated '
            "from smoothed score histograms without a bound, so it is not stated above; the per-site AUROCs are "
            "exact.</li>"]


def _few_rows(models: dict[str, Mapping[str, Any]]) -> list[str]:
    few = []
    for site, m in mapping(models[FEDERATED].get("per_site")).items():
        ci = auroc_interval(mapping(m))
        if ci and ci["few"]:
            few.append(f"{esc(site)} ({ci['negatives']} negative{'s' * (ci['negatives'] != 1)}, "
                       f"{ci['positives']} positive{'s' * (ci['positives'] != 1)})")
    if not few:
        return []
    return [f'<li class="warn"><span class="mark">⚠ few rows</span> AUROC on fewer than {FEW_ROWS} test rows of a '
            f"class at {len(few)} site(s): {', '.join(few)}. One row more or less moves such an AUROC a lot; "
            "read it as a rough indication.</li>"]


def _one_class(result: Mapping[str, Any]) -> list[str]:
    """A caution per site that holds one class only (it is in no per-site AUROC comparison)."""
    return [f'<li class="warn one-class"><span class="mark">⚠ one class</span> {note}</li>'
            for note in one_class_notes(result)]


def _without_baselines(fed: Mapping[str, Any], private: bool) -> str:
    """No baselines: say so (and why, for a private run), and set the pooled AUROC (if any) against chance."""
    why = ("A private run leaves the local-only and majority-class baselines out (they release each site's own "
           "scores) unless <code>[evaluation] baselines = true</code>." if private else
           "The baselines step did not run (a job runs it unless <code>[evaluation] baselines = false</code>; "
           "<code>fedtab elect</code> does not).")
    out = ('<p class="headline"><strong>No comparison with training alone: this run computed no baselines.'
           f'</strong></p><p class="note">{why}</p>')
    ci = auroc_interval(mapping(fed.get("pooled")))
    if ci is None or ci["low"] is None or ci["bounds"] is None:  # an estimate without a bound is not headlined
        return out
    chance = ci["low"] <= 0.5 <= ci["high"]
    cls, mark = ("same", "≈ not shown better") if chance else _marker(ci["auroc"] - 0.5)
    return out + (f'<ul class="verdict"><li class="{cls}"><span class="mark">{mark}</span> Over all sites\' test rows '
                  f"its AUROC is {auroc_text(ci)}; 0.500 is chance"
                  + (": this test set does not show it ranks better than chance." if chance else ".") + "</li></ul>")


def _regression(fed: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """A regression run: the pooled RMSE / MAE / R² (exact: every site's sums over its test part,
    summed), each evaluated site's, and the sites without a test part (named)."""
    def text(m: Mapping[str, Any]) -> str:
        def num(k: str) -> str:
            return "n/a" if m.get(k) is None else f"{m[k]:.4g}"
        return f"RMSE {num('rmse')}, MAE {num('mae')}, R² {num('r2')} on {m.get('n', 0)} test rows"

    per_site = mapping(fed.get("per_site"))
    sites = mapping(result.get("sites"))
    items = [f"<li class=\"same\"><span class=\"mark\">·</span> {esc(str(s))}: {text(mapping(m))}</li>"
             for s, m in per_site.items()]
    items += [f"<li class=\"worse\"><span class=\"mark\">!</span> {esc(str(s))}: not evaluated — "
              f"{esc(str(mapping(info).get('no_test', '')))}</li>"
              for s, info in sites.items() if mapping(info).get("no_test")]
    n_eval = len(per_site) if per_site else None
    of = f" ({n_eval} of {len(sites)} sites evaluated)" if n_eval is not None and sites else ""
    return (f'<p class="headline"><strong>Regression: {text(mapping(fed.get("pooled")))} over all sites{of}.'
            f'</strong></p><p class="note">Exact: each site sends its sums of squared and absolute errors, of the '
            f"target and of its square over its own test part; the pooled scores are those of all test rows together."
            f" No local-only baselines in a regression job (<code>python -m benchmarks.regression</code> compares "
            f"them).</p><ul class=\"verdict\">{''.join(items)}</ul>")


def verdict(result: Mapping[str, Any]) -> str:
    """The ``verdict`` section's HTML (an absent note without a trained model)."""
    models = {role: m for role, _, m in evaluated_models(result)}
    if FEDERATED not in models:
        return absent("No model was trained in this job: there is no verdict to give.")
    key, label = headline_metric(models[FEDERATED])
    if key == "rmse":
        return _regression(models[FEDERATED], result)
    rows = compare_sites(result)
    unscored = unscored_sites(result)
    scored = len(mapping(models[FEDERATED].get("per_site"))) - sum(
        s in mapping(models[FEDERATED].get("per_site")) for s in unscored)
    n = max(len(rows), scored) + len(unscored) if unscored else len(rows)  # every site of the run
    if rows:
        head = _headline(rows, n, "an AUROC" if key == "auroc" else "test rows")
        items = (_against_sites(rows, label, n) + (_overlaps(result, rows) if key == "auroc" else [])
                 + _below_majority(rows, label, n))
    elif LOCAL not in models and MAJORITY not in models:
        privacy = mapping(result.get("privacy"))
        notes = _unscored(unscored, n, label) + _one_class(result)
        return (_without_baselines(models[FEDERATED], bool(privacy.get("secure_aggregation") or privacy.get("dp")))
                + (f'<ul class="verdict">{"".join(notes)}</ul>' if notes else ""))
    elif LOCAL not in models:
        head = "No site-by-site comparison: this run computed no local-only baselines."
        items = []
    else:
        head = "No site-by-site comparison: the server saw only pooled scores (secure aggregation)."
        items = []
    pooled_key, pooled_label = pooled_headline(models[FEDERATED])
    items += (_unscored(unscored, n, label) + _against_majority(models, pooled_key, pooled_label)
              + _unbounded(models[FEDERATED], pooled_key) + _few_rows(models) + _one_class(result)
              + selection_verdict_notes(result))
    return (f'<p class="headline"><strong>{head}</strong></p>'
            f'<p class="note">Compared on {label}, on the same held-out test rows of every site.</p>'
            f"<ul class=\"verdict\">{''.join(items)}</ul>")
