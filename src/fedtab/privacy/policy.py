"""The site's disclosure policy: what a site agrees to compute and send.

The policy belongs to the site (``Site(..., policy=...)`` or the ``policy``/``min-rows``
keys of its engine configuration); the server cannot override it. Every request passes
:meth:`DisclosurePolicy.refusal` *before* its handler runs: a request outside the
policy gets a ``"refused"`` reply (:meth:`fedtab.federation.Message.refusal`) naming
the rule, which the server reports by site name — nothing is computed.

Rules (the numbers are the defaults):

* ``min_rows = 10`` — no statistic, ballot or update is computed over fewer rows than
  this (the rows of the part the request uses); evaluations are capped in number instead.
* cell suppression (:func:`suppress_small`): any count below ``min_rows`` inside a reply
  (a column's observed count, a co-observed pair, a class) is sent as 0 together with
  every sum computed over those rows.
* ``category_sets`` only for columns the site stores as categorical (object, string,
  category or bool dtype) — never numeric values; categories seen in fewer than
  ``min_rows`` rows are merged into :data:`OTHER_CATEGORY` (:func:`merged_categories`).
* ``describe``/``evaluate`` only on the site's own row parts (``PARTS``), never on
  row subsets chosen by the server, and, once a schema is agreed
  (``site.state["schema"]``, :mod:`fedtab.federation.schema`), only over its columns;
  they return aggregates only.
* caps on server-chosen work: ``max_rounds`` fit requests (and as many ``score_sums``
  requests of the score test) per setup, ``max_local_epochs``,
  ``max_evaluations`` evaluations per site session (a binary-search probe of the
  test rows needs hundreds), ``max_param`` for any numeric parameter of a
  server-chosen selector.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..federation.messages import Message
    from ..federation.site import Site

__all__ = ["DisclosurePolicy", "OTHER_CATEGORY", "PARTS", "is_categorical", "merged_categories", "suppress_small",
           "policy_from_config"]

#: the merged category every rare category of a column is reported (and encoded) as.
OTHER_CATEGORY = "(other)"

#: the row parts a request may name: the site's own split (and the fit/validation split
#: of its training rows that the site draws itself).
PARTS = ("train", "test", "fit", "validation")


@dataclass(frozen=True)
class DisclosurePolicy:
    """A site's disclosure rules (see the module docstring).

    Args:
        min_rows: smallest number of rows any statistic, ballot or update may be
            computed over; also the cell-suppression threshold.
        max_rounds: most ``fit``/``impute_fit`` requests answered per setup.
        max_local_epochs: most local epochs a request may ask for.
        max_evaluations: most ``evaluate``/``impute_eval`` requests answered in total.
        max_param: bound on every numeric parameter of a server-chosen selector.
        allow_server_selector: whether the server may choose the selector at all.
        min_peers: fewest peers (the site included) a secure-aggregation request may
            name; a smaller (or self-only) peer set is refused.
        require_secure_aggregation: refuse any request for quantities the server needs
            only summed (:data:`fedtab.privacy.secagg.SUMMED_KINDS`) unless it arrives with
            secure masking.
        require_dp: the same, unless it arrives with DP settings.

    Raises:
        ValueError: a negative or non-integer limit.
    """

    min_rows: int = 10
    max_rounds: int = 1000
    max_local_epochs: int = 100
    max_evaluations: int = 500
    max_param: float = 10_000.0
    allow_server_selector: bool = True
    min_peers: int = 3
    require_secure_aggregation: bool = False
    require_dp: bool = False

    def __post_init__(self) -> None:
        for name in ("min_rows", "max_rounds", "max_local_epochs", "max_evaluations", "min_peers"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"disclosure policy: {name} must be a non-negative integer, got {value!r}")
        if not self.max_param > 0:
            raise ValueError(f"disclosure policy: max_param must be positive, got {self.max_param!r}")

    # ----- construction --------------------------------------------------------------
    @classmethod
    def permissive(cls) -> "DisclosurePolicy":
        """No row minimum (``min_rows=1``): for tests and demos with deliberately tiny sites."""
        return cls(min_rows=1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> "DisclosurePolicy":
        """Build from ``{"min_rows": 20, ...}`` (hyphens allowed in keys).

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        known = {f.name for f in fields(cls)}
        clean = {str(k).replace("-", "_"): v for k, v in spec.items()}
        unknown = sorted(set(clean) - known)
        if unknown:
            raise ValueError(f"disclosure policy: unknown setting(s) {unknown}; known: {sorted(known)}")
        return cls(**clean)

    # ----- the check before every handler -------------------------------------------
    def refusal(self, site: "Site", request: "Message") -> str | None:
        """Why ``site`` refuses ``request`` under this policy, or ``None`` to answer it."""
        for check in (*_EVERY_REQUEST, _CHECKS.get(request.kind)):
            reason = None if check is None else check(self, site, request)
            if reason is not None:
                return reason
        return None

    def too_few(self, n: int, what: str) -> str | None:
        if n < self.min_rows:
            return f"{what} has {n} row(s), fewer than the site's min_rows={self.min_rows}"
        return None


