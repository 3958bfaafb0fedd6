"""Step 1, the schema: which columns exist where, their kinds, ranges and the classes.

With the column profile (``[schema] profile``, not in a private run) every site sends, in one
``job_profile`` exchange, its feature column names and kinds, per numeric column whether all
observed values are integers and a coarse observed range, its row counts (rows without a
label were dropped when the site was built, and are counted) and its label keys; the server
fixes the global schema (ordered union), rejects a site whose columns share nothing with the
others and lists the text columns the categories step encodes. Without it the step costs no
exchange: the schema is what the sites declare in the next step's exchange
(:mod:`fedtab.federation.schema`), read back by :func:`from_declaration`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from . import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..outputs import Outputs
    from ..spec import JobSpec

__all__ = ["STEP", "encoded_columns", "from_declaration", "global_schema", "wants_profile"]


def wants_profile(spec: "JobSpec") -> bool:
    """Whether the job asks for the column profile: ``[schema] profile``, by default yes unless private."""
    return spec.schema.profile if spec.schema.profile is not None else not spec.privacy.private


def _label_order(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def global_schema(profiles: Mapping[str, dict[str, Any]], target: str | None) -> dict[str, Any]:
    """Global columns, kinds, pooled ranges and integer flags of the sites' profiles.

    Raises:
        FederationError: a site shares no column with the others, or a column is numeric
            at some sites and text at others.
    """
    from ...federation.profile_flow import pooled_ranges
    from ...federation.protocol import FederationError

    columns: dict[str, None] = {}
    kinds: dict[str, set[str]] = {}
    for p in profiles.values():
        for c, k in zip(p["columns"], p["kinds"]):
            columns.setdefault(c, None)
            kinds.setdefault(c, set()).add(k)
    if len(profiles) > 1:
        for s, p in profiles.items():
            others = {c for o, q in profiles.items() if o != s for c in q["columns"]}
            if not set(p["columns"]) & others:
                raise FederationError(f"site {s!r} shares no column with the other sites (its columns: "
                                      f"{p['columns'][:8]}); check its file and the target {target!r}")
    mixed = [c for c, k in kinds.items() if len(k) > 1]
    if mixed:
        raise FederationError(f"columns {mixed[:5]} are numeric at some sites and text at others")
    ranges = pooled_ranges(profiles)
    classes = sorted({c for p in profiles.values() for c in p["classes"]}, key=_label_order)
    return {
        "columns": list(columns),
        "target": target,
        "classes": classes,
        "categorical": [c for c in columns if kinds[c] == {"categorical"}],
        "categories": {},
        "integer_columns": [c for c in columns if c in ranges and ranges[c]["integer"]],
        "ranges": {c: [ranges[c]["low"], ranges[c]["high"]] for c in columns if c in ranges},
    }


def encoded_columns(schema: Mapping[str, Any]) -> tuple[list[str], dict[str, list[float]], list[str]]:
    """The feature columns after one-hot encoding, with ranges and integer flags (indicators are 0/1)."""
    from ...data.categories import onehot_name

    cols, ranges, integer = [], dict(schema["ranges"]), list(schema["integer_columns"])
    for c in schema["columns"]:
        if c in schema["categories"]:
            names = [onehot_name(c, v) for v in schema["categories"][c]]
            cols += names
            ranges.update({n: [0.0, 1.0] for n in names})
            integer += names
        else:
            cols.append(c)
    return cols, ranges, integer


def set_columns(out: "Outputs") -> None:
    """``out.features`` / ``ranges`` / ``integer`` from ``out.result["schema"]`` (after encoding)."""
    out.features, out.ranges, out.integer = encoded_columns(out.result["schema"])


def from_declaration(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    """Without a profile: the ``schema`` and ``sites`` sections from the schema the sites declared
    (names, classes, rows per part), once a step's exchange agreed it. No-op otherwise."""
    agreed = federation.schema
    if out.result["schema"] is not None or agreed is None:
        return
    out.result["schema"] = {"columns": list(agreed.columns), "target": spec.target, "classes": list(agreed.classes),
                            "categorical": [], "categories": {}, "integer_columns": [], "ranges": {}}
    out.result["sites"] = {
        s: {"n_rows": agreed.rows(s, "all"), "dropped_unlabelled": None, "n_train": agreed.rows(s, "train"),
            "n_test": agreed.rows(s, "test"), "columns": agreed.site_columns(s),
            "unavailable_columns": [c for c in agreed.columns if c not in set(agreed.site_columns(s))],
            "selector": None}
        for s in agreed.sites}


def _run(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    from ...federation.profile_flow import profile_sites

    profiles = profile_sites(federation)
    schema = global_schema(profiles, spec.target)
    out.result["schema"] = schema
    out.result["sites"] = {
        s: {"n_rows": p["rows"] + p["unlabelled"], "dropped_unlabelled": p["unlabelled"], "n_train": p["train"],
            "n_test": p["test"], "columns": p["columns"],
            "unavailable_columns": [c for c in schema["columns"] if c not in p["columns"]], "selector": p["selector"]}
        for s, p in profiles.items()}
    set_columns(out)


STEP = Step("schema", lambda spec, out: wants_profile(spec), _run)
