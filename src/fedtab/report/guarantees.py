"""What a curious server can learn at most, per message kind and mode, generated from the
declarations (:mod:`fedtab.federation.protocol.kinds`) — docs/privacy.md holds the text between
:data:`BEGIN` and :data:`END`, and ``tests/docs/test_privacy_guarantees.py`` fails while the
doc and the declarations disagree.

Per kind: the rows behind its numbers and who fixes them (the site's laminar parts, or row
sets the server chooses inside a part: ``server_row_set``), and per mode (plain, secure
aggregation, DP) what leaves the site and what differencing two answers can and cannot
isolate: refused without ``allow_server_row_sets``, counted against a per-run cap, summed over
≥ ``min_peers`` sites, noised from the site's budget.

Run ``python -m fedtab.report.guarantees --write-docs`` (from the repository root) to rewrite
docs/privacy.md's generated part, ``--check`` to exit 1 when it is stale, no option to print it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BEGIN", "END", "MODES", "PLAIN_BOUNDS", "guarantees", "guarantee_of", "guarantee_table",
           "with_guarantees", "main"]

#: the settings a ``plain_bound`` may name (:attr:`fedtab.federation.protocol.kinds.MessageKind.plain_bound`)
PLAIN_BOUNDS = ("allow_server_row_sets", "max_evaluations", "max_rounds")
#: the markers around the generated part of docs/privacy.md
BEGIN = "<!-- BEGIN generated: python -m fedtab.report.guarantees --write-docs (do not edit by hand) -->"
END = "<!-- END generated -->"
#: the modes, in the table's order
MODES = ("plain", "secure", "dp")


def _own_kinds() -> list[Any]:
    """fedtab's own declarations (a test's toy kinds left out), in declaration order."""
    from fedtab.federation.protocol.kinds import KINDS

    return [k for k in KINDS.values() if k.home.startswith("fedtab.")]


def _code(names: Any) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _rows(kind: Any) -> str:
    r = kind.releases
    if r.part is None:
        return "none (names, keys or an acknowledgement)"
    if kind.rows is not None:
        over = kind.rows
    elif callable(r.part):
        raise ValueError(f"message kind {kind.name!r}: its part is computed in {kind.home}; declare its `rows` words")
    elif r.part.startswith("="):
        over = f"the site's `{r.part[1:]}` part"
    elif r.default_part is None:
        over = f"the site's part named by the request's `{r.part}`, if any"
    else:
        over = f"a site's part the request names (default `{r.default_part}`)"
    if kind.server_row_set:
        return over + "; inside it **the server chooses** the row sets (its splits, chains or models)"
    return over + "; **the site fixes** them"


def _plain(kind: Any, policy: Any) -> str:
    r = kind.releases
    text = kind.description.format(floor="`min_rows`", floor_th="`min_rows`-th", ranges="", categories="")
    if r.part is None:
        return f"{text}; nothing over rows"
    rules = []
    if r.per_class:
        rules.append("`min_rows` of every class present")
    if r.cells:
        rules.append(f"small cells of {_code(r.cells)} sent as 0")
    if r.histograms:
        rules.append("histograms smoothed")
    if not kind.server_row_set:
        rules.append("no difference isolates fewer than `min_rows` rows" + (" of a class" if r.per_class else ""))
    elif kind.plain_bound == "allow_server_row_sets":
        rules.append("answered: the site opted in (`allow_server_row_sets = true`, off by default); two answers "
                     "can differ by one row" if policy.allow_server_row_sets else
                     "**refused** unless the site opts in (`allow_server_row_sets`, default off); opted in, two "
                     "answers can differ by one row")
    elif kind.plain_bound == "max_evaluations":
        rules.append(f"answered: differencing evaluations of crafted models can localise rows, each request one "
                     f"evaluation, ≤ `max_evaluations` ({policy.max_evaluations}) per part per run")
    elif kind.plain_bound == "max_rounds":
        rules.append(f"answered: differencing updates of crafted chains can localise rows, each request one round, "
                     f"≤ `max_rounds` ({policy.max_rounds}) per run")
    else:
        raise ValueError(f"message kind {kind.name!r}: a server_row_set kind needs a plain_bound in {PLAIN_BOUNDS}, "
                         f"got {kind.plain_bound!r}")
    return f"{text} — {'; '.join(rules)}"


def _only_some(kind: Any) -> str:
    return "" if kind.summed_when is None else " (the requests its `summed_when` marks)"


def _secure(kind: Any) -> str:
    if not kind.summed:
        return "as plain (a per-site release, not a sum)"
    if not kind.secure:
        return f"not masked (plain rules); `require_secure_aggregation` refuses it{_only_some(kind)}"
    text = f"only the sum over ≥ `min_peers` verified sites{_only_some(kind)}"
    if kind.per_site:
        text += f"; {_code(kind.per_site)} per site"
    if kind.server_row_set:
        text += "; a difference of two sums can isolate rows of the pool, not which site holds them"
    return text


def _dp(kind: Any) -> str:
    r = kind.releases
    if not r.dp:
        if kind.summed:
            return f"no DP release: `require_dp` refuses it{_only_some(kind)}"
        return "not noised (no rows)" if r.part is None else "not noised (plain rules)"
    noised = "all arrays" if r.dp is True else _code(r.dp)
    count = (f"{r.dp_releases} Gaussian release{'s' * (r.dp_releases != 1)}" if isinstance(r.dp_releases, int)
             else "the request's Gaussian releases")
    text = f"{noised} noised at the site ({count} a reply, from its ε budget)"
    if kind.description_dp is not None:
        text = f"{kind.description_dp}; {text}"
    if kind.server_row_set and kind.plain_bound == "allow_server_row_sets":
        text += "; no opt-in needed"
    return text


def guarantee_of(kind: Any, policy: Any = None) -> dict[str, str]:
    """``{kind, rows, plain, secure, dp}`` for one declaration (:class:`~fedtab.federation.protocol.kinds.MessageKind`):
    the rows behind its numbers and, per mode, what the server sees and what differencing can isolate.

    Raises:
        ValueError: the declaration lacks what the text needs (``rows`` words for a part the
            handler's module computes, a ``plain_bound`` for a ``server_row_set`` kind).
    """
    from ..privacy.policy import DisclosurePolicy

    policy = policy or DisclosurePolicy()
    return {"kind": kind.name, "rows": _rows(kind), "plain": _plain(kind, policy), "secure": _secure(kind),
            "dp": _dp(kind)}


def guarantees(policy: Any = None) -> list[dict[str, str]]:
    """:func:`guarantee_of` for every fedtab message kind, in declaration order (a test's toy kinds left out)."""
    return [guarantee_of(k, policy) for k in _own_kinds()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def guarantee_table(policy: Any = None) -> str:
    """The generated part of docs/privacy.md (Markdown, markers included), from :func:`guarantees`."""
    from ..privacy.policy import DisclosurePolicy

    p = policy or DisclosurePolicy()
    lines = [
        BEGIN, "",
        "Generated from the declarations in `fedtab.federation.protocol.kinds` (regenerate with "
        "`python -m fedtab.report.guarantees --write-docs`; `tests/docs/test_privacy_guarantees.py` fails while "
        "this table and the declarations disagree). Default policy: "
        f"`min_rows={p.min_rows}`, `min_peers={p.min_peers}`, `max_evaluations={p.max_evaluations}`, "
        f"`max_rounds={p.max_rounds}`, `allow_server_row_sets={p.allow_server_row_sets}`, "
        f"`max_epsilon_per_release={p.max_epsilon_per_release:g}`, `epsilon_budget={p.epsilon_budget:g}` per "
        f"`period_days={p.period_days}`.", "",
        "How to read it. *The site fixes* the rows: the release is over one of its laminar parts, drawn once "
        "from its own seed (folds tile `train`; `test` and validation are disjoint atoms), every number over ≥ "
        "`min_rows` rows, and any two parts differ by 0 or ≥ `min_rows` rows, so differencing two replies "
        "isolates no fewer. *The server chooses* the rows: inside the part, its splits, chains or models pick "
        "the rows behind a number, so two answers can differ by one row; the plain column says what bounds "
        "that. *Small cells … sent as 0*: a count below `min_rows` goes as 0 with every sum over it. "
        "*Histograms smoothed*: score histograms cut into runs of ≥ `min_rows` rows unless securely summed. "
        "Secure: the sum over ≥ `min_peers` verified sites, masked so that no site's reply is seen. DP: "
        "Gaussian noise drawn at the site, at least at its `max_epsilon_per_release` floor, charged to its "
        "`epsilon_budget` per `period_days` (ε composes over every release of the period); a difference of "
        "two answers is a difference of noised values.", "",
        "| message | rows behind its numbers | plain: the server sees per site | secure aggregation | DP |",
        "|---|---|---|---|---|"]
    for g in guarantees(p):
        lines.append(f"| `{g['kind']}` | " + " | ".join(_cell(g[c]) for c in ("rows", "plain", "secure", "dp")) + " |")
    return "\n".join([*lines, "", END])


def with_guarantees(doc: str, policy: Any = None) -> str:
    """``doc`` (docs/privacy.md's text) with the part between the markers regenerated.

    Raises:
        ValueError: the markers are missing, repeated or out of order.
    """
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError("the page must hold the generated markers once each, BEGIN before END")
    head, rest = doc.split(BEGIN)
    return head + guarantee_table(policy) + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    """``python -m fedtab.report.guarantees [--write-docs | --check] [--doc PATH]``."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m fedtab.report.guarantees",
                                 description="docs/privacy.md's generated guarantees, from the kinds' declarations")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the generated part of the page")
    ap.add_argument("--check", action="store_true", help="exit 1 if the page's generated part is stale")
    ap.add_argument("--doc", type=Path, default=Path("docs/privacy.md"), help="the page (default docs/privacy.md)")
    args = ap.parse_args(argv)
    if not (args.write_docs or args.check):
        print(guarantee_table())
        return 0
    doc = args.doc.read_text()
    new = with_guarantees(doc)
    if args.check:
        if new != doc:
            print(f"{args.doc}: the generated guarantees are stale; run python -m fedtab.report.guarantees "
                  "--write-docs")
            return 1
        return 0
    args.doc.write_text(new)
    print(f"wrote the generated guarantees into {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
