"""Agreeing the schema: the stand-alone ``"schema"`` exchange, or the declarations that rode on a
run's first exchange (:func:`agree_schema`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from fedtab.federation.protocol.exchange import exchange
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.schema import Schema, SchemaLimits, declarations_from, set_schema

if TYPE_CHECKING:
    from fedtab.federation.protocol.federation import Federation

__all__ = ["agree_schema"]


def agree_schema(federation: Federation, replies: Mapping[str, Message] | None = None, *,
                 limits: SchemaLimits | None = None) -> Schema:
    """Fix the federation's schema and store it as ``federation.schema``.

    Args:
        replies: replies already carrying declarations (any reply to a request with the
            :data:`DECLARE` flag); ``None`` runs a stand-alone ``"schema"`` exchange (one
            request/reply round with every active site), replacing any earlier schema.
        limits: bounds on each declaration (default :class:`SchemaLimits`, or the
            federation's ``schema_limits`` attribute when set).

    Returns:
        The :class:`Schema`; every site receives it with its next request.

    Raises:
        SiteError / QuorumError: a site's declaration is invalid (naming it) and the
            federation's policy does not let the run go on without it.
    """
    if replies is None:
        federation.schema = None
        exchange(federation, Message("schema"))
        assert federation.schema is not None
        return federation.schema
    limits = limits or getattr(federation, "schema_limits", None) or SchemaLimits()
    good, bad = declarations_from(replies, limits)
    for site, reason in bad.items():
        federation.drop(site, reason)
    schema = Schema.from_declarations(good, limits)
    set_schema(federation, schema)
    return schema
