"""The report's sections about the run's data and steps: sites, guarantees, imputation,
election, tuning, traffic. Each takes the result mapping and returns HTML (an absent note
when its data is missing)."""

from __future__ import annotations

import math
from typing import Any, Mapping

from .data import site_summaries, unscored_key, unscored_sites
from .markup import absent as _absent
from .markup import esc as _e
from .markup import figure
from .markup import nbytes as _bytes
from .markup import num as _num
from .markup import signed
from .markup import table as _table

__all__ = ["sites", "guarantees", "imputation", "election", "tuning", "steps", "one_class_notes"]


def _took_part(took: Mapping[str, Any]) -> list[str]:
    """What a one-class site did in each step, from its ``participation`` record (unknown steps left out)."""
    parts = []
    vote = took.get("election")
    if isinstance(vote, str) and vote.startswith("abstained"):
        why = vote.partition(":")[2].strip()
        parts.append("it abstained from the feature election's vote" + (f" ({_e(why)})" if why else ""))
    elif vote == "voted":
        parts.append("it voted in the feature election")
    if took.get("training") is True:
        parts.append("it took part in training")
    elif took.get("training") is False:
        parts.append("it was left out of training")
    if took.get("evaluation") is True:
        parts.append("its test rows were scored, but it has no AUROC (an AUROC needs both classes)")
    else:
        parts.append(("it was not evaluated and " if took.get("evaluation") is False else "") + "it has no AUROC")
    return parts


def one_class_notes(result: Mapping[str, Any]) -> list[str]:
    """One HTML sentence per site marked ``one_class`` in ``result["sites"]``: that it holds one
    class only and what it took part in (``sites.<s>.participation``: election vote, training,
    evaluation). Empty when no site is marked."""
    return [f"Site <strong>{_e(s['name'])}</strong> holds one class only: "
            + "; ".join(_took_part(s.get("participation") if isinstance(s.get("participation"), Mapping) else {}))
            + "." for s in site_summaries(result) if s.get("one_class") is True]


def sites(result: Mapping[str, Any]) -> str:
    sites = site_summaries(result)
    if not sites:
        return _absent("No site information in this result.")
    counts = [(k, h) for k, h in (("rows", "Rows"), ("rows_train", "Training rows"), ("rows_test", "Test rows"),
                                  ("rows_without_label", "Rows without a label (dropped)"))
              if any(s.get(k) is not None for s in sites)]  # a command without test parts has no such column
    unscored = unscored_sites(result)  # a run with per-site scores: why a site has none of its own
    what = "AUROC" if unscored_key(result) == "no_auroc" else "score"
    why = [f"No {what} (why)"] if unscored else []
    out = [_table(["Site", *(h for _, h in counts), "Columns held", *why],
                  [[_e(s["name"]), *(_num(s.get(k)) for k, _ in counts), _num(len(s["columns"])),
                    *([_e(unscored.get(s["name"], "—"))] if unscored else [])] for s in sites],
                  ["not-scored" if s["name"] in unscored else "" for s in sites],
                  num_cols=range(1, len(counts) + 2), text_cols=(len(counts) + 2,) if unscored else ())]
    named = {s["name"] for s in sites}
    out += [f'<p class="warn not-scored"><span class="warn">⚠ no {what}</span> Site <strong>{_e(s)}</strong> '
            f"{_e(w)}.</p>" for s, w in unscored.items() if s not in named]  # dropped before it was profiled
    out += [f'<p class="warn one-class"><span class="warn">⚠ one class</span> {note}</p>'
            for note in one_class_notes(result)]
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


def guarantees(result: Mapping[str, Any]) -> str:
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
                               for s in steps], text_cols=(2,)))
        dropped = part.get("dropped") or {}
        out.append("<p>" + ("Sites left out of the run: " + "; ".join(f"<strong>{_e(k)}</strong> ({_e(v)})"
                                                                     for k, v in dropped.items())
                            if dropped else "No site was left out of the run.") + "</p>")
    return "".join(out)


def imputation(result: Mapping[str, Any]) -> str:
    imp = result.get("imputation")
    if not isinstance(imp, Mapping):
        return _absent("Imputation was not run in this job (missing cells were filled with the pooled mean).")
    val = imp.get("validation_rmse_z") or imp.get("validation") or {}
    per_col = val.get("per_column") or {}
    mean_fill = (imp.get("mean_fill_rmse_z") or {}).get("per_column") or val.get("per_column_mean_fill") or {}
    if not per_col:
        return _absent("Imputation ran, but no site had held-out cells to measure its quality on.")
    if all(v is None for v in per_col.values()):
        out = ['<p class="warn"><span class="warn">⚠ unmeasured</span> No site released a validation error for any '
               "column: each site's held-out cells per column were fewer than its <code>min_rows</code> (smaller "
               "counts are suppressed), so this run's imputation quality is unknown.</p>"]
    else:
        out = ['<p class="note">Error on observed cells hidden from the imputer, in standard deviations of the '
               "column (RMSE on the z-scale). The baseline fills every missing cell with the pooled mean; an "
               "imputer below it recovers information from the other columns.</p>", _quality_table(per_col, mean_fill),
               f"<p>Overall RMSE: {_num(val.get('overall'))}"
               + (f"; model of round {_num(imp.get('best_round'))} kept." if imp.get("best_round") else ".") + "</p>"]
    curve = [h for h in imp.get("training_curve") or [] if isinstance(h, Mapping) and isinstance(h.get("round"), int)]
    if curve:
        from .plots import imputation_curve_figure

        best = imp.get("best_round") if isinstance(imp.get("best_round"), int) else None
        out.append(figure("imputation-curve", imputation_curve_figure(curve, best), "imputer training curve"))
    return "".join(out)


