"""The site's side of the schema: its declaration, the agreed schema it receives, its checks.

Every site declares (:func:`declare`) its feature column names -- names only, never values --
with each column's kind, its target column name, its class labels and its row count per part;
it remembers its declarations by hash (:func:`remember_declaration`), stores the schema the
server agreed after checking the hash (:func:`received_schema`) and refuses a request that names
another schema (:func:`check_request_hash`). The server side is :mod:`fedtab.federation.protocol.schema`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.schema import DECLARED, SCHEMA_HASH, columns_hash
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import label_key

if TYPE_CHECKING:
    from fedtab.federation.site.core import Site

__all__ = ["declare", "remember_declaration", "declared_columns", "received_schema", "check_request_hash",
           "MAX_REMEMBERED_DECLARATIONS"]


def declare(site: "Site") -> dict[str, Any]:
    """The site side: its declaration as JSON (names, kinds, target, class labels, rows per part).

    ``kinds`` is left out when every column is numeric (what :func:`parse_declaration`
    assumes without it): at 10,000 columns that is ~110 kB less per site."""
    columns = site.feature_names
    numeric = set(site.table.select_dtypes(include=["number", "bool"]).columns.astype(str))
    kinds = ["numeric" if c in numeric else "categorical" for c in columns]  # one pass, no per-column calls
    classes: list[str] = []
    if site.target is not None and getattr(site, "target_kind", "classes") != "regression":  # no values of a number
        classes = sorted({label_key(v) for v in site.table[site.target].dropna().unique()})
    rows = site.part_sizes()
    out = {"columns": columns, "target": site.target, "classes": classes, "rows": rows}
    if "categorical" in kinds:  # all numeric (the usual case): omitted, the parser's default
        out["kinds"] = kinds
    return out


#: most declarations a site remembers by hash (a job re-declares after each table step)
MAX_REMEMBERED_DECLARATIONS = 16


def remember_declaration(stored: Any, columns: list[str]) -> dict[str, list[str]]:
    """The site's record of its declarations (``state[DECLARED]``): ``{columns hash: columns}``
    with ``columns`` added last (the oldest dropped past :data:`MAX_REMEMBERED_DECLARATIONS`)."""
    record = {str(k): list(v) for k, v in stored.items() if isinstance(v, list)} if isinstance(stored, dict) else {}
    digest = columns_hash(columns)
    record.pop(digest, None)
    record[digest] = list(columns)
    while len(record) > MAX_REMEMBERED_DECLARATIONS:
        record.pop(next(iter(record)))
    return record


def declared_columns(site: "Site", digest: Any) -> list[str]:
    """The columns ``site`` declared whose hash is ``digest`` (a schema sent as ``"declared"``):
    looked up among the declarations it remembers, so a schema agreed before a later
    re-declaration (a table step) still resolves; the site's current columns otherwise (the
    hash check then refuses a schema it cannot reconstruct)."""
    stored = site.state.get(DECLARED)
    if isinstance(stored, dict) and isinstance(digest, str) and isinstance(stored.get(digest), list):
        return list(stored[digest])
    if isinstance(stored, list):  # a state written before declarations were kept by hash
        return list(stored)
    return list(map(str, site.feature_names))


def received_schema(site: "Site", meta: Any) -> dict[str, Any]:
    """The site side of :meth:`Schema.wire_meta`: the agreed schema as the site stores it
    (``{"columns", "holders", "target", "hash"}``), its own declared columns filled in where the
    server sent ``"declared"``.

    Raises:
        ValueError: a malformed schema, or one whose column names do not hash to the hash the
            server sent (the server's schema is not the one this site can reconstruct).
    """
    if not isinstance(meta, dict):
        raise ValueError("the agreed schema is not a JSON object")
    columns = meta.get("columns")
    if columns == "declared":  # the columns this site declared (stored by their hash then: no table read here)
        columns = declared_columns(site, meta.get("hash"))
    if not isinstance(columns, list) or set(map(type, columns)) - {str}:
        raise ValueError("the agreed schema's columns must be a list of names or 'declared'")
    if "holders_all" in meta:
        n = meta["holders_all"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("the agreed schema's holders_all must be a non-negative integer")
        holders = [n] * len(columns)
    else:
        holders = meta.get("holders")
        if not isinstance(holders, list) or len(holders) != len(columns):
            raise ValueError("the agreed schema's holder counts do not match its columns")
    digest = meta.get("hash")
    if digest is not None and digest != columns_hash(columns):
        raise ValueError(f"the hash {str(digest)[:40]} of the agreed schema does not match its columns "
                         "(the site refuses a schema it cannot reconstruct)")
    return {"columns": columns, "holders": holders, "target": meta.get("target"), "hash": columns_hash(columns)}


def check_request_hash(site: "Site", meta: Mapping[str, Any]) -> None:
    """A request that refers to the agreed schema by position (meta :data:`SCHEMA_HASH`) must name
    the schema this site stored; ``ValueError`` (the site's one-line error) otherwise."""
    if SCHEMA_HASH not in meta:
        return
    stored = site.state.get("schema")
    mine = stored.get("hash") if isinstance(stored, dict) else None
    if mine is None and isinstance(stored, dict) and isinstance(stored.get("columns"), list):
        mine = columns_hash(stored["columns"])
    if mine is None:
        raise ValueError("the request refers to an agreed schema this site has not received")
    if meta[SCHEMA_HASH] != mine:
        raise ValueError(f"the schema hash {str(meta[SCHEMA_HASH])[:40]} of the request does not match the schema "
                         f"this site agreed ({mine})")


@handler("schema")
def _schema(site: "Site", request: Message) -> Message:
    """The stand-alone ``"schema"`` step: the declaration is added by ``Site.handle``."""
    return Message("schema")
