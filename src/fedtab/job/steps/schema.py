"""Step 1, the schema: which columns exist where, their kinds, ranges and the classes.

With the column profile (``[schema] profile``, not in a private run) every site sends, in one
``job_profile`` exchange, its feature column names and kinds, per numeric column whether all
observed values are integers and a coarse observed range, its row counts (rows without a
label were dropped when the site was built, and are counted) and its label keys; the server
fixes the global schema (ordered union), rejects a site whose columns share nothing with the
others and lists the text columns the categories step encodes. Without it the step costs no
exchange: the schema is what the sites declare in the next step's exchange
(:mod:`fedtab.federation.protocol.schema`), read back by :func:`from_declaration`.

With the profile the step also gives the columns their meaning (:func:`column_roles`):
``[columns] ignore`` and every column that looks like a row identifier (a site flags it
unique per row, or its name reads like an id) unless ``[columns] categorical``/``keep``
names it are left out at every site (``schema.ignored = {column: reason}``), ``[columns]
categorical`` columns become categories; a column the job names that no site holds is a
:class:`~fedtab.job.spec.JobError`. The sites' label vocabularies must agree
(:func:`label_conflict`), and a site whose rows hold one class is marked ``one_class``.
"""

from __future__ import annotations

import difflib
import logging
import re
from typing import TYPE_CHECKING, Any, Mapping

from ..spec import wants_profile
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..outputs import Outputs
    from ..spec import JobSpec

__all__ = ["ID_NAME", "STEP", "column_roles", "encoded_columns", "from_declaration", "global_schema", "label_conflict",
           "one_class_participation", "wants_profile"]

log = logging.getLogger("fedtab.job")

#: column names that read like a row identifier: id, ID, *_id, *-id, patientId, id_*, uuid, guid,
#: mrn, a CSV's written-out index ("Unnamed: 0")
ID_NAME = re.compile(r"^(?:id|uuid|guid|mrn|.+[_\- ](?:id|uuid)|id[_\- ].+|unnamed: ?\d+)$", re.IGNORECASE)
_CAMEL_ID = re.compile(r"^[a-z]+Id$")


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
    from fedtab.federation.steps.profile import pooled_levels, pooled_ranges
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
        c = mixed[0]
        by_kind = {k: [s for s, p in profiles.items() if c in p["columns"] and p["kinds"][p["columns"].index(c)] == k]
                   for k in ("numeric", "categorical")}
        raise FederationError(f"column {c!r} is numeric at site(s) {', '.join(by_kind['numeric'])} and text at "
                              f"site(s) {', '.join(by_kind['categorical'])}" + (f" (also {mixed[1:5]})" if mixed[1:]
                                                                                else "")
                              + "; fix the sites' files, or declare it in [columns] categorical")
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
        "levels": pooled_levels(profiles),
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
    (names, classes, rows per part), once a step's exchange agreed it. No-op otherwise.

    Raises:
        JobError: the sites' label vocabularies disagree (:func:`label_conflict`)."""
    agreed = federation.schema
    if out.result["schema"] is not None or agreed is None:
        return
    conflict = label_conflict({s: list(d.classes) for s, d in agreed.sites.items()}, spec.target)
    if conflict is not None:  # a private run: the first step's declarations show it
        from ..spec import JobError

        raise JobError(f"{spec.source}: {conflict}")
    out.result["schema"] = {"columns": list(agreed.columns), "target": spec.target, "classes": list(agreed.classes),
                            "categorical": [], "categories": {}, "integer_columns": [], "ranges": {}}
    out.result["sites"] = {
        s: {"n_rows": agreed.rows(s, "all"), "dropped_unlabelled": None, "n_train": agreed.rows(s, "train"),
            "n_test": agreed.rows(s, "test"), "columns": agreed.site_columns(s),
            "unavailable_columns": [c for c in agreed.columns if c not in set(agreed.site_columns(s))],
            "selector": None}
        for s in agreed.sites}


def _is_number(label: str) -> bool:
    try:
        float(label)
    except ValueError:
        return False
    return True


def label_conflict(classes: Mapping[str, list[str]], target: str | None) -> str | None:
    """Why the sites' label vocabularies (``{site: label keys}``) cannot be one, or ``None``:
    some sites code the label as numbers and others as text, or a site with two or more text
    labels shares none with the other sites (``No``/``Yes`` against ``no``/``yes``; numeric
    classes may be disjoint under label skew)."""
    held = {s: list(c) for s, c in classes.items() if c}
    numeric = {s: all(map(_is_number, c)) for s, c in held.items()}
    clash = len(set(numeric.values())) > 1
    if not clash and len(held) > 1:
        clash = any(len(c) > 1 and not numeric[s] and not set(c) & {x for o, d in held.items() if o != s for x in d}
                    for s, c in held.items())
    if not clash:
        return None
    listing = "; ".join(f"{s} {sorted(c)}" for s, c in held.items())
    text = next((c for c in held.values() if not all(map(_is_number, c))), None)
    example = ", ".join(f"{t} = ..." for t in sorted(text)[:3]) if text else "yes = 1, no = 0"
    return (f"the sites label {target!r} differently ({listing}): give the job [labels] map = {{ {example} }} "
            "to map them onto one vocabulary")


