"""The disclosure statement: what left the sites in *this* run, from the run's own records.

Built from ``result["participation"]["exchanges"]`` (one ``{"step": message kind, "sites"}``
per exchange the server made, :func:`fedtab.job.guarantees.participation_record`), the
declarations of the message kinds (:mod:`fedtab.federation.protocol.kinds`: what each reply holds,
whether the sites noise it under DP, whether a secure run masks it, the header's phrases), the
agreed schema (how many columns had a coarse range or a category list released) and ``result["privacy"]`` (secure aggregation,
differential privacy). Nothing is claimed that the records do not show: a run without a
participation record says so instead of guessing.
"""

from __future__ import annotations

from typing import Any, Mapping

from .data import mapping
from .markup import absent, esc, num, table

__all__ = ["disclosure", "disclosure_summary", "released_kinds", "WHAT"]

def _declarations() -> Mapping[str, Any]:
    from fedtab.federation.protocol.kinds import KINDS

    return KINDS


class _What(Mapping[str, str]):
    """``{message kind: what one site's reply to it holds}``, read from the kinds' declarations
    (:attr:`fedtab.federation.protocol.kinds.MessageKind.description`; ``{ranges}``, ``{categories}`` and
    ``{floor}`` are filled from the run)."""

    def __getitem__(self, kind: str) -> str:
        return _declarations()[kind].description

    def __iter__(self):  # noqa: ANN204 - a Mapping's iterator
        return iter(_declarations())

    def __len__(self) -> int:
        return len(_declarations())


#: message kind -> what one site's reply to it holds, in plain words (from the declarations)
WHAT: Mapping[str, str] = _What()


def _masked(kind: str) -> bool:
    """Whether a secure run sends ``kind`` masked (its declaration's ``masked_in_secure_runs``)."""
    decl = _declarations().get(kind)
    return bool(decl is not None and decl.secure)


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
    decl = _declarations().get(kind)
    if decl is None:  # a message no site declares (a hostile step name): say so, as text
        return "(no release declaration found for this message)"
    text = decl.description
    privacy = mapping(result.get("privacy"))
    dp = bool(privacy.get("dp"))
    if dp and decl.description_dp is not None:
        text = decl.description_dp
    floor = _floor(result)
    text = text.format(floor=floor, floor_th=_ordinal(floor),
                       ranges=f" — released for {len(ranges)} column(s) in this run" if ranges else "",
                       categories=f" — released for {len(cats)} column(s) in this run" if cats else "")
    if dp and _noised(kind):
        text += "; noised by the site (differential privacy)"
    if privacy.get("secure_aggregation") and _masked(kind):
        text += "; masked: the server learned only the sum over the sites"
    return text


def _noised(kind: str) -> bool:
    """Whether the sites noise ``kind``'s reply under DP (its release declaration says so)."""
    decl = _declarations().get(kind)
    return bool(decl is not None and decl.releases.dp)


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
    decls = _declarations()
    asked = {phrase for k in names if k in decls for phrase in decls[k].summary}
    from fedtab.federation.protocol.kinds import SUMMARY_PHRASES

    histograms = "" if dp else " and score histograms"
    parts += [phrase.format(histograms=histograms) for phrase in SUMMARY_PHRASES if phrase in asked]
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
