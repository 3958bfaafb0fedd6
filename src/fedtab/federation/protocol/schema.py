"""The agreed schema: the first thing a federation settles, and what every later reply is checked against.

Protocol. Every site declares (:func:`~fedtab.federation.site.schema.declare`) its feature column names -- names
only, never values -- with each column's kind (``"numeric"`` or ``"categorical"``),
its target column name (if any), its class labels (label keys, for a supervised
site) and its row count per part (``train``, ``test``, ``all``). The server fixes the
federation's schema (:class:`Schema`): the ordered union of the columns, the sites
holding each, the agreed class set and each site's declared rows. From then on the
schema rides once on each site's next request (stored by the site in
``site.state["schema"]``: ``{"columns", "holders"}``, holder *counts*, no site names).

The declaration needs no exchange of its own: whichever workflow talks to the sites
first (ballots, describe, category sets, imputation's counts, the tuning split) asks
for it in the same exchange (:func:`~fedtab.federation.protocol.exchange` adds the
request flag and agrees the schema from the replies before validating them). A
stand-alone ``"schema"`` exchange (:func:`~fedtab.federation.protocol.agreement.agree_schema` without replies) is there for
callers that want the schema before anything else.

API other modules call:

* :func:`~fedtab.federation.protocol.agreement.agree_schema` ``(federation, replies=None, **limits) -> Schema`` (also stored as
  ``federation.schema``);
* :meth:`Schema.check_features` ``(site, names, ...)`` -- names a reply refers to are a
  list of unique strings the site declared (or the federation holds);
* :meth:`Schema.rows` / :meth:`Schema.check_count` -- counts are non-negative integers
  no larger than the rows the site declared for that part;
* :meth:`Schema.check_classes` -- class labels within the site's declared set;
* :meth:`Schema.set_rows` (a new row part, e.g. the tuning split) and
  :meth:`Schema.encoded` (after federated one-hot encoding).

When a site's table changes shape outside the protocol (e.g. a job replaces it by an
imputed table with new columns), set ``federation.schema = None``: the next exchange
declares and agrees the schema again (or call :func:`~fedtab.federation.protocol.agreement.agree_schema` for a stand-alone
round).

Every check raises :class:`~fedtab.federation.protocol.SiteError` naming the site and
only that site. What a declaration may not exceed is bounded by :class:`SchemaLimits`
(a 2,000,000-column declaration is rejected before anything is computed on it).
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.errors import FederationError, SiteError, reject_text

if TYPE_CHECKING:
    from fedtab.federation.protocol.federation import Federation

__all__ = ["Schema", "SchemaLimits", "SiteDeclaration", "DECLARE", "DECLARED", "AGREED", "SCHEMA_HASH",
           "ColumnNameWarning", "similar_columns", "columns_hash", "parse_declaration", "declarations_from",
           "settle_target", "set_schema", "sort_labels", "as_count"]

#: request meta flag: "declare your schema in this reply"
DECLARE = "schema:declare"
#: reply meta key holding a site's declaration
DECLARED = "schema:declared"
#: request meta key carrying the agreed schema to a site
AGREED = "schema:agreed"
#: request/reply meta key: the hash (:func:`columns_hash`) of the column list a message refers to by index
#: (a request: the agreed schema's columns; a ballot reply: the columns the site declared)
SCHEMA_HASH = "schema:hash"


def columns_hash(names: Sequence[str]) -> str:
    """A 128-bit hex digest (SHA-256, truncated) of an ordered list of column names.

    Messages after the first of a run refer to columns by position in a list both sides hold;
    this hash rides with them so a reader can tell it holds the same list."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(list(names), ensure_ascii=False).encode()).hexdigest()[:32]

KINDS = ("numeric", "categorical")
BASE_PARTS = ("train", "test", "all")
#: most cross-validation folds a declaration may name
MAX_FOLDS = 100
_FOLD_PART = __import__("re").compile(r"^(fold|fit):\d{1,3}$")


