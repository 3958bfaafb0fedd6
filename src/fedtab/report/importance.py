"""The report's feature-importance section: gain of the boosted trees, pooled and per site.

Reads ``result["training"]["importance"]`` (written by the training step for ``gbdt`` models,
:func:`fedtab.federation.workflows.gbdt.server.importance_step`): ``pooled`` (total split gain per
feature, XGBoost's ``total_gain``), ``pooled_mean`` (mean gain per split, XGBoost's ``gain``),
``per_site`` (each site's gains on its own training rows), ``suppressed``, ``per_site_skipped``
and ``not_released``. The section shows a horizontal bar plot of each feature's share of the
total gain (pooled, and every site's), then the numbers. Other models have no such key: the
section then says so in one line.
"""

from __future__ import annotations

from html import escape
from typing import Any, Mapping

__all__ = ["importance_section", "importance_figure", "gain_shares"]

#: features shown in the plot (the table lists all of them)
TOP = 15


def _num(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:.4g}"


def gain_shares(gains: Mapping[str, float], features: list[str]) -> list[float]:
    """Each feature's share of the summed gain (0 for a feature without a value; all 0 when
    the sum is not positive). A per-site share can be negative: a split that fits the site's
    rows worse than not splitting."""
    total = sum(float(v) for v in gains.values())
    return [float(gains.get(f, 0.0)) / total if total > 0 else 0.0 for f in features]


def importance_figure(importance: Mapping[str, Any], top: int = TOP) -> Any:
    """Horizontal bars: the ``top`` features by pooled total gain (largest on top), one bar per
    feature for the pooled share and one per site. Returns the open figure."""
    from .plots import plt

    pooled = importance.get("pooled") or {}
    features = sorted(pooled, key=lambda f: -float(pooled[f]))[:top][::-1]
    series = {"pooled": pooled, **{f"site {s}": g for s, g in (importance.get("per_site") or {}).items()}}
    fig, ax = plt.subplots(figsize=(7.0, max(2.5, 0.3 * len(features) * (1 + 0.35 * len(series)) + 1.0)))
    height = 0.8 / max(len(series), 1)
    for i, (name, gains) in enumerate(series.items()):
        ys = [j - 0.4 + height * (len(series) - 1 - i) + height / 2 for j in range(len(features))]
        ax.barh(ys, [100 * v for v in gain_shares(gains, features)], height=height, label=name, color=f"C{i}")
    ax.set_yticks(range(len(features)), features)
    ax.set_xlabel("share of the total split gain (%)")
    ax.axvline(0, color="#555", lw=0.8)
    ax.legend(fontsize=8, loc="best")
    return fig


def importance_section(result: Mapping[str, Any]) -> str:
    """The section's HTML (figure as an inline PNG, a table, notes on what was not released)."""
    tr = result.get("training")
    imp = tr.get("importance") if isinstance(tr, Mapping) else None
    if not isinstance(imp, Mapping) or not imp.get("pooled"):
        return '<p class="absent">No gain importance: the model is not a boosted-tree model (or it made no split).</p>'
    from .markup import figure

    pooled, mean = imp["pooled"], imp.get("pooled_mean") or {}
    per_site = imp.get("per_site") or {}
    features = sorted(pooled, key=lambda f: -float(pooled[f]))
    shares = dict(zip(features, gain_shares(pooled, features)))
    out = ["<p>Gain of a split: how much it lowers the training loss (XGBoost's loss change). Pooled: the "
           "trees' own gains (the numbers XGBoost's <code>get_score</code> gives the exported model). Per site: "
           "the gain each split achieves on that site's training rows alone.</p>"]
    out.append(figure("importance", importance_figure(imp), "feature importance by gain"))  # + a PNG file
    sites = list(per_site)
    head = "".join(f"<th>{escape(h)}</th>" for h in ["Feature", "Total gain", "Mean gain per split", "Share",
                                                     *(f"Site {s}" for s in sites)])
    rows = []
    for f in features:
        cells = [escape(str(f)), _num(pooled[f]), _num(mean.get(f)), f"{100 * shares[f]:.1f} %",
                 *(_num((per_site[s] or {}).get(f)) for s in sites)]
        rows.append("<tr>" + "".join(f'<td class="num">{c}</td>' if j else f"<td>{c}</td>"
                                     for j, c in enumerate(cells)) + "</tr>")
    out.append(f'<div style="overflow-x:auto"><table><thead><tr>{head}</tr></thead>'
               f'<tbody>{"".join(rows)}</tbody></table></div>')
    notes = []
    suppressed = {s: n for s, n in (imp.get("suppressed") or {}).items() if n}
    if suppressed:
        notes.append("Splits left out of a site's gains because a node or child held fewer than the site's "
                     "<code>min_rows</code> of its rows: "
                     + ", ".join(f"{escape(str(s))}: {int(n)}" for s, n in suppressed.items()) + ".")
    if imp.get("per_site_skipped"):
        notes.append(f"No per-site gains: {escape(str(imp['per_site_skipped']))}.")
    if imp.get("not_released"):
        notes.append("Sites that did not release their gains (refused or failed): "
                     + ", ".join(escape(str(s)) for s in imp["not_released"]) + ".")
    out.extend(f'<p class="note">{n}</p>' for n in notes)
    return "".join(out)