def column_roles(spec: "JobSpec", profiles: Mapping[str, dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """``(ignored, categorical)``: the columns left out (``{column: reason}``) and those declared
    categorical, from ``[columns]`` and the sites' profiles (``unique`` flags, names).

    Raises:
        JobError: ``[columns]`` names a column no site holds (with the closest names and the sites).
    """
    from ..spec import JobError

    held: dict[str, list[str]] = {}
    for s, p in profiles.items():
        for c in p["columns"]:
            held.setdefault(c, []).append(s)
    c = spec.columns
    for role, names in (("categorical", c.categorical), ("ignore", c.ignore), ("keep", c.keep)):
        for name in names:
            if name not in held:
                close = difflib.get_close_matches(name, list(held), n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise JobError(f"{spec.source}: [columns] {role} names {name!r}, a column none of the sites "
                               f"{', '.join(profiles)} holds{hint}")
    ignored = {name: "[columns] ignore" for name in c.ignore}
    declared = set(c.categorical) | set(c.keep)
    for col, sites in held.items():
        if col in ignored or col in declared:
            continue
        flagged = [s for s in sites if bool(profiles[s]["unique"][profiles[s]["columns"].index(col)])]
        if flagged:
            ignored[col] = f"unique per row at site(s) {', '.join(flagged)} (a row identifier)"
        elif ID_NAME.match(col) or _CAMEL_ID.match(col):
            ignored[col] = "named like a row identifier"
    return ignored, [name for name in c.categorical if name not in ignored]


def _with_roles(p: dict[str, Any], ignored: Mapping[str, str], categorical: list[str]) -> dict[str, Any]:
    """A site's profile after the roles: ignored columns gone, declared ones categorical."""
    keep = [i for i, c in enumerate(p["columns"]) if c not in ignored]
    out = {**p, "columns": [p["columns"][i] for i in keep],
           "kinds": ["categorical" if p["columns"][i] in categorical else p["kinds"][i] for i in keep]}
    for k in ("low", "high", "integer", "observed", "unique"):
        out[k] = p[k][keep]
    out["levels"] = {c: v for c, v in p["levels"].items() if c not in ignored and c not in categorical}
    return out


def one_class_participation(result: dict[str, Any]) -> None:
    """``sites[s]["participation"]`` of every ``one_class`` site once the run ended: its election
    vote (``"voted"``, ``"abstained: <why>"`` or ``None`` without an election), and whether it took
    part in training and in the evaluation (its test rows score; AUROC is undefined there)."""
    sites = result.get("sites") or {}
    election = result.get("election") or None
    trained = next((st["sites"] for st in (result.get("participation") or {}).get("steps", [])
                    if st["step"] == "training"), None)
    for name, info in sites.items():
        if not info.get("one_class"):
            continue
        abstained = (election or {}).get("abstained") or {}
        vote = None if election is None else f"abstained: {abstained[name]}" if name in abstained else "voted"
        took = None if trained is None else name in trained
        info["participation"] = {"election": vote, "training": took, "evaluation": took}


def _run(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    from fedtab.federation.steps.profile import apply_column_roles, profile_sites
    from ..spec import JobError

    profiles = profile_sites(federation)
    conflict = label_conflict({s: p["classes"] for s, p in profiles.items()}, spec.target)
    if conflict is not None:
        raise JobError(f"{spec.source}: {conflict}")
    ignored, categorical = column_roles(spec, profiles)
    if ignored or categorical:
        apply_column_roles(federation, list(ignored), categorical)
        profiles = {s: _with_roles(p, ignored, categorical) for s, p in profiles.items()}
    for col, why in ignored.items():
        if why != "[columns] ignore":
            log.warning("column %r is left out: %s (name it in [columns] keep or categorical to use it)", col, why)
    schema = global_schema(profiles, spec.target)
    schema["ignored"] = dict(ignored)
    out.result["schema"] = schema
    out.result["sites"] = {
        s: {"n_rows": p["rows"] + p["unlabelled"], "dropped_unlabelled": p["unlabelled"], "n_train": p["train"],
            "n_test": p["test"], "columns": p["columns"],
            "unavailable_columns": [c for c in schema["columns"] if c not in p["columns"]], "selector": p["selector"],
            "one_class": len(p["classes"]) == 1 and len(schema["classes"]) > 1}
        for s, p in profiles.items()}
    for s, info in out.result["sites"].items():
        if info["n_test"] == 0 and spec.run.test_size > 0:  # named, with why: the report and the verdict say it
            info["no_test"] = (f"no test part: its {info['n_train']} rows are too few for a test share and a "
                               f"training share of at least min_rows rows each (of every class it holds), so it is "
                               f"trained on but not evaluated")
            log.warning("site %r: %s", s, info["no_test"])
        if info["one_class"]:
            log.warning("site %r holds one class only (%s)", s, profiles[s]["classes"][0])
    set_columns(out)


STEP = Step("schema", lambda spec, out: wants_profile(spec), _run)
