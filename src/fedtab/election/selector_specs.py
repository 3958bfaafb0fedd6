"""The built-in selectors by name, with their parameters and defaults, without importing scikit-learn.

A job names a site's selector as ``"lasso"`` or ``{"name": "lasso", "params": {...}}``. The
server checks that spec when it parses the job's plan and sends it to the sites in the
ballot request's ``selector`` meta; neither needs the selector itself. Building one
(:func:`fedtab.election.selectors.make_selector`) imports scikit-learn, scipy and pandas:
about a second of CPU in a fresh process, which a Flower ServerApp would otherwise pay
while its sites start, on the same cores. This module answers both from a table
(:data:`SELECTOR_DEFAULTS`) that ``tests/election/test_selector_specs.py`` holds equal to
the selector classes' constructor signatures. The constructors only store their
arguments, so a spec this module accepts is one :func:`make_selector` builds.

Specs that are objects (a :class:`~fedtab.election.selectors.Selector`, a scikit-learn
selector, a callable) or mappings without a string ``name`` go to
:mod:`fedtab.election.selectors` as before.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SELECTOR_DEFAULTS", "check_selector", "selector_wire_spec"]

#: every built-in selector's name and its constructor's parameters with their defaults
SELECTOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "lasso": {"C": 0.1, "alpha": 0.01, "task": "auto", "tol": 1e-10, "seed": 0},
    "elastic_net": {"C": 0.1, "alpha": 0.01, "l1_ratio": 0.5, "task": "auto", "tol": 1e-10, "seed": 0},
    "random_forest": {"k": None, "n_estimators": 100, "task": "auto", "seed": 0},
    "mutual_info": {"k": None, "task": "auto", "seed": 0},
    "anova": {"k": None, "task": "auto", "seed": 0},
    "chi2": {"k": None, "task": "auto", "seed": 0},
    "lasso_cv": {"Cs": 10, "cv": 3, "task": "auto", "tol": 1e-10, "seed": 0},
    "markov_blanket": {"model": "forest", "alpha": 0.05, "n_splits": 5, "n_repeats": 1, "max_rows": 5000,
                       "n_trees": 30, "task": "auto", "seed": 0, "max_shrink_rounds": 1},
    "sequential_attention": {"k": None, "n_phases": None, "steps_per_phase": 150, "hidden": (64,),
                             "batch_size": 256, "lr": 0.003, "logits_lr": 0.05, "task": "auto", "seed": 0},
}


def _named(spec: Any) -> tuple[str, Any] | None:
    """``(name as given, params)`` of a spec this module reads; ``None`` for any other spec."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return spec["name"], spec.get("params", {}) or {}
    return None


def _resolve(given: str, params: Any) -> tuple[str, dict[str, Any]]:
    """The canonical name and the given parameters of a named spec.

    Raises:
        ValueError: as :func:`~fedtab.election.selectors.make_selector`: ``unknown selector ...;
            known: [...]`` or ``bad parameters for selector ...: ...``.
    """
    name = given.replace("-", "_").lower()
    if name not in SELECTOR_DEFAULTS:
        raise ValueError(f"unknown selector {given!r}; known: {sorted(SELECTOR_DEFAULTS)}")
    if not isinstance(params, Mapping):
        raise ValueError(f"bad parameters for selector {given!r}: params must be a table of name = value, "
                         f"got {type(params).__name__}")
    known = SELECTOR_DEFAULTS[name]
    unknown = [str(k) for k in params if k not in known]
    if unknown:
        raise ValueError(f"bad parameters for selector {given!r}: unexpected parameter(s) "
                         f"{', '.join(repr(k) for k in unknown)}; it takes {', '.join(known)}")
    return name, dict(params)


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
    _resolve(*named)


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
    name, params = _resolve(*named)
    merged = {**SELECTOR_DEFAULTS[name], **params}
    return {"name": name, "params": {k: merged[k] for k in sorted(merged)}}
