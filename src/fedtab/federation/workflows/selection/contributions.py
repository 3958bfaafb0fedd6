"""Per-site contribution (issue 22, item 5): what each site adds to the federation.

For each site ``j``, from a :class:`~fedtab.federation.workflows.selection.server.SelectionOutcome`
made with ``contributions=True`` (the leave-one-site-out chains trained in the same
exchanges as everything else):

* ``auroc_without`` / ``logloss_without`` — the chosen columns' pooled cross-validated AUROC
  / log-loss of the federated model (no personalisation) trained **without** site ``j``,
  scored on the same held-out fold rows of every site (``j``'s included) as the full model;
* ``auroc_delta = auroc(all sites) − auroc_without`` and
  ``logloss_delta = logloss_without − logloss(all sites)``: both positive when the site helps;
* ``columns_only_here`` — columns only site ``j`` measures (they exist in the federation
  because of it);
* ``ballot_decided`` — the columns whose fate (kept or dropped) site ``j``'s training-rows
  ballot changed: the chosen election rerun without that ballot, compared name by name
  (empty when "all columns" was chosen: no election decided anything).

Server-side arithmetic on what the outcome holds: no exchange.
"""

from __future__ import annotations

from typing import Any

__all__ = ["site_contributions"]


def site_contributions(outcome: Any) -> dict[str, dict[str, Any]]:
    """``{site: {"auroc_without", "auroc_delta", "logloss_without", "logloss_delta",
    "columns_only_here", "ballot_decided"}}`` (see the module docstring).

    Raises:
        ValueError: the outcome was made without ``contributions`` (no leave-one-site-out chains).
    """
    if not outcome.loso:
        raise ValueError("no leave-one-site-out scores: run select_model(..., contributions=True) with 2+ sites")
    from fedtab.federation.workflows.election.server import elect_from_ballots

    full_auc, full_ll = outcome.chosen.get("auroc"), outcome.chosen["logloss"]
    measured = {s: {c for c, share in m["missing_share"].items() if share < 1.0} for s, m in outcome.measured.items()}
    el = outcome.election
    fd = outcome.freedom_degree
    selected = set(outcome.features)
    voters = {s: b for s, b in outcome.ballots.items() if b is not None}
    out: dict[str, dict[str, Any]] = {}
    for site, scores in outcome.loso.items():
        others = set().union(*(m for s, m in measured.items() if s != site)) if len(measured) > 1 else set()
        decided: list[str] = []
        if fd is not None and site in voters and len(voters) > 1:
            rest = [b for s, b in voters.items() if s != site]
            again = set(elect_from_ballots(rest, fd, el["aggregation"], el["normalization"],
                                           min_holders=el.get("min_holders")).selected_names)
            decided = [c for c in el["columns"] if (c in selected) != (c in again)]
        auc = scores.get("auroc")
        out[site] = {
            "auroc_without": auc,
            "auroc_delta": None if auc is None or full_auc is None else float(full_auc - auc),
            "logloss_without": scores["logloss"],
            "logloss_delta": float(scores["logloss"] - full_ll),
            "columns_only_here": sorted(measured.get(site, set()) - others,
                                        key=el["columns"].index if el.get("columns") else None),
            "ballot_decided": decided,
        }
    return out