def _quality_table(per_col: Mapping[str, Any], mean_fill: Mapping[str, Any]) -> str:
    """Imputer against mean-fill RMSE per column; a loss marked red, with a minus sign and "▼ worse"."""
    rows, classes = [], []
    for col, rmse in per_col.items():
        base = mean_fill.get(col)
        gain = None if rmse is None or base in (None, 0) else 1 - rmse / base
        rows.append([_e(col), _num(rmse), _num(base), "—" if gain is None else
                     f'<span class="delta">{signed(100 * gain, 0)} %'
                     + (" ▼ worse" if round(100 * gain) < 0 else "") + "</span>"])
        classes.append("" if gain is None else ("better" if gain > 0 else "worse"))
    return _table(["Column", "Imputer RMSE", "Mean-fill RMSE", "Improvement"], rows, classes, num_cols=(1, 2, 3))


def election(result: Mapping[str, Any]) -> str:
    el = result.get("election")
    if not isinstance(el, Mapping):
        return _absent("No feature election in this job (every column was used).")
    if el.get("method") == "score-test":
        return _score_test(el)
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
                      rows, ["kept" if f["kept"] else "dropped" for f in ordered], num_cols=(5, 6), text_cols=(2,)))
    out.append(_pooled_agreement(el))
    return "".join(out)


def _score_test(el: Mapping[str, Any]) -> str:
    """The score-test selection: its error control (q and correction, or the forward steps'
    level) and each column's pooled p-value."""
    fdr = el.get("fdr")
    names = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli"}
    if isinstance(fdr, Mapping):
        how = (f"<p>Selection with error control: every column's score test on the pooled rows, one "
               f"{_e(names.get(fdr.get('method'), fdr.get('method')))} correction at false discovery rate "
               f"<strong>q = {_num(fdr.get('q'))}</strong> (at most that share of the kept columns is expected to "
               f"carry no signal).</p>")
    else:
        how = (f"<p>Forward selection by score tests on the pooled rows, each step's "
               f"{_e(names.get(el.get('fdr_method', 'bh'), ''))} correction at α = {_num(el.get('alpha'))} "
               "(the whole sequence's false discovery rate is approximate).</p>")
    stats = el.get("stats") or {}
    out = [how, f"<p>Kept {_num(stats.get('kept'))} of {_num(stats.get('features'))} columns.</p>"]
    names_, p, mask = el.get("feature_names") or [], el.get("p") or [], el.get("mask") or []
    if names_ and len(p) == len(names_) == len(mask):
        rows = sorted(zip(names_, p, mask), key=lambda r: (not r[2], r[1] if r[1] is not None else 2.0))
        out.append(_table(["Column", "Decision", "Pooled p-value"],
                          [[_e(n), "kept" if k else "dropped", "—" if v is None else f"{float(v):.3g}"]
                           for n, v, k in rows],
                          ["kept" if k else "dropped" for _, _, k in rows], num_cols=(2,)))
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


def tuning(result: Mapping[str, Any]) -> str:
    tun = result.get("tuning")
    if isinstance(tun, Mapping) and isinstance(tun.get("summary"), Mapping):
        tun = {**tun["summary"], **{k: v for k, v in tun.items() if k != "summary" and v is not None}}
    if not isinstance(tun, Mapping) or not tun.get("curve"):
        return _absent("The freedom degree was set in the job file, not tuned.")
    from .plots import tuning_curve_figure

    curve = [c for c in tun["curve"] if isinstance(c, Mapping)]
    out = [f"<p>Chosen freedom degree {_num(tun.get('freedom_degree'), 2)} ({_e(tun.get('method', ''))}), keeping "
           f"{_num(tun.get('kept'))} columns, validation F1 {_num(tun.get('score'))}. Scores are measured on a "
           "validation part of each site's training rows; the test rows are never used for this choice.</p>"]
    out.append(figure("tuning", tuning_curve_figure([{**tun, "curve": curve}]), "tuning curve"))
    out.append(_table(["Freedom degree", "Validation F1", "Columns kept"],
                      [[_num(c.get("freedom_degree"), 2), _num(c.get("score")), _num(c.get("kept"))] for c in curve],
                      num_cols=(0, 1, 2)))
    return "".join(out)


def steps(result: Mapping[str, Any]) -> str:
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

