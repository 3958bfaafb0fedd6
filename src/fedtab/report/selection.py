"""The report's model-selection section (``[election] tune = "cv"``, issue 22).

:func:`selection_section` renders, from a job's ``result.json`` content:

* the choice: the chosen candidate's pooled cross-validated log-loss ± standard error (and
  AUROC ± SE) next to all columns' and the best freedom degree's, the rule that chose, and
  the personalisation modes compared;
* federated (the shipped, personalised model) next to local-only for every site, on the same
  test rows (``training.metrics`` and ``local_only``);
* the contribution table (``contributions[site]``: AUROC without the site, its change, the
  log-loss change, columns only that site measures, columns its ballot decided) and a plot of
  the two changes per site;
* per site, the kept columns it must impute at prediction (``measured``);
* what each site abstained from (``selection.abstentions``: columns it does not vote on, folds
  it casts no ballot on or does not score, no test rows, dropped by the quorum) — and, for the
  verdict (:func:`selection_verdict_notes`), the candidates the AUROC guard passed over and any
  choice more than 0.01 below the best CV AUROC.

Every site-derived string is escaped (through :mod:`fedtab.report.html`'s helpers); a result
without a selection gets one line saying so.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["selection_section", "contribution_figure", "selection_verdict_notes"]


def _score(cand: Mapping[str, Any] | None, key: str) -> str:
    from .markup import num as _num

    if not isinstance(cand, Mapping) or cand.get(key) is None:
        return "—"
    se = cand.get(f"{key}_se")
    return _num(cand[key], 4) + ("" if se is None else f" ± {_num(se, 4)}")


def _choice_regression(sel: Mapping[str, Any]) -> str:
    """A numeric target's selection: every candidate's CV RMSE ± SE beside its columns."""
    from .markup import esc as _e, num as _num, table as _table

    g = ((sel.get("rule") or {}).get("columns") or {}).get("rmse_guard") or {}
    rows, classes = [], []
    for cand in sel.get("candidates") or []:
        fd = cand.get("freedom_degree")
        rows.append([_e(cand.get("name", "")), "all" if fd is None else _num(fd, 2), _num(cand.get("kept")),
                     _score(cand, "rmse"), _num(cand.get("r2"), 3) if cand.get("r2") is not None else "—"])
        classes.append("kept" if cand.get("chosen") else "")
    note = ('<p class="note">Each candidate was fitted exactly (pooled normal equations) on every fold\'s fit rows '
            "and scored on the held-out fold rows of every site, pooled by sums. Score: pooled cross-validated "
            "squared error; the chosen mask is the one with the fewest columns within one standard error of the "
            "paired fold differences to the best candidate and within "
            f"{_num(100 * float(g.get('tolerance', 0.03)), 0)} % of the best CV RMSE.</p>")
    if g.get("passed_over"):
        note += (f'<p class="warn">The one-standard-error rule alone would have chosen {_e(g.get("rule_choice", ""))}, '
                 f"more than the tolerance above the best CV RMSE ({_num(g.get('best_rmse'))}); the selection kept "
                 f"a candidate within it instead (CV RMSE {_num(g.get('chosen_rmse'))}).</p>")
    features = sel.get("features") or []
    return (note + _table(["Candidate", "Freedom degree", "Columns kept", "CV RMSE ± SE", "CV R²"], rows, classes,
                          num_cols=(1, 2, 3, 4))
            + f"<p>Chosen columns ({len(features)}): {', '.join(_e(f) for f in features)}; CV RMSE "
              f"{_num(sel.get('cv_rmse'))} (all columns {_num(sel.get('all_columns_cv_rmse'))}).</p>")


def _choice(sel: Mapping[str, Any]) -> str:
    from .markup import esc as _e, num as _num, table as _table

    if sel.get("task") == "regression":
        return _choice_regression(sel)
    rows, classes = [], []
    for label, cand in (("chosen", sel.get("chosen")), ("all columns", sel.get("all_columns")),
                        ("best freedom degree", sel.get("best_fd"))):
        if not isinstance(cand, Mapping):
            continue
        fd = cand.get("freedom_degree")
        rows.append([_e(label), _e(cand.get("name", "")), "all" if fd is None else _num(fd, 2), _num(cand.get("kept")),
                     _score(cand, "logloss"), _score(cand, "auroc")])
        classes.append("kept" if label == "chosen" else "")
    note = ('<p class="note">Each candidate (the election at a freedom degree, or all columns) was trained on '
            "every fold's fit rows and scored on the held-out fold rows of every site, pooled by sums. Score: "
            "pooled cross-validated log-loss (lower is better) ± its standard error over the folds, and the "
            "pooled CV AUROC (the mean of the folds' pooled AUROCs: each site's own pairs exact, pairs across "
            "sites bounded by the score histograms) ± its standard error. The chosen mask is the one with the "
            "fewest columns whose log-loss is within one standard error of the paired fold differences to the "
            "best candidate and whose CV AUROC is within 0.01 of the best CV AUROC; the final model is refitted "
            "on all training rows and scored on the test rows, which the selection never saw.</p>")
    guard = _guard_text(sel)
    if guard:
        note += f'<p class="warn">{guard}</p>'
    modes = sel.get("modes") if isinstance(sel.get("modes"), Mapping) else {}
    mode_rows = [[_e(m), _score(s, "logloss"), _score(s, "auroc"), _e("chosen" if m == sel.get("personalisation")
                                                                     else "")]
                 for m, s in modes.items() if isinstance(s, Mapping)]
    out = [note, _table(["", "Candidate", "Freedom degree", "Columns kept", "CV log-loss ± SE", "CV AUROC ± SE"], rows,
                        classes, num_cols=(2, 3, 4, 5))]
    features = sel.get("features") or []
    out.append(f"<p>Chosen columns ({len(features)}): {', '.join(_e(f) for f in features)}. "
               f"Personalisation: <strong>{_e(sel.get('personalisation', 'none'))}</strong>.</p>")
    if mode_rows:
        out.append(_table(["Personalisation", "CV log-loss ± SE", "CV AUROC ± SE", ""], mode_rows, num_cols=(1, 2)))
    return "".join(out)


def _guard(sel: Mapping[str, Any]) -> Mapping[str, Any]:
    rule = sel.get("rule") if isinstance(sel.get("rule"), Mapping) else {}
    cols = rule.get("columns") if isinstance(rule.get("columns"), Mapping) else {}
    g = cols.get("auroc_guard")
    return g if isinstance(g, Mapping) else {}


def _guard_text(sel: Mapping[str, Any]) -> str:
    """One sentence (HTML) when the AUROC guard set the one-SE rule's choice aside or the choice
    is more than the tolerance below the best CV AUROC; ``""`` otherwise."""
    from .markup import esc as _e, num as _num

    g = _guard(sel)
    tol = g.get("tolerance") if isinstance(g.get("tolerance"), (int, float)) else 0.01
    out = []
    if g.get("passed_over"):
        out.append(f"The one-standard-error rule alone would have chosen {_e(g.get('rule_choice', ''))} "
                   f"(CV AUROC {_num(g.get('rule_auroc'))}), more than {_num(tol, 2)} below the best CV AUROC "
                   f"({_num(g.get('best_auroc'))}, {_e(g.get('best', ''))}); the selection kept the sparsest "
                   f"candidate within {_num(tol, 2)} instead (CV AUROC {_num(g.get('chosen_auroc'))}).")
    short = g.get("shortfall")
    if g.get("flagged") or (isinstance(short, (int, float)) and short > tol + 1e-12):
        out.append(f"The chosen columns' CV AUROC is {_num(short)} below the best candidate's "
                   f"({_e(g.get('best', ''))}): the selection traded ranking for fewer columns.")
    return " ".join(out)


def selection_verdict_notes(result: Mapping[str, Any]) -> list[str]:
    """The verdict's items (``<li>`` HTML) about a cross-validated selection: the AUROC the
    choice gave up or the candidates the guard set aside (:func:`_guard_text`), and the sites
    that abstained from part of it; ``[]`` without a selection or with nothing to say."""
    from .markup import esc as _e

    sel = result.get("selection")
    if not isinstance(sel, Mapping):
        return []
    items = []
    text = _guard_text(sel)
    if text:
        items.append(f'<li class="warn"><span class="mark">⚠ selection</span> {text}</li>')
    abst = sel.get("abstentions")
    if isinstance(abst, Mapping) and abst:
        items.append(f'<li class="warn"><span class="mark">⚠ abstained</span> {len(abst)} site(s) abstained from '
                     f"part of the model selection ({', '.join(_e(s) for s in abst)}); the selection section says "
                     "what and why.</li>")
    return items


def _abstentions(sel: Mapping[str, Any]) -> str:
    from .markup import esc as _e, table as _table

    abst = sel.get("abstentions")
    if not isinstance(abst, Mapping) or not abst:
        return ""
    rows = [[_e(s), "<br>".join(_e(str(n)) for n in (notes if isinstance(notes, list) else [notes]))]
            for s, notes in abst.items()]
    return ("<h3>What each site abstained from</h3>"
            '<p class="note">A site abstains from what it cannot answer on its own rows (a column it does not '
            "measure in every fold's fit rows, a part with one class, folds or test rows it is too small for); "
            "the run goes on while the quorum holds.</p>" + _table(["Site", "Abstained from"], rows))


def _local_vs_federated(result: Mapping[str, Any]) -> str:
    from .markup import esc as _e, num as _num, table as _table

    fed = ((result.get("training") or {}).get("metrics") or {}).get("per_site") or {}
    local = (result.get("local_only") or {}).get("per_site") or {}
    if not fed:
        return ""
    rows, classes = [], []
    for s, m in fed.items():
        f, lo = (m or {}).get("auroc"), (local.get(s) or {}).get("auroc")
        d = None if f is None or lo is None else f - lo
        rows.append([_e(s), _num(f), _num(lo), "—" if d is None else f"{d:+.3f}"])
        classes.append("" if d is None else ("better" if d > 0 else "worse"))
    return ("<h3>Federated (the shipped model) and local-only, per site</h3>"
            '<p class="note">Test rows of each site; local-only = the same model trained on that site\'s rows '
            "alone.</p>" + _table(["Site", "Federated AUROC", "Local-only AUROC", "Difference"], rows, classes,
                                  num_cols=(1, 2, 3)))


def contribution_figure(contributions: Mapping[str, Mapping[str, Any]]) -> Any:
    """Bars per site: the pooled CV AUROC change and log-loss change when the site is left out
    of training (positive = the site helps). Returns the open figure."""
    from .plots import plt

    sites = list(contributions)
    auc = [contributions[s].get("auroc_delta") or 0.0 for s in sites]
    ll = [contributions[s].get("logloss_delta") or 0.0 for s in sites]
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.45 * max(len(sites), 2)))
    ys = range(len(sites))
    ax.barh([y - 0.2 for y in ys], auc, height=0.4, label="AUROC gained with the site", color="C0")
    ax.barh([y + 0.2 for y in ys], ll, height=0.4, label="log-loss saved with the site", color="C1")
    ax.set_yticks(list(ys), sites)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("change of the pooled cross-validated score (positive = the site helps)")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _contributions(result: Mapping[str, Any]) -> str:
    from .markup import esc as _e, figure, num as _num, signed, table as _table

    contrib = result.get("contributions")
    if not isinstance(contrib, Mapping) or not contrib:
        return ""
    rows, classes = [], []
    for s, c in contrib.items():
        if not isinstance(c, Mapping):
            continue
        d = c.get("auroc_delta")
        rows.append([_e(s), _num(c.get("auroc_without")), "—" if d is None else signed(d),
                     "—" if c.get("logloss_delta") is None else signed(c["logloss_delta"], 4),
                     _e(", ".join(map(str, c.get("columns_only_here") or [])) or "—"),
                     _e(", ".join(map(str, c.get("ballot_decided") or [])) or "—")])
        classes.append("" if d is None else ("better" if d > 0 else "worse" if d < 0 else ""))
    table = _table(["Site", "CV AUROC without it", "AUROC change", "Log-loss change", "Columns only it measures",
                    "Columns its ballot decided"], rows, classes, num_cols=(1, 2, 3))
    plot = figure("contributions", contribution_figure({s: c for s, c in contrib.items() if isinstance(c, Mapping)}),
                  "contribution of each site")
    return ("<h3>Contribution of each site</h3>"
            '<p class="note">The chosen columns\' model trained without the site (leave-one-site-out, in the same '
            "exchanges), scored on the same held-out fold rows of every site. A positive change means the "
            "federation is better with the site.</p>" + table + plot)


def _must_impute(measured: Any) -> str:
    from .markup import esc as _e, table as _table

    if not isinstance(measured, Mapping) or not measured:
        return ""
    rows = [[_e(s), _e(", ".join(map(str, (m or {}).get("must_impute") or [])) or "—"),
             _e(", ".join(map(str, (m or {}).get("partly_imputed") or [])) or "—")]
            for s, m in measured.items() if isinstance(m, Mapping)]
    return ("<h3>Columns each site must impute</h3>"
            '<p class="note">Kept columns a site never measures (filled by the imputer at prediction) or measures '
            "only in part; a site ballots only on the cells it measures.</p>"
            + _table(["Site", "Never measured", "Partly imputed"], rows))


def selection_section(result: Mapping[str, Any]) -> str:
    """The section's HTML (see the module docstring)."""
    from .markup import absent as _absent

    sel = result.get("selection")
    if not isinstance(sel, Mapping):
        return _absent("No cross-validated model selection in this job ([election] tune = \"cv\").")
    parts: Sequence[str] = (_choice(sel), _abstentions(sel), _local_vs_federated(result), _contributions(result),
                            _must_impute(result.get("measured")))
    return "".join(parts)