@dataclass(frozen=True)
class SchemaLimits:
    """What one site's declaration may not exceed.

    Attributes:
        max_columns: feature columns per site. max_name: characters of a column name.
        max_rows: rows per part. max_classes: class labels per site.
    """

    max_columns: int = 100_000
    max_name: int = 512
    max_rows: int = 2**40
    max_classes: int = 10_000


@dataclass(frozen=True)
class SiteDeclaration:
    """One site's validated declaration (see module docstring)."""

    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    target: str | None
    classes: tuple[str, ...]
    rows: dict[str, int]

    def to_meta(self) -> dict[str, Any]:
        return {"columns": list(self.columns), "kinds": list(self.kinds), "target": self.target,
                "classes": list(self.classes), "rows": dict(self.rows)}



def as_count(value: Any, what: str, upper: int | None = None) -> int:
    """``value`` as a non-negative int no larger than ``upper``; ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    if isinstance(value, Integral):
        n = int(value)
    elif isinstance(value, Real) and np.isfinite(float(value)) and float(value).is_integer():
        n = int(value)
    else:
        raise ValueError(f"{what} must be a non-negative integer, got {str(value)[:40]!r}")
    if n < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {n}")
    if upper is not None and n > upper:
        raise ValueError(f"{what} is {n}, more than the {upper} rows declared")
    return n


def _names(value: Any, what: str, limits: SchemaLimits) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list of names")
    if len(value) > limits.max_columns:
        raise ValueError(f"{what} lists {len(value)} names (limit {limits.max_columns})")
    if value and (set(map(type, value)) != {str} or min(map(len, value)) == 0
                  or max(map(len, value)) > limits.max_name):
        raise ValueError(f"{what} must be non-empty strings of at most {limits.max_name} characters")
    if len(set(value)) != len(value):
        dup = [k for k, n in Counter(value).items() if n > 1][:5]
        raise ValueError(f"{what} has duplicate names {dup}")
    return list(value)


@dataclass
class _Declaring:
    """A declaration under check: the raw meta, the limits, and the parts parsed so far."""

    meta: dict[str, Any]
    limits: SchemaLimits
    columns: tuple[str, ...]
    kinds: Any = None
    target: Any = None
    rows: Any = None
    extra: list[str] = field(default_factory=list)
    classes: Any = None

    def folds(self) -> list[int]:
        return sorted({int(p.split(":")[1]) for p in self.extra})


def _read(d: _Declaring) -> None:
    d.kinds = d.meta.get("kinds")  # None: every column numeric (an all-numeric declaration lists no kinds)
    d.target = d.meta.get("target")
    d.rows = d.meta.get("rows")
    d.classes = d.meta.get("classes", [])


def _counts(d: _Declaring) -> None:
    d.extra = [p for p in d.rows if p not in BASE_PARTS]
    if len(d.extra) > 2 * MAX_FOLDS or not all(isinstance(p, str) and _FOLD_PART.match(p) for p in d.extra):
        raise ValueError(f"declared rows name parts other than {list(BASE_PARTS)} and at most {MAX_FOLDS} "
                         "'fold:k'/'fit:k' pairs")
    d.rows = {p: as_count(d.rows[p], f"declared {p} rows", d.limits.max_rows) for p in (*BASE_PARTS, *d.extra)}


def _folds_consistent(d: _Declaring) -> bool:
    folds, rows = d.folds(), d.rows
    return folds == list(range(len(folds))) and all(
        rows.get(f"fold:{k}", -1) + rows.get(f"fit:{k}", -1) == rows["train"] for k in folds) \
        and sum(rows[f"fold:{k}"] for k in folds) <= rows["train"]


def _class_names(d: _Declaring) -> None:
    d.classes = _names(d.classes, "declared classes", replace(d.limits, max_columns=d.limits.max_classes)) \
        if d.classes else []


def _rule(holds: Callable[[_Declaring], bool], message: str | Callable[[_Declaring], str]
          ) -> Callable[[_Declaring], None]:
    """A check of the table: ``holds`` or ``ValueError(message)``."""
    def check(d: _Declaring) -> None:
        if not holds(d):
            raise ValueError(message if isinstance(message, str) else message(d))

    return check


#: the checks of one declaration after its columns, in order (each relies on those before it):
#: rules (``holds`` or the one-line reason) and steps that parse a part for the next ones
DECLARATION_CHECKS: tuple[Callable[[_Declaring], None], ...] = (
    _read,
    _rule(lambda d: d.kinds is None or (isinstance(d.kinds, list) and len(d.kinds) == len(d.columns)
          and not set(map(type, d.kinds)) - {str} and not set(d.kinds) - set(KINDS)),
          f"declared kinds must be one of {KINDS} per column"),
    _rule(lambda d: d.target is None or (isinstance(d.target, str) and 0 < len(d.target) <= d.limits.max_name),
          "declared target must be a column name or null"),
    _rule(lambda d: d.target is None or d.target not in d.columns,
          lambda d: f"declared target {d.target!r} is also declared as a feature"),
    _rule(lambda d: isinstance(d.rows, dict) and not set(BASE_PARTS) - set(d.rows),
          f"declared rows must give {list(BASE_PARTS)}"),
    _counts,
    _rule(lambda d: d.rows["all"] != 0 and d.rows["train"] + d.rows["test"] == d.rows["all"],
          lambda d: f"declared rows are inconsistent (train {d.rows['train']} + test {d.rows['test']} != all "
                    f"{d.rows['all']}, or no rows)"),
    _rule(_folds_consistent, "declared folds are inconsistent (each fold:k with its fit:k must make the training "
                             "rows, the folds no more than them)"),
    _rule(lambda d: isinstance(d.classes, list) and len(d.classes) <= min(d.limits.max_classes, d.rows["all"]),
          "declared classes must be a list no longer than the rows declared"),
    _class_names,
    _rule(lambda d: not d.classes or d.target is not None, "classes declared without a target"),
)


#: keys in ``parse_declaration``'s ``validated`` that no declared list equals: a shared kinds tuple,
#: the last validated column tuple
_KINDS_KEY, _LAST_KEY = object(), object()


def parse_declaration(meta: Any, limits: SchemaLimits = SchemaLimits(),
                      validated: dict[tuple[str, ...], tuple[str, ...]] | None = None) -> SiteDeclaration:
    """Validate one site's declaration (``ValueError`` with the reason; the caller names the site):
    its columns, then :data:`DECLARATION_CHECKS` in order.

    ``validated``: column lists already validated against the same ``limits`` (filled
    here); a site declaring the same list as an earlier one reuses that check and that
    tuple (one shared object, so later comparisons against it are identity checks).
    """
    if not isinstance(meta, dict):
        raise ValueError("the schema declaration is missing or not a JSON object")
    raw = meta.get("columns")
    columns = _known_columns(raw, validated)
    if columns is None:
        columns = tuple(_names(raw, "declared columns", limits))
        if validated is not None:
            validated[columns] = validated[_LAST_KEY] = columns  # type: ignore[index]
    d = _Declaring(meta, limits, columns)
    for check in DECLARATION_CHECKS:
        check(d)
    kinds = ("numeric",) * len(columns) if d.kinds is None else tuple(d.kinds)
    if validated is not None:  # equal kind lists share one tuple too (one per schema, not one per site)
        kinds = validated.setdefault((_KINDS_KEY, kinds), kinds)  # type: ignore[arg-type]
    return SiteDeclaration(columns, kinds, d.target, tuple(d.classes), d.rows)


def _known_columns(raw: Any, validated: dict[Any, tuple[str, ...]] | None) -> tuple[str, ...] | None:
    """The validated tuple equal to the declared list ``raw`` (an earlier site's: the last one
    compared element by element, which needs no hashing of fresh strings, else looked up), or ``None``."""
    if validated is None or not isinstance(raw, list):
        return None
    last = validated.get(_LAST_KEY)
    if last is not None and len(raw) == len(last) and tuple(raw) == last:
        return last
    if set(map(type, raw)) != {str}:  # a hostile list of lists is unhashable: _names rejects it instead
        return None
    return validated.get(tuple(raw))


@dataclass
class Schema:
    """The federation's agreed schema (see module docstring).

    Attributes:
        columns: ordered union of the sites' feature columns (first appearance, sites in order).
        holders: column -> the sites declaring it, in site order (read-only: columns held by
            the same sites may share one list).
        sites: site -> its :class:`SiteDeclaration` (rows may gain parts, e.g. ``fit``).
        target: the target column name the sites agree on (``None`` if unsupervised).
        classes: sorted union of the declared class labels.
        limits: the bounds the declarations were checked against.
    """

    columns: list[str]
    holders: dict[str, list[str]]
    sites: dict[str, SiteDeclaration]
    target: str | None = None
    classes: list[str] = field(default_factory=list)
    limits: SchemaLimits = field(default_factory=SchemaLimits)

    @classmethod
    def from_declarations(cls, declarations: Mapping[str, SiteDeclaration],
                          limits: SchemaLimits = SchemaLimits()) -> "Schema":
        """Fix the schema from validated declarations (sites in the given order)."""
        if not declarations:
            raise FederationError("no site declared a schema")
        # sites declaring the same column list are grouped (one pass per distinct list, not per site)
        groups: dict[tuple[str, ...], list[str]] = {}
        for site, d in declarations.items():
            groups.setdefault(d.columns, []).append(site)
        holders: dict[str, list[str]] = {}
        if len(groups) == 1:
            (columns, sites), = groups.items()
            holders = dict.fromkeys(columns, list(sites))  # one read-only list shared by every column
        else:
            position = {site: i for i, site in enumerate(declarations)}
            for columns, sites in groups.items():
                for c in columns:
                    holders.setdefault(c, []).extend(sites)
            # first appearance with sites in order, holders in site order (as one pass per site gives)
            first = {}
            for columns, sites in groups.items():
                at = position[sites[0]]
                for c in columns:
                    if c not in first or at < first[c]:
                        first[c] = at
            order = sorted(holders, key=lambda c: first[c])  # stable: within a site, its column order
            holders = {c: sorted(holders[c], key=position.__getitem__) for c in order}
        targets = {d.target for d in declarations.values()}
        classes: set[str] = set()
        for d in declarations.values():
            classes.update(d.classes)
        return cls(list(holders), holders, dict(declarations), next(iter(targets)) if len(targets) == 1 else None,
                   sort_labels(classes), limits)

    # ----- what the sites declared ------------------------------------------------------
    def declaration(self, site: str) -> SiteDeclaration:
        d = self.sites.get(site)
        if d is None:
            raise SiteError(reject_text(site, "has not declared a schema"), {site: "no schema"})
        return d

    def site_columns(self, site: str) -> list[str]:
        """The feature columns ``site`` declared, in its order."""
        return list(self.declaration(site).columns)

    def column_set(self, site: str | None = None) -> frozenset[str]:
        """The columns ``site`` declared (``None``: the federation's), as a set built once per declaration."""
        # keyed by the column tuple's identity: sites that declared the same columns share one
        # tuple (:func:`parse_declaration`), so 300 sites × 10,000 columns hold one set, not 300
        cache = self.__dict__.setdefault("_column_sets", {})
        source = self.declaration(site).columns if site is not None else self.columns
        key = id(source)
        hit = cache.get(key)
        if hit is None or hit[0] is not source or (site is None and len(hit[1]) != len(source)):
            hit = cache[key] = (source, frozenset(source))
        return hit[1]

    def holder_count(self, names: Sequence[str] | None = None) -> np.ndarray:
        """``(d,)`` number of sites declaring each of ``names`` (default: every column)."""
        names = self.columns if names is None else names
        return np.array([len(self.holders.get(n, ())) for n in names], dtype=np.int64)

    def rows(self, site: str, part: str) -> int:
        """Rows ``site`` declared for ``part`` (``train``/``test``/``all``, ``fold:k``/``fit:k``
        and their aliases ``validation``/``fit``; a site without folds has ``fit`` = its
        training rows and an empty ``validation``)."""
        from fedtab.federation.site.parts import PartError, canonical_part

        rows = self.declaration(site).rows
        try:
            name = canonical_part(part)
        except PartError:
            name = str(part)
        if name not in rows and name in ("fit:0", "fold:0") and "fold:0" not in rows:
            return rows["train"] if name == "fit:0" else 0
        if name not in rows:
            raise SiteError(reject_text(site, f"declared no row count for part {part!r}"), {site: part})
        return rows[name]

    def folds(self, site: str) -> int:
        """How many cross-validation folds ``site`` drew (0: none)."""
        return sum(1 for p in self.declaration(site).rows if p.startswith("fold:"))

    # ----- checks on later replies ----------------------------------------------------------
    def check_count(self, site: str, value: Any, part: str, what: str = "count") -> int:
        """``value`` as an int in ``[0, rows(site, part)]``; :class:`SiteError` naming ``site`` otherwise."""
        try:
            return as_count(value, what, self.rows(site, part))
        except ValueError as exc:
            raise SiteError(reject_text(site, str(exc)), {site: str(exc)}) from None

    def check_features(self, site: str, names: Any, *, within: str = "site", exact: bool = False,
                       what: str = "feature names") -> list[str]:
        """``names`` as a list of unique declared column names.

        Args:
            within: ``"site"`` -- names ``site`` itself declared (a site can only speak for its
                own columns); ``"federation"`` -- any column of the schema.
            exact: the names must be exactly the site's declared columns (any order).

        Raises:
            SiteError: not a list of strings, duplicates, more names than allowed (oversized),
                an unknown or extra feature -- naming ``site``.
        """
        if within == "site" and isinstance(names, list) and len(names) == len(self.declaration(site).columns) \
                and tuple(names) == self.declaration(site).columns:
            return list(names)  # exactly its declaration, validated when it was declared: nothing left to check
        allowed = self.column_set(site if within == "site" else None)
        try:
            out = _names(names, what, replace(self.limits, max_columns=len(allowed)))
        except ValueError as exc:
            raise SiteError(reject_text(site, str(exc)), {site: str(exc)}) from None
        if not allowed.issuperset(out):
            unknown = [n for n in out if n not in allowed]
            where = "it did not declare" if within == "site" else "not in the federation's schema"
            text = f"{what}: features {unknown[:5]} {where}"
            raise SiteError(reject_text(site, text), {site: text})
        if exact and len(out) != len(allowed):
            text = f"{what}: {len(out)} names, but the site declared {len(allowed)} columns"
            raise SiteError(reject_text(site, text), {site: text})
        return out

    def check_classes(self, site: str, labels: Any) -> list[str]:
        """``labels`` as a list of unique label keys ``site`` declared; :class:`SiteError` otherwise."""
        declared = set(self.declaration(site).classes)
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise SiteError(reject_text(site, "class labels must be a list of strings"), {site: "classes"})
        unknown = sorted(set(labels) - declared)
        if unknown or len(set(labels)) != len(labels):
            text = f"class labels {unknown[:5] or 'duplicated'} outside the ones it declared"
            raise SiteError(reject_text(site, text), {site: text})
        return list(labels)

    # ----- changes agreed later -----------------------------------------------------------
    def set_rows(self, site: str, part: str, n: int) -> None:
        """Record the rows of a new part (e.g. ``fit``/``validation``) ``site`` reported."""
        d = self.declaration(site)
        self.sites[site] = replace(d, rows={**d.rows, part: int(n)})

    def encoded(self, categories: Mapping[str, Sequence[str]]) -> "Schema":
        """The schema after federated one-hot encoding with ``categories`` (same holders)."""
        from fedtab.data.categories import onehot_name

        def expand(cols: Iterable[str], kinds: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
            out, out_kinds = [], []
            for c, k in zip(cols, kinds if kinds is not None else ["numeric"] * 10**9):
                if c in categories:
                    names = [onehot_name(c, v) for v in categories[c]]
                    out += names
                    out_kinds += ["numeric"] * len(names)
                else:
                    out.append(c)
                    out_kinds.append(k)
            return out, out_kinds

        sites = {}
        for s, d in self.sites.items():
            cols, kinds = expand(d.columns, d.kinds)
            sites[s] = replace(d, columns=tuple(cols), kinds=tuple(kinds))
        new = Schema.from_declarations(sites, self.limits)
        new.target, new.classes = self.target, list(self.classes)
        return new

    # ----- what a site receives -------------------------------------------------------
    @property
    def hash(self) -> str:
        """:func:`columns_hash` of :attr:`columns` (recomputed when the columns change)."""
        cached = self.__dict__.get("_cached_hash")
        if cached is None or cached[0] is not self.columns or cached[1] != len(self.columns):
            cached = self.__dict__["_cached_hash"] = (self.columns, len(self.columns), columns_hash(self.columns))
        return cached[2]

    def to_site_meta(self) -> dict[str, Any]:
        """What the sites store as ``site.state["schema"]``: columns, holder counts and the hash."""
        return {"columns": list(self.columns), "holders": self.holder_count().tolist(), "target": self.target,
                "hash": self.hash}

    def wire_meta(self, site: str | None = None) -> dict[str, Any]:
        """The agreed schema as sent to ``site`` (see :func:`received_schema`): the column names only
        when they differ from the ones ``site`` declared (``"columns": "declared"`` otherwise: the site
        holds them), holder counts as one number when every column has the same, and the hash."""
        holders = self.holder_count()
        out: dict[str, Any] = {"target": self.target, "hash": self.hash}
        d = self.sites.get(site) if site is not None else None
        same = d is not None and len(d.columns) == len(self.columns) and tuple(self.columns) == d.columns
        out["columns"] = "declared" if same else list(self.columns)
        if holders.size and (holders == holders[0]).all():
            out["holders_all"] = int(holders[0])
        else:
            out["holders"] = holders.tolist()
        return out

    def attach(self, request: Message, site: str | None = None) -> Message:
        """``request`` carrying the agreed schema as sent to ``site`` (:meth:`wire_meta`)."""
        return Message(request.kind, request.arrays, {**request.meta, AGREED: self._site_meta(site)})

    def _site_meta(self, site: str | None) -> dict[str, Any]:
        cache = self.__dict__.setdefault("_cached_site_meta", {})
        d = self.sites.get(site) if site is not None else None
        key = (id(d.columns) if d is not None else None, len(self.columns))
        hit = cache.get(key)
        if hit is None or hit[0] is not (d.columns if d is not None else None):
            hit = cache[key] = (d.columns if d is not None else None, self.wire_meta(site))
        return hit[1]







def sort_labels(labels: Iterable[str]) -> list[str]:
    """Class-label keys in the agreed order: numerically when every key is a number, else as text."""
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


def declarations_from(replies: Mapping[str, Message], limits: SchemaLimits = SchemaLimits()
                      ) -> tuple[dict[str, SiteDeclaration], dict[str, str]]:
    """``(good, bad)``: each reply's declaration (meta key :data:`DECLARED`) parsed, or the reason it is not.

    The sites must agree on the target column: the most common one wins and a site
    declaring another is rejected (a tie rejects every site that declares one).
    """
    good, bad = {}, {}
    validated: dict[tuple[str, ...], tuple[str, ...]] = {}  # identical column lists are checked once
    for site, reply in replies.items():
        try:
            good[site] = parse_declaration(reply.meta.get(DECLARED), limits, validated)
        except ValueError as exc:
            bad[site] = f"invalid schema declaration: {exc}"
    settle_target(good, bad)
    return good, bad


def settle_target(good: dict[str, SiteDeclaration], bad: dict[str, str]) -> None:
    """The sites must agree on the target column: the most common one wins and a site declaring
    another moves from ``good`` to ``bad`` with the reason (a tie moves every site that declares one)."""
    targets = Counter(d.target for d in good.values())
    if len(targets) > 1:
        (top, n), *rest = targets.most_common()
        tie = bool(rest) and rest[0][1] == n
        for site, d in list(good.items()):
            if tie or d.target != top:
                bad[site] = (f"declares target {d.target!r}; the sites disagree on the target" if tie
                             else f"declares target {d.target!r}, the others {top!r}")
                del good[site]



class ColumnNameWarning(UserWarning):
    """Two columns that no site holds together have names so close that they are likely one
    column named differently at different sites (``Age`` / ``age``, ``max_heart_rate`` / ``max_hr``)."""


def _normal(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _spellings(name: str) -> set[str]:
    """The name without case and separators, and with any run of two or more of its words
    replaced by their initials (``max_heart_rate`` -> ``maxheartrate``, ``maxhr``, ``mhr``...)."""
    words = re.findall(r"[a-z]+|[0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    out = {"".join(words)}
    for i in range(len(words)):
        for j in range(i + 2, len(words) + 1):
            run = words[i:j]
            if all(w.isalpha() for w in run):
                out.add("".join(words[:i]) + "".join(w[0] for w in run) + "".join(words[j:]))
    return out


def _close_names(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` read as one column's name: equal without case and separators, one
    an abbreviation of the other by initials, one a prefix (4+ characters) of the other, or
    :class:`difflib.SequenceMatcher` ratio ≥ 0.85 -- but never names that differ only in their
    numbers (``x1`` / ``x2``: distinct columns of a series)."""
    na, nb = _normal(a), _normal(b)
    if na == nb:
        return True
    if not na or not nb or re.sub(r"[0-9]+", "#", na) == re.sub(r"[0-9]+", "#", nb):
        return False
    if _spellings(a) & _spellings(b):
        return True
    short, long_ = sorted((na, nb), key=len)
    if len(short) >= 4 and long_.startswith(short):
        return True
    return difflib.SequenceMatcher(None, na, nb).ratio() >= 0.85


def similar_columns(holders: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Pairs ``(rarer, commoner)`` of columns that no site holds together and whose names are
    close (:func:`_close_names`): likely one column under two names, which the schema otherwise
    keeps as two (each missing at the other's sites). ``rarer`` is held by fewer sites (ties:
    the later column), ``holders``: column -> the sites holding it."""
    names = list(holders)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if set(holders[a]) & set(holders[b]) or not _close_names(a, b):
                continue
            out.append((b, a) if len(holders[b]) <= len(holders[a]) else (a, b))
    return out


def _warn_similar(schema: "Schema") -> None:
    """A :class:`ColumnNameWarning` per pair of :func:`similar_columns` (bounded: few columns
    differ between sites; a table of thousands is compared pairwise only among columns that
    not every site holds)."""
    partial = {c: h for c, h in schema.holders.items() if len(h) < len(schema.sites)}
    if len(partial) > 2000:
        return
    for rare, common in similar_columns(partial):
        warnings.warn(f"column {rare!r} (at {', '.join(partial[rare])}) and column {common!r} (at "
                      f"{', '.join(partial[common])}) are never held together and look like one column under two "
                      f"names (did you mean {common!r}?): as given they are two columns, each missing at the other's "
                      f"sites; rename it in that site's file to merge them", ColumnNameWarning,
                      stacklevel=3)


def set_schema(federation: Federation, schema: Schema) -> None:
    """Make ``schema`` the federation's; every active site receives it with its next request.
    A schema agreed from the sites' declarations (none before it) warns of columns that look
    like one column under two names (:class:`ColumnNameWarning`, :func:`similar_columns`)."""
    if federation.schema is None:
        _warn_similar(schema)
    federation.schema = schema
    federation._schema_pending = set(federation.active)
