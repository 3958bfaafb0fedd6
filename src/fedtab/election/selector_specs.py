"""A selector spec checked and sent as the sites will build it, without importing scikit-learn.

A job names a site's selector as ``"lasso"`` or ``{"name": "lasso", "params": {...}}``. The
server checks that spec when it parses the job's plan and sends it to the sites in the
ballot request's ``selector`` meta; neither needs the selector itself. Building one
(:func:`fedtab.election.selectors.make_selector`) imports scikit-learn, scipy and pandas:
about a second of CPU in a fresh process, which a Flower ServerApp would otherwise pay
while its sites start, on the same cores. This module answers both from the table of
:mod:`fedtab.election.selector_table` (:data:`SELECTOR_DEFAULTS`), whose check ``make_selector``
makes too. The constructors only store their arguments, so a spec this module accepts is one
:func:`make_selector` builds.

Specs that are objects (a :class:`~fedtab.election.selectors.Selector`, a scikit-learn
selector, a callable) or mappings without a string ``name`` go to
:mod:`fedtab.election.selectors` as before.
"""

from __future__ import annotations

from typing import Any, Mapping

from .selector_table import SELECTOR_DEFAULTS, resolve_selector

__all__ = ["SELECTOR_DEFAULTS", "check_selector", "selector_wire_spec"]


def _named(spec: Any) -> tuple[str, Any] | None:
    """``(name as given, params)`` of a spec this module reads; ``None`` for any other spec."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return spec["name"], spec.get("params", {}) or {}
    return None


def check_selector(spec: Any) -> None:
    """Refuse a selector spec :func:`~fedtab.election.selectors.make_selector` would refuse.

    Names and ``{"name", "params"}`` mappings are checked against :data:`SELECTOR_DEFAULTS`
    (nothing imported); any other spec is built by ``make_selector``.

    Raises:
        ValueError: an unknown name, parameters that are not a mapping or that the selector
            does not take, or (objects) whatever ``make_selector`` raises.
    """
    named = _named(spec)
    if named is None:
        from .selectors import make_selector

        make_selector(spec)
        return
    resolve_selector(*named)


def selector_wire_spec(spec: Any) -> dict[str, Any]:
    """``{"name", "params"}`` of a built-in selector, every parameter given (its default where the
    spec gives none, in name order): what :func:`~fedtab.election.selectors.selector_spec` returns,
    without building the selector for a named spec.

    Raises:
        ValueError: as :func:`check_selector`, or a selector object that is not a registered
            built-in (``selector_spec``).
    """
    named = _named(spec)
    if named is None:
        from .selectors import selector_spec

        return selector_spec(spec)
    name, params = resolve_selector(*named)
    merged = {**SELECTOR_DEFAULTS[name], **params}
    return {"name": name, "params": {k: merged[k] for k in sorted(merged)}}