def policy_from_config(value: Any) -> DisclosurePolicy:
    """A policy from a site-config value: a policy, a dict, a JSON object string or ``None`` (default).

    Raises:
        ValueError: invalid JSON or settings.
    """
    if value is None or value == "":
        return DisclosurePolicy()
    if isinstance(value, DisclosurePolicy):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"disclosure policy {value!r} is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"disclosure policy must be a JSON object, got {type(value).__name__}")
    return DisclosurePolicy.from_dict(value)


# ----------------------------------------------------------------------- helpers
def is_categorical(series: "pd.Series") -> bool:
    """Whether the site stores ``series`` as categorical (not a number it could leak)."""
    import pandas as pd

    return not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)


def merged_categories(series: "pd.Series", min_rows: int) -> list[str]:
    """Sorted categories of ``series`` seen in at least ``min_rows`` rows, plus
    :data:`OTHER_CATEGORY` when rarer ones were merged into it."""
    counts = series.dropna().astype(str).value_counts()
    kept = sorted(str(c) for c, n in counts.items() if n >= min_rows)
    if (counts < min_rows).any():
        kept.append(OTHER_CATEGORY)
    return kept


def suppress_small(counts: np.ndarray, min_rows: int, *sums: np.ndarray) -> tuple[np.ndarray, ...]:
    """Zero every cell whose count is below ``min_rows`` (but above 0), in the counts and
    in each same-shaped sum computed over those rows. Returns new arrays."""
    small = (np.asarray(counts) > 0) & (np.asarray(counts) < min_rows)
    return tuple(np.where(small, 0, a) for a in (counts, *sums))


def _count(site: "Site", key: str) -> int:
    counter = site.state.setdefault("policy_counts", {})
    counter[key] = int(counter.get(key, 0)) + 1
    return counter[key]


def _part_rows(site: "Site", part: Any) -> tuple[int | None, str | None]:
    """(rows in ``part``, None) or (None, refusal reason)."""
    if part not in PARTS:
        return None, f"row part {part!r} is not one of the site's parts {PARTS}"
    if part in ("fit", "validation"):
        split = site.state.get("fit_validation")
        if split is None:
            return 0, None  # the handler reports the missing split as an error
        return len(split[0] if part == "fit" else split[1]), None
    return site.n_rows(part), None


def _agreed_columns(site: "Site") -> set[str] | None:
    """Column names of the agreed schema (``site.state["schema"]["columns"]``), or
    ``None`` before one is agreed."""
    schema = site.state.get("schema")
    names = schema.get("columns") if isinstance(schema, dict) else None
    return set(map(str, names)) if isinstance(names, list) else None


def _check_part(policy: DisclosurePolicy, site: "Site", part: Any, what: str) -> str | None:
    n, reason = _part_rows(site, part)
    if reason:
        return reason
    return policy.too_few(int(n or 0), f"{what} on part {part!r}")


def _check_features(site: "Site", features: Any) -> str | None:
    if features is None:
        return None
    if not isinstance(features, list):
        return "features must be a list of column names"
    agreed = _agreed_columns(site)
    # before a schema is agreed any names may be asked: a column the site lacks is answered as absent
    outside = [] if agreed is None else [f for f in features if str(f) not in agreed]
    if outside:
        return f"features {outside[:5]} are not in the agreed schema"
    return None


def _check_selector(policy: DisclosurePolicy, spec: Any) -> str | None:
    if spec is None:
        return None
    if not policy.allow_server_selector:
        return "the site does not let the server choose its selector"
    params = spec.get("params", {}) if isinstance(spec, dict) else {}
    big = [k for k, v in (params or {}).items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > policy.max_param]
    if big:
        return f"selector parameters {big} exceed the site's cap max_param={policy.max_param:g}"
    return None


