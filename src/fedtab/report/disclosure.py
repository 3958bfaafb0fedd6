"""The disclosure statement: what left the sites in *this* run, from the run's own records.

Built from ``result["participation"]["exchanges"]`` (one ``{"step": message kind, "sites"}``
per exchange the server made, :func:`fedtab.job.guarantees.participation_record`), the
sites' release declarations (:data:`fedtab.federation.site.RELEASES`, through
:func:`fedtab.federation.site.find_releases`), the agreed schema (how many columns had a
coarse range or a category list released) and ``result["privacy"]`` (secure aggregation,
differential privacy). Nothing is claimed that the records do not show: a run without a
participation record says so instead of guessing.
"""

from __future__ import annotations

from typing import Any, Mapping

from .data import mapping
from .markup import absent, esc, num, table

__all__ = ["disclosure", "disclosure_summary", "released_kinds", "WHAT"]

#: message kind -> what one site's reply to it holds, in plain words (``{ranges}``, ``{categories}``
#: and ``{floor}`` are filled from the run)
WHAT: dict[str, str] = {
    "column_roles": "the number of columns left after the job's [columns] ignore/categorical (no value)",
    "job_profile": "column names and kinds, row counts, class labels and, per numeric column, whether it holds only "
                   "integers and a coarse min/max range (the {floor_th} smallest and largest values rounded outward "
                   "to two significant digits){ranges}; whether a column is unique per row (a yes/no ID "
                   "flag); for integer-coded columns with few values, the values held by at least {floor} rows "
                   "(what imputation may fill in)",
    "schema": "column names and kinds (the schema declaration)",
    "category_sets": "the category lists of categorical columns (categories seen in at least {floor} rows){categories}",
    "one_hot": "an acknowledgement (how many encoded columns)",
    "describe": "per column: count, sum and sum of squares over the training rows",
    "set_mask": "per elected column: count, sum and sum of squares over the training rows",
    "setup": "an acknowledgement",
    "fit": "model parameters after local training and the number of training rows (one update per round)",
    "evaluate": "per test part: the confusion matrix (per class), a Brier sum, a histogram of predicted "
                "probabilities per class and a rank-pair count",
    "ballot": "a ballot: which columns the site's selector chose, a score (and p-value) per column, the sample count",
    "ballot_fit": "a ballot on a tuning part of the training rows (mask and scores per column)",
    "local_baseline": "the test-row scores of the site's own local-only model (confusion matrix, score histogram, "
                      "Brier sum, rank pairs) and its training rows per class",
    "score_sums": "score-test sums (gradient and curvature sums) over the training rows",
    "class_moments": "per class and column: count, sum and sum of squares",
    "impute_schema": "per column: count, sum and sum of squares over the training rows (the imputer's scaling)",
    "impute_stats": "per column pair: co-observed count, sums, sums of squares and cross-products (correlations)",
    "impute_setup": "training and validation row counts",
    "impute_fit": "imputer (GNN) weights after local training and validation error sums",
    "impute_eval": "imputation error sums on held-out test cells",
    "impute_apply": "how many cells were imputed and clipped (counts only)",
    "impute_fill": "how many cells were imputed (counts only)",
    "gbdt_summary": "per feature: quantile summaries of the values (candidate split points) with their counts",
    "gbdt_start": "sums of the labels over the training rows",
    "gbdt_level": "gradient and hessian histograms per feature bin for the tree level, a validation loss",
    "gbdt_evaluate": "per test part: the confusion matrix, a Brier sum, a score histogram and a rank-pair count",
    "gbdt_score": "a sum of squared errors over the test rows",
    "gbdt_importance": "per feature: the split gain on the site's own training rows, from its record of the splits "
                       "it applied (splits with a node or child of fewer than {floor} rows left out)",
    "select_prepare": "ballots per fold (mask and scores per column) and per-column counts, sums and sums of squares",
    "select_fit": "model parameters after local training",
    "select_evaluate": "per part: confusion matrix, log-loss and Brier sums, a score histogram and rank pairs",
    "secagg_keys": "public keys for secure aggregation (no data)",
    "secagg_sign": "a signature of the survivor list (no data)",
    "secagg_unmask": "secret shares to remove masks (no data)",
}


