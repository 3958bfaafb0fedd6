"""The built-in selectors' names, parameters and defaults, and the check of a named spec: no imports.

Both :func:`fedtab.election.selectors.make_selector` (which builds the selector, importing
scikit-learn) and :mod:`fedtab.election.selector_specs` (which checks and sends a spec without
building it) refuse a named spec here, so they refuse the same specs with the same words.
``tests/election/test_selector_specs.py`` holds :data:`SELECTOR_DEFAULTS` equal to the selector
classes' constructor signatures.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SELECTOR_DEFAULTS", "resolve_selector"]

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


def resolve_selector(given: str, params: Any) -> tuple[str, dict[str, Any]]:
    """The canonical name and the given parameters of a named spec (``given``: the name as written,
    ``-`` and case as the user likes; ``params``: its ``params`` table).

    Raises:
        ValueError: ``unknown selector ...; known: [...]``, or ``bad parameters for selector ...: ...``
            (parameters that are not a mapping, or that the selector does not take).
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