def _ballot(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    part = "fit" if request.kind == "ballot_fit" else "train"
    return (_check_selector(policy, request.meta.get("selector"))
            or _check_features(site, request.meta.get("features"))
            or _check_part(policy, site, part, "a ballot"))


def _describe(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    if request.kind == "set_mask" and request.meta.get("describe") is None:
        return None
    part = request.meta.get("describe") if request.kind == "set_mask" else request.meta.get("part", "train")
    return _check_features(site, request.meta.get("features")) or _check_part(policy, site, part, "describe")


def _epochs(policy: DisclosurePolicy, epochs: Any) -> str | None:
    if isinstance(epochs, int) and epochs > policy.max_local_epochs:
        return f"{epochs} local epochs exceed the site's cap max_local_epochs={policy.max_local_epochs}"
    return None


def _setup_part(site: "Site", request: "Message", counter: str, state_key: str) -> tuple[str | None, Any]:
    """``(refusal or None, row part)`` of a request that may carry its workflow's setup
    (``meta["setup"]``); a new setup restarts the request counter ``counter``."""
    setup = request.meta.get("setup")
    if isinstance(setup, dict):
        site.state["policy_counts"] = {**site.state.get("policy_counts", {}), counter: 0}
        return _check_features(site, setup.get("features")), setup.get("part", "train")
    return None, (site.state.get(state_key) or {}).get("part", "train")


def _fit(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    reason, part = _setup_part(site, request, "fit", "train_setup")
    reason = reason or _epochs(policy, request.meta.get("epochs")) or _check_part(policy, site, part, "a model update")
    if reason is None and _count(site, "fit") > policy.max_rounds:
        reason = f"more fit rounds than the site's cap max_rounds={policy.max_rounds}"
    return reason


def _score_sums(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """The score test's sums (:mod:`fedtab.federation.score_test_flow`): the agreed columns, at
    least ``min_rows`` rows, at most ``max_rounds`` requests per setup."""
    reason, part = _setup_part(site, request, "score_sums", "score_setup")
    reason = reason or _check_part(policy, site, part, "score-test sums")
    if reason is None and _count(site, "score_sums") > policy.max_rounds:
        reason = f"more score-test requests than the site's cap max_rounds={policy.max_rounds}"
    return reason


def _evaluation_part(policy: DisclosurePolicy, site: "Site", part: Any) -> str | None:
    """Evaluations only on the site's own parts. They are not held to ``min_rows`` (a small
    site's test part often has fewer rows); the probe defence is ``max_evaluations``."""
    _, reason = _part_rows(site, part)
    return reason


def _evaluate(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    reason = _evaluation_part(policy, site, request.meta.get("part", "test"))
    if reason is None and _count(site, "evaluate") > policy.max_evaluations:
        reason = f"more evaluations than the site's cap max_evaluations={policy.max_evaluations}"
    return reason


def _local_baseline(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A local-only model trained on the training rows and scored on the test rows."""
    return (_check_features(site, request.meta.get("features")) or _epochs(policy, request.meta.get("epochs"))
            or _check_part(policy, site, "train", "a local baseline")
            or _evaluation_part(policy, site, "test"))


def _category_sets(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    columns = request.meta.get("columns")
    if not isinstance(columns, list):
        return None  # the handler reports the malformed request
    numeric = [c for c in columns if c in site.table.columns and not is_categorical(site.table[c])]
    if numeric:
        return f"columns {numeric[:5]} are numeric at this site; it lists categories of categorical columns only"
    return None


def _impute_rows(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    return policy.too_few(site.n_rows("train"), "imputation statistics on part 'train'")


def _impute_setup(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    config = request.meta.get("config")
    if isinstance(config, dict):
        rounds = config.get("rounds")
        if isinstance(rounds, int) and rounds > policy.max_rounds:
            return f"{rounds} rounds exceed the site's cap max_rounds={policy.max_rounds}"
        reason = _epochs(policy, config.get("local_epochs"))
        if reason:
            return reason
    site.state["policy_counts"] = {**site.state.get("policy_counts", {}), "impute_fit": 0}
    return _impute_rows(policy, site, request)


def _impute_fit(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    reason = _impute_rows(policy, site, request)
    if reason is None and _count(site, "impute_fit") > policy.max_rounds:
        reason = f"more imputation rounds than the site's cap max_rounds={policy.max_rounds}"
    return reason


def _impute_eval(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    if _count(site, "evaluate") > policy.max_evaluations:
        return f"more evaluations than the site's cap max_evaluations={policy.max_evaluations}"
    return None


_CHECKS = {
    "ballot": _ballot,
    "ballot_fit": _ballot,
    "describe": _describe,
    "set_mask": _describe,
    "fit": _fit,
    "score_sums": _score_sums,
    "evaluate": _evaluate,
    "local_baseline": _local_baseline,
    "category_sets": _category_sets,
    "impute_schema": _impute_rows,
    "impute_stats": _impute_rows,
    "impute_setup": _impute_setup,
    "impute_fit": _impute_fit,
    "impute_eval": _impute_eval,
}


def _secure_terms(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """The site's terms for sums: a masking request must pass the secure-aggregation checks
    (verified peers, ``min_peers``, a majority threshold; :func:`fedtab.privacy.secagg.masking_refusal`);
    with ``require_secure_aggregation`` / ``require_dp`` a request for quantities the server
    needs only summed must arrive masked / with DP settings."""
    from .dp import DP_META
    from .secagg import SECAGG_META, is_summed_request, masking_refusal

    if SECAGG_META in request.meta:
        reason = masking_refusal(site, request, policy.min_peers)
        if reason is not None:
            return reason
    if (policy.require_secure_aggregation or policy.require_dp) and is_summed_request(request):
        if policy.require_secure_aggregation and SECAGG_META not in request.meta:
            return f"this site answers {request.kind!r} only with secure aggregation (require_secure_aggregation)"
        if policy.require_dp and not isinstance(request.meta.get(DP_META), dict):
            return f"this site answers {request.kind!r} only with differential privacy (require_dp)"
    return None


#: checks every request passes, whatever its kind, before the kind's own check
_EVERY_REQUEST = (_secure_terms,)