#: kinds the server receives through the run's summing strategy (masked under secure aggregation)
SUMMED = frozenset({"describe", "set_mask", "fit", "evaluate", "gbdt_evaluate", "impute_schema", "impute_stats",
                    "impute_fit", "impute_eval", "gbdt_start", "gbdt_level", "gbdt_score"})
#: what an evaluation holds under differential privacy (the histogram, Brier and rank sums are not sent)
_DP_EVALUATE = "per test part: the confusion matrix (per class) only — no score histogram, Brier sum or rank pairs"


def released_kinds(result: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``[{kind, exchanges, sites}]`` in first-use order, from the participation record; ``None``
    when the result has none."""
    part = mapping(result.get("participation"))
    exchanges = part.get("exchanges")
    if not isinstance(exchanges, list):
        return None
    out: dict[str, dict[str, Any]] = {}
    for e in exchanges:
        if not isinstance(e, Mapping) or not isinstance(e.get("step"), str):
            continue
        row = out.setdefault(e["step"], {"kind": e["step"], "exchanges": 0, "sites": []})
        row["exchanges"] += 1
        row["sites"] += [s for s in e.get("sites") or [] if isinstance(s, str) and s not in row["sites"]]
    return list(out.values())


def _floor(result: Mapping[str, Any]) -> str:
    """The sites' disclosure floor (``min_rows``) as text: one number, a range, or the default."""
    sites = mapping(result.get("job")).get("sites")
    floors = sorted({s.get("min_rows") for s in sites if isinstance(s, Mapping) and isinstance(s.get("min_rows"), int)}
                    ) if isinstance(sites, list) else []
    if not floors:
        from ..privacy.policy import DisclosurePolicy

        return str(DisclosurePolicy().min_rows)
    return str(floors[0]) if len(floors) == 1 else f"{floors[0]}–{floors[-1]}"


def _ordinal(n: str) -> str:
    """``"4"`` -> ``"4th"``, ``"1"`` -> ``"1st"``; a range ``"4–10"`` -> ``"min_rows-th"``."""
    if not n.isdigit():
        return "min_rows-th"
    k = int(n)
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def _what(kind: str, result: Mapping[str, Any]) -> str:
    schema = mapping(result.get("schema"))
    ranges, cats = mapping(schema.get("ranges")), mapping(schema.get("categories"))
    text = WHAT.get(kind)
    if text is None:  # a message this page does not know: what its declaration says it may hold
        from ..federation.site import find_releases

        try:
            d = find_releases(kind)
        except (KeyError, LookupError, ImportError, ValueError):
            d = None
        if d is None:
            return "(no release declaration found for this message)"
        arrays = [*d.aggregates, *d.cells, *(x for v in d.cells.values() for x in v), *d.histograms]
        return "declared arrays: " + (", ".join(sorted(set(arrays))) or "none") + (
            "; model parameters" if d.model else "")
    privacy = mapping(result.get("privacy"))
    dp = bool(privacy.get("dp"))
    if dp and kind in ("evaluate", "gbdt_evaluate"):
        text = _DP_EVALUATE
    floor = _floor(result)
    text = text.format(floor=floor, floor_th=_ordinal(floor),
                       ranges=f" — released for {len(ranges)} column(s) in this run" if ranges else "",
                       categories=f" — released for {len(cats)} column(s) in this run" if cats else "")
    if dp and _noised(kind):
        text += "; noised by the site (differential privacy)"
    if privacy.get("secure_aggregation") and kind in SUMMED:
        text += "; masked: the server learned only the sum over the sites"
    return text


def _noised(kind: str) -> bool:
    """Whether the sites noise ``kind``'s reply under DP (its release declaration says so)."""
    from ..federation.site import find_releases

    try:
        d = find_releases(kind)
    except (ImportError, ValueError):
        return False
    return bool(d is not None and d.dp)


def disclosure_summary(result: Mapping[str, Any]) -> str:
    """One sentence (HTML) for the page header: what left the sites, from the records."""
    kinds = released_kinds(result)
    if kinds is None:
        return "This result carries no record of the messages exchanged, so the report cannot say what left the sites."
    names = {k["kind"] for k in kinds}
    dp = bool(mapping(result.get("privacy")).get("dp"))
    schema = mapping(result.get("schema"))
    ranges, cats = mapping(schema.get("ranges")), mapping(schema.get("categories"))
    parts = []  # ranges and categories count only when this run asked the sites for them (not a given profile)
    if ranges and "job_profile" in names:
        parts.append(f"coarse min/max values of {len(ranges)} column(s)")
    if cats and "category_sets" in names:
        parts.append(f"the category lists of {len(cats)} column(s)")
    groups = [({"describe", "set_mask", "impute_schema", "class_moments", "select_prepare"},
               "per-column counts, sums and sums of squares"),
              ({"impute_stats"}, "pairwise correlation statistics"),
              ({"ballot", "ballot_fit", "select_prepare"}, "each site's ballot (chosen columns and their scores)"),
              ({"gbdt_summary"}, "quantile summaries of feature values"),
              ({"gbdt_level"}, "gradient histograms"),
              ({"gbdt_importance"}, "each site's split gains per feature"),
              ({"fit", "select_fit", "impute_fit"}, "model parameters after each round"),
              ({"evaluate", "gbdt_evaluate", "select_evaluate"},
               "confusion matrices" + ("" if dp else " and score histograms") + " of the test rows"),
              ({"local_baseline"}, "each site's local-only model scores")]
    parts += [text for group, text in groups if group & names]
    if not parts:
        return "Only acknowledgements and row counts left the sites."
    secure = mapping(result.get("privacy")).get("secure_aggregation")
    tail = " Sums travelled masked (secure aggregation): the server saw totals, not one site's." if secure else ""
    if dp:
        tail += " The sites added noise to their releases (differential privacy)."
    return ("Left the sites in this run: " + "; ".join(esc(p) for p in parts)
            + ". No table row left a site." + tail)


def _sent(k: Mapping[str, Any]) -> str:
    """The message cell: the kind, then how many exchanges and answering sites."""
    n, m = k["exchanges"], len(k["sites"])
    return (f'<code>{esc(k["kind"])}</code><br><span class="note">{n} exchange{"s" * (n != 1)}, '
            f'{m} site{"s" * (m != 1)}</span>')


def disclosure(result: Mapping[str, Any]) -> str:
    """The ``disclosure`` section's HTML: the summary, then one row per message kind sent."""
    kinds = released_kinds(result)
    if kinds is None:
        return absent("No record of the messages exchanged in this result (no participation record).")
    privacy = mapping(result.get("privacy"))
    dp = mapping(privacy.get("dp"))
    out = [f"<p>{disclosure_summary(result)}</p>",
           f'<p class="note">Every reply left its site through the site\'s release gate, which refuses anything its '
           f"handler does not declare and computes no number over fewer than {esc(_floor(result))} rows (each site's "
           "<code>min_rows</code>); small counts are sent as 0, score histograms are smoothed to runs of that many "
           "rows unless securely summed.</p>"]
    if privacy.get("secure_aggregation"):
        out.append("<p>Secure aggregation was on: quantities the server needs only as sums travelled masked; it "
                   "learned their total over the sites, not any one site's.</p>")
    if dp:
        out.append(f"<p>Differential privacy was on: the sites noised their releases; ε spent "
                   f"{num(dp.get('epsilon_spent'))} of a budget of {num(dp.get('epsilon'))} "
                   f"(δ = {esc(dp.get('delta'))}).</p>")
    rows = [[_sent(k), esc(_what(k["kind"], result))] for k in kinds]  # two columns: readable at 400 px
    out.append(table(["Message", "What each answering site sent"], rows, table_id="disclosure-messages",
                     text_cols=(1,)))
    return "".join(out)
