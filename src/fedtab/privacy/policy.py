"""The site's disclosure policy: what a site agrees to compute and send.

The policy belongs to the site (``Site(..., policy=...)`` or the ``policy``/``min-rows``
keys of its engine configuration); the server cannot override it. Every request passes
:meth:`DisclosurePolicy.refusal` *before* its handler runs: a request outside the
policy gets a ``"refused"`` reply (:meth:`fedtab.federation.Message.refusal`) naming
the rule, which the server reports by site name — nothing is computed.

Rules (the numbers are the defaults); the release gate (:mod:`fedtab.privacy.gate`)
enforces the rest on what each handler declares it releases:

* ``min_rows = 10`` — no statistic, ballot, update or evaluation is computed over a
  part of fewer rows (per class for per-class releases), and every count below it in a
  reply is suppressed (:func:`suppress_small`, applied by the gate). The parts themselves
  are drawn by the site from its own seed (:mod:`fedtab.federation.site.parts`); a request
  names a part, never sizes or seeds one.
* ``category_sets`` only for columns the site stores as categorical (object, string,
  category or bool dtype) — never numeric values; categories seen in fewer than
  ``min_rows`` rows are merged into :data:`OTHER_CATEGORY` (:func:`merged_categories`),
  at the site both when it lists them and when it encodes them.
* once a schema is agreed (``site.state["schema"]``, :mod:`fedtab.federation.protocol.schema`),
  requests may name only its columns.
* caps on server-chosen work, kept in the site's ledger (:mod:`fedtab.privacy.ledger`)
  so that no setup, run or restart resets them: ``max_rounds`` fit requests (and as many
  ``score_sums`` and imputation rounds) per run, ``max_evaluations`` evaluations per
  part per run (every model a request scores is one: a selection request with 200 slots
  is 200), ``max_models_per_request`` models in one request and, in the clear, at most
  :func:`plain_model_cap` distinct server-sent models per part per run — one count,
  :func:`charge_models`, for every kind that declares ``models``;
  ``max_releases_per_part`` releases per part per run (per run, so that a server spending
  them with cheap requests cannot lock a site out past its own run),
  ``max_local_epochs``, ``max_score_bins`` bins of a score histogram, ``max_param`` for
  any numeric parameter of a server-chosen selector or model (numbers nested in lists
  and dicts too; lists hold at most :data:`MAX_LIST_PARAM` entries), and ``max_work`` /
  ``max_size`` for the compute a server-chosen selector or model needs on the site's rows,
  estimated before anything runs (:func:`fedtab.election.selectors.selector_cost`,
  :func:`fedtab.learn.models.model_cost`); a refusal names the parameter at fault.
* differential privacy on the site's terms: a request's noise multiplier can only add
  noise — the site answers with at least the multiplier whose single release spends
  ``max_epsilon_per_release`` (at ``delta``) and refuses once the period's releases would
  spend more than ``epsilon_budget`` (``Site.dp_terms``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import numpy as np

from .suppression import suppress_small

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.site.core import Site

__all__ = ["DisclosurePolicy", "MAX_LIST_PARAM", "OTHER_CATEGORY", "PARTS", "coarse_range", "is_categorical",
           "merged_categories", "suppress_small", "policy_from_config"]

#: the merged category every rare category of a column is reported (and encoded) as.
OTHER_CATEGORY = "(other)"

#: the row parts a request may name besides ``fold:k`` / ``fit:k`` (see :mod:`fedtab.federation.site.parts`).
PARTS = ("train", "test", "fit", "validation", "all")

#: most entries of a list-valued parameter of a server-chosen selector or model (hidden layer sizes, ...)
MAX_LIST_PARAM = 64


class KindTerms(Protocol):
    """What the policy reads of a message kind's declaration (``fedtab.federation.protocol.kinds.MessageKind``)."""

    check: Callable[["DisclosurePolicy", Any, Any], str | None] | None
    models: Callable[[Any, Any], "Evaluations | None"] | None

    def is_summed(self, request: Any) -> bool: ...


@dataclass(frozen=True)
class DisclosurePolicy:
    """A site's disclosure rules (see the module docstring).

    Args:
        min_rows: smallest number of rows any statistic, ballot or update may be
            computed over; also the cell-suppression threshold.
        max_rounds: most ``fit`` (and ``score_sums``, ``impute_fit``) requests answered per run.
        max_local_epochs: most local epochs a request may ask for.
        max_evaluations: most evaluations answered per part per run: an ``evaluate`` /
            ``impute_eval`` request is one, a selection request one per model it scores.
        max_param: bound on every numeric parameter of a server-chosen selector or model,
            numbers inside list- and dict-valued parameters included.
        allow_server_selector: whether the server may choose the selector at all.
        max_score_bins: most bins of a score histogram an evaluation may ask for.
        max_releases_per_part: most replies computed over one part per run.
        max_model_abs: largest ``|entry|`` of model parameters a request may send.
        max_epsilon_per_release: ε of one differentially private release at the site's
            noise floor (the server may only add noise).
        epsilon_budget: most ε the site spends per period, composed over its releases.
        delta: the δ of the site's own privacy accounting.
        period_days: length of the ledger's period (of ``epsilon_budget``).
        max_work: most work (≈ arithmetic operations, :class:`fedtab.learn.models.Cost`) a
            server-chosen selector or model may need on the site's rows; the default (1e13,
            hours of one core) is far above every shipped benchmark.
        max_size: most numbers such a selector or model may hold at once (parameters, tree
            nodes); the default 1e9 is 8 GB of float64.
        min_peers: fewest peers (the site included) a secure-aggregation request may
            name; a smaller (or self-only) peer set is refused.
        require_secure_aggregation: refuse any request for quantities the server needs
            only summed (the kinds declared ``summed`` in ``fedtab.federation.protocol.kinds``; per-site
            kinds such as ballots, the schema, the profile and local baselines are not) unless it arrives with
            secure masking.
        require_dp: the same, unless it arrives with DP settings.
        max_models_per_request: most models (selection chains, evaluation slots) one request
            may carry. Each is one evaluation against ``max_evaluations`` (charged to the part
            it is scored on) and one model's work against ``max_work``; a request with more is
            answered only as a request over row sets the server chooses
            (``allow_server_row_sets``, a secure sum or DP).
        allow_server_row_sets: answer in the clear requests whose row set the server
            chooses (GBDT nodes under server-chosen splits or bin edges, selection chains,
            evaluations of server-sent models beyond the per-request cap). ``False`` (the
            default): such a request is answered only inside a secure sum among at least
            ``min_peers`` verified sites or with differential privacy from the site's budget;
            docs/privacy.md states what opting in costs.
        max_split_thresholds: most distinct bin edges (the only thresholds a split can use)
            per feature per period that GBDT runs may bin the site's rows at; a server-sent
            grid with more edges in a feature, or that would bring the period's distinct
            edges of a feature over the cap, is refused (a server cannot sweep thresholds).

    Raises:
        ValueError: a negative or non-integer limit.
    """

    min_rows: int = 10
    max_rounds: int = 1000
    max_local_epochs: int = 100
    max_evaluations: int = 500
    max_param: float = 10_000.0
    allow_server_selector: bool = True
    max_score_bins: int = 1000
    max_releases_per_part: int = 100_000
    max_model_abs: float = 1e6
    max_epsilon_per_release: float = 4.0
    epsilon_budget: float = 64.0
    delta: float = 1e-5
    period_days: int = 365
    max_work: float = 1e13
    max_size: float = 1e9
    min_peers: int = 3
    require_secure_aggregation: bool = False
    require_dp: bool = False
    allow_server_row_sets: bool = False
    max_split_thresholds: int = 512
    max_models_per_request: int = 2000

    def __post_init__(self) -> None:
        for name in ("min_rows", "max_rounds", "max_local_epochs", "max_evaluations", "max_score_bins",
                     "max_releases_per_part", "period_days", "min_peers", "max_split_thresholds",
                     "max_models_per_request"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"disclosure policy: {name} must be a non-negative integer, got {value!r}")
        if self.period_days < 1:
            raise ValueError("disclosure policy: period_days must be at least 1")
        for name in ("max_param", "max_model_abs", "max_epsilon_per_release", "epsilon_budget", "max_work",
                     "max_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"disclosure policy: {name} must be positive, got {value!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ValueError(f"disclosure policy: delta must be in (0, 1), got {self.delta!r}")

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
    def refusal(self, site: "Site", request: "Message", kind: "KindTerms | None" = None) -> str | None:
        """Why ``site`` refuses ``request`` under this policy, or ``None`` to answer it.

        ``kind``: the declaration of the request's kind (``fedtab.federation.protocol.kinds.MessageKind``,
        passed in by the site: privacy never imports the federation): its ``check`` runs after
        the checks every request passes, then, for a kind that declares ``models`` (an
        evaluation of server-sent models), :func:`charge_models`; ``kind.is_summed(request)``
        decides whether the require flags apply. Charges made here reach the ledger only if the
        site accepts the request (``Site.handle`` runs the checks in ``SiteLedger.pending``). ``None`` (an undeclared kind): only the checks every request passes.
        """
        reason = _secure_terms(self, site, request, kind)
        check = kind.check if kind is not None else None
        if reason is None and check is not None:
            reason = check(self, site, request)
        models = getattr(kind, "models", None)
        if reason is None and models is not None:
            evaluations = models(site, request)
            if evaluations is not None:
                reason = charge_models(self, site, request, evaluations)
        return reason

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


def _round_out(value: float, up: bool) -> float:
    """``value`` rounded away from the inside of a range to two significant digits."""
    if value == 0 or not math.isfinite(value):
        return float(value)
    step = 10.0 ** (math.floor(math.log10(abs(value))) - 1)
    q = value / step
    return float(round((math.ceil(q) if up else math.floor(q)) * step, 12))


def coarse_range(values: np.ndarray, min_rows: int) -> tuple[float, float] | None:
    """``(low, high)`` that no single row determines: the ``min_rows``-th smallest and largest
    of ``values`` (observed, finite) rounded outward to two significant digits; ``None``
    for fewer than ``max(min_rows, 1)`` values."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    k = max(int(min_rows), 1)
    if len(v) < k:
        return None
    a, b = sorted((float(v[k - 1]), float(v[-k])))  # with fewer than 2k values the two cross
    return _round_out(a, up=False), _round_out(b, up=True)


def _charge_run(policy: DisclosurePolicy, site: "Site", key: str, what: str, n: int = 1) -> str | None:
    """Count ``n`` more ``key`` requests in the site's current run (its ledger) unless past ``max_rounds``."""
    return site.ledger.charge_run(getattr(site, "run_id", "local"), key, policy.max_rounds, what, n=n,
                                  cap_name="max_rounds")


def server_row_set_refusal(policy: DisclosurePolicy, request: "Message", what: str) -> str | None:
    """Refusal text for a plain answer over a row set the server chooses, else ``None``.

    A request whose rows are picked by the server (tree nodes under its splits or bin edges,
    its selection chains, evaluations of models it sent beyond a per-request cap) can be
    differenced against another to isolate single rows. The site answers it only inside a
    secure sum (the request carries secure-aggregation meta, whose peers
    :func:`_secure_terms` verifies) or with differential privacy from its own budget, unless
    its operator opted in with ``allow_server_row_sets``. ``what`` names the row sets in the
    refusal (e.g. ``"tree nodes under the server's splits"``).
    """
    from .dp import DP_META
    from .secagg import SECAGG_META

    if policy.allow_server_row_sets or SECAGG_META in request.meta or isinstance(request.meta.get(DP_META), dict):
        return None
    return (f"this site answers {request.kind!r} over {what} only inside a secure sum or with differential "
            f"privacy (allow_server_row_sets is off)")


def _charge_evaluation(policy: DisclosurePolicy, site: "Site", part: Any) -> str | None:
    """Count one more evaluation of ``part`` in the site's current run unless past ``max_evaluations``."""
    return _charge_evaluations(policy, site, {str(part): 1})


def _charge_evaluations(policy: DisclosurePolicy, site: "Site", counts: Mapping[str, int]) -> str | None:
    """Count ``counts[part]`` more evaluations of every part in the site's current run unless one
    would pass ``max_evaluations``: all or none (:meth:`fedtab.privacy.ledger.SiteLedger.charge_evaluations`,
    the ledger function :func:`charge_models` uses too). Per run, so cheap evaluations spent by
    one run leave the next run its own."""
    return site.ledger.charge_evaluations(getattr(site, "run_id", "local"),
                                          {_part_name(p): n for p, n in counts.items()}, policy.max_evaluations)


def _agreed_columns(site: "Site") -> set[str] | None:
    """Column names of the agreed schema (``site.state["schema"]["columns"]``), or
    ``None`` before one is agreed."""
    schema = site.state.get("schema")
    names = schema.get("columns") if isinstance(schema, dict) else None
    return set(map(str, names)) if isinstance(names, list) else None


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


def _rows_of(site: "Site", part: Any) -> int:
    """Rows of ``part`` at the site, 0 for a part it does not have (the gate reports that)."""
    try:
        return site.n_rows(str(part))
    except (ValueError, KeyError, TypeError):
        return 0


def _too_big(params: Any, cap: float) -> list[str]:
    """Top-level names of ``params`` holding a number above ``cap`` (or not finite) anywhere
    inside, or a list longer than :data:`MAX_LIST_PARAM`."""
    if not isinstance(params, Mapping):
        return []
    big = []
    for name, value in params.items():
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, bool) or v is None or isinstance(v, str):
                continue
            if isinstance(v, (int, float, np.integer, np.floating)):
                if not abs(float(v)) <= cap:
                    big.append(str(name))
                    break
            elif isinstance(v, (list, tuple)):
                if len(v) > MAX_LIST_PARAM:
                    big.append(str(name))
                    break
                stack.extend(v)
            elif isinstance(v, Mapping):
                stack.extend(v.values())
    return big


def _own_selector_cost(policy: DisclosurePolicy, site: "Site", part: str, runs: int) -> str | None:
    """The site's own selector (its configuration's, or a job's written into it) held to the
    same work caps as a server-chosen one: ``runs`` runs of it on ``part``'s rows."""
    own = getattr(site, "selector", None)
    if own is None:
        return None
    from ..election.selectors import selector_cost

    try:
        cost = selector_cost(own, _rows_of(site, part), len(site.feature_names))
    except ValueError:
        return None  # a selector that cannot be built: the handler reports it
    return _times(cost, runs).refusal(policy.max_work, policy.max_size, "selector", own if isinstance(
        own, (str, Mapping)) else getattr(own, "name", type(own).__name__))


def _times(cost: Any, n: int) -> Any:
    """``cost`` of one run made ``n`` runs' work (the size is what one run holds at once)."""
    from ..learn.models import Cost

    return Cost(cost.work * max(int(n), 1), cost.size, cost.driver)


def _check_selector(policy: DisclosurePolicy, spec: Any, site: "Site | None" = None, part: str = "train",
                    runs: int = 1) -> str | None:
    """A server-chosen selector ``spec`` (``None``: the site's own) within the site's caps:
    its parameters within ``max_param`` and ``runs`` runs of it on ``part`` within
    ``max_work``/``max_size``; the site's own selector is held to the work caps too."""
    if spec is None:
        return None if site is None else _own_selector_cost(policy, site, part, runs)
    if not policy.allow_server_selector:
        return "the site does not let the server choose its selector"
    params = spec.get("params", {}) if isinstance(spec, dict) else {}
    big = _too_big(params or {}, policy.max_param)
    if big:
        return f"selector parameters {big} exceed the site's cap max_param={policy.max_param:g}"
    if site is None:
        return None
    from ..election.selectors import selector_cost  # imports scikit-learn: only where a selector is chosen

    try:
        cost = selector_cost(spec, _rows_of(site, part), len(site.feature_names))
    except ValueError:
        return None  # a spec that cannot be built: the handler reports it
    return _times(cost, runs).refusal(policy.max_work, policy.max_size, "selector", spec)


def _check_model(policy: DisclosurePolicy, site: "Site", spec: Any, features: Any, classes: Any, part: Any,
                 epochs: Any) -> str | None:
    """A server-chosen model spec (training setup, local baseline): its parameters within
    ``max_param`` and its estimated cost on the part's rows within ``max_work``/``max_size``."""
    if spec is None:
        return None
    big = _too_big(spec.get("params") if isinstance(spec, dict) else None, policy.max_param)
    if big:
        return f"model parameters {big} exceed the site's cap max_param={policy.max_param:g}"
    if not isinstance(features, list) or not isinstance(classes, list) or part not in PARTS:
        return None  # the handler reports the malformed request
    from ..learn.models import model_cost

    rows = _rows_of(site, part)
    n_epochs = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else 1
    try:
        cost = model_cost(spec, len(features), max(len(classes), 2), rows, n_epochs)
    except ValueError:
        return None  # a spec that cannot be built: the handler reports it
    return cost.refusal(policy.max_work, policy.max_size, "model", spec)


def _ballot(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    part = "fit" if request.kind == "ballot_fit" else "train"
    return (_check_selector(policy, request.meta.get("selector"), site, part)
            or _check_features(site, request.meta.get("features")))


def _describe(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    return _check_features(site, request.meta.get("features"))


def _epochs(policy: DisclosurePolicy, epochs: Any) -> str | None:
    if isinstance(epochs, int) and epochs > policy.max_local_epochs:
        return f"{epochs} local epochs exceed the site's cap max_local_epochs={policy.max_local_epochs}"
    return None


def _fit(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    setup = request.meta.get("setup")
    reason = _check_features(site, setup.get("features")) if isinstance(setup, dict) else None
    reason = reason or _epochs(policy, request.meta.get("epochs"))
    setup = setup if isinstance(setup, dict) else site.state.get("train_setup") or {}
    reason = reason or _check_model(policy, site, setup.get("model"), setup.get("features"), setup.get("classes"),
                                    setup.get("part", "train"), request.meta.get("epochs", 1))
    # a new setup does not reset the count: the ledger counts per run (issue 20)
    return reason or _charge_run(policy, site, "fit", "fit rounds")


def _training_setup(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A stand-alone training ``"setup"``: the agreed columns and a model within the caps."""
    meta = request.meta
    return _check_features(site, meta.get("features")) or _check_model(
        policy, site, meta.get("model"), meta.get("features"), meta.get("classes"), meta.get("part", "train"), 1)


def _score_sums(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """The score test's sums (:mod:`fedtab.federation.workflows.score_test.server`): the agreed columns,
    at most ``max_rounds`` requests per run."""
    setup = request.meta.get("setup")
    reason = _check_features(site, setup.get("features")) if isinstance(setup, dict) else None
    return reason or _charge_run(policy, site, "score_sums", "score-test requests")


def _score_bins(policy: DisclosurePolicy, request: "Message") -> str | None:
    bins = request.meta.get("score_bins")
    if isinstance(bins, int) and not isinstance(bins, bool) and bins > policy.max_score_bins:
        return f"{bins} score bins exceed the site's cap max_score_bins={policy.max_score_bins}"
    return None


def _model_params(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A model sent for evaluation must have the agreed features' shapes and bounded entries."""
    setup = site.state.get("train_setup")
    params = {k[len("param:"):]: v for k, v in request.arrays.items() if k.startswith("param:")}
    if not isinstance(setup, dict):
        return None  # the handler reports that training is not set up
    from ..learn.models import make_model

    model = make_model(setup["model"])
    if model.exact:
        return None  # an exact model's statistics are sums, not bounded weights
    template = model.update_template(len(setup["features"]), len(setup["classes"]))
    if set(params) != set(template) or any(tuple(np.shape(params[k])) != tuple(s) for k, s in template.items()):
        return "the model to evaluate does not have the shapes of the agreed features and classes"
    for k, v in params.items():
        a = np.asarray(v, dtype=np.float64)
        if a.size and not (np.isfinite(a).all() and np.abs(a).max() <= policy.max_model_abs):
            return f"model parameter {k!r} is beyond the site's bound max_model_abs={policy.max_model_abs:g}"
    return None


def _evaluate(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A server-sent model scored on a part: its shapes and bounds (the model is counted by
    :func:`charge_models`: the kind declares ``models``)."""
    return _score_bins(policy, request) or _model_params(policy, site, request)


def _local_baseline(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A local-only model trained on the training rows and scored on the test rows."""
    meta = request.meta
    return (_check_features(site, meta.get("features")) or _epochs(policy, meta.get("epochs"))
            or _score_bins(policy, request)
            or _check_model(policy, site, meta.get("model"), meta.get("features"), meta.get("classes"), "train",
                            meta.get("epochs", 1))
            or _charge_evaluation(policy, site, "test"))


def _category_sets(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    columns = request.meta.get("columns")
    if not isinstance(columns, list):
        return None  # the handler reports the malformed request
    numeric = [c for c in columns if c in site.table.columns and not is_categorical(site.table[c])]
    if numeric:
        return f"columns {numeric[:5]} are numeric at this site; it lists categories of categorical columns only"
    return None


def _impute_setup(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    config = request.meta.get("config")
    if isinstance(config, dict):
        rounds = config.get("rounds")
        if isinstance(rounds, int) and rounds > policy.max_rounds:
            return f"{rounds} rounds exceed the site's cap max_rounds={policy.max_rounds}"
        return _epochs(policy, config.get("local_epochs"))
    return None


def _impute_fit(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    return _charge_run(policy, site, "impute_fit", "imputation rounds")


def _impute_eval(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    return _charge_evaluation(policy, site, "impute:test")


def _gbdt_classes(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A classification start names distinct class labels, at least one of them held by the
    site. A label the site does not hold is accepted (label skew: another site holds it), but
    buys the server nothing: every tree of a round is charged as one round of the run
    (:func:`_gbdt_level`), so ``K`` dummy classes grow no more trees than ``max_rounds``."""
    params = request.meta.get("params")
    if not isinstance(params, Mapping) or params.get("objective") == "regression":
        return None
    classes = request.meta.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) \
            or len(set(classes)) != len(classes):
        return "the boosting classes must be a list of distinct class labels"
    held = set(site.class_counts("all"))
    if not held.intersection(classes):
        return "the boosting request names no class label this site holds"
    return None


#: the ledger key of a column's fine sketch grid (``[lo, hi, steps]``, fixed for a period)
GBDT_SKETCH_GRID = "gbdt sketch grid of "


def _gbdt_sketch(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A sketch request (:mod:`fedtab.learn.gbdt.sketch`): refused in a plain run whose levels the
    site would refuse (:func:`_gbdt_refused_run`); the agreed columns; the range stage
    (one constant public grid) always; a fine stage only over ends that are points of the range
    grid, and per column only the fine grid the site answered first in the period (recorded in
    the ledger, all columns or none): a second grid, whose edges could fall between two rows of
    the first one's runs, is refused. A DP request is not held to that grid (its counts are
    noised and charged to the site's ε budget, each request again) and fixes none."""
    from ..learn.gbdt.sketch import SKETCH_BINS, fine_grid_refusal
    from .dp import DP_META

    features = request.meta.get("features")
    reason = _gbdt_refused_run(policy, request) or _check_features(site, features)
    if reason is not None or not isinstance(features, list):
        return reason
    if request.meta.get("stage") != "fine":
        return None  # the range stage (the handler refuses another stage)
    lo, hi = request.meta.get("lo"), request.meta.get("hi")
    reason = fine_grid_refusal(lo, hi, len(features))  # type: ignore[arg-type]
    if reason is not None or isinstance(request.meta.get(DP_META), dict):
        return reason
    want = {str(f): [float(a), float(b), SKETCH_BINS] for f, a, b in
            zip(features, np.asarray(lo, float).tolist(), np.asarray(hi, float).tolist())}
    for f, grid in want.items():
        had = site.ledger.fixed_value(GBDT_SKETCH_GRID + f)
        if had is not None and had != grid:
            return (f"this site answered a sketch of column {f!r} over another fine grid in this period; it answers "
                    "one fine grid per column per period")
    for f, grid in want.items():
        site.ledger.fixed_release(GBDT_SKETCH_GRID + f, lambda grid=grid: grid)
    return None


def _agreed_grids(policy: DisclosurePolicy, site: "Site", features: list[str], public: set[str]
                  ) -> list[np.ndarray | None] | str:
    """Per feature the points its bin edges must be on (``None``: no restriction): the site's
    fine sketch grid of the period, nothing for a column with public bounds (they bound it) or
    for a site that opted in to server-chosen row sets. A column with neither is refused."""
    from ..learn.gbdt.sketch import fine_grid

    out: list[np.ndarray | None] = []
    for f in features:
        grid = site.ledger.fixed_value(GBDT_SKETCH_GRID + str(f))
        if grid is not None:
            out.append(fine_grid(grid[0], grid[1], int(grid[2])))
        elif str(f) in public or policy.allow_server_row_sets:
            out.append(None)
        else:
            return (f"the bin edges of column {f!r} come from no public bounds and no sketch grid this site agreed "
                    "(edges on a server's grid could fall between two rows; allow_server_row_sets is off)")
    return out


def _gbdt_grid(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """The server's bin grid (:func:`fedtab.learn.gbdt.grid.grid_refusal`: sorted, finite, at
    most ``max_split_thresholds`` edges a feature; under DP exactly the equal-width grid of the
    public bounds, or for a column without, points of the site's last DP sketch grid (:func:`_dp_grids`); otherwise each column's edges inside its public bounds (``meta["bounds"]``)
    or on the fine grid of the site's sketch of the period (:func:`_agreed_grids`)), then its
    distinct edges per feature counted in the ledger's period (at most ``max_split_thresholds``)."""
    from ..learn.gbdt.grid import edge_keys, grid_refusal
    from .dp import DP_META, column_bounds

    features, params = request.meta.get("features"), request.meta.get("params")
    if not isinstance(features, list) or not isinstance(params, Mapping):
        return None  # the handler reports the malformed request
    dp = request.meta.get(DP_META)
    bounds = public = allowed = None
    if isinstance(dp, dict):
        reason_or_grids = _dp_grids(site, [str(f) for f in features], dp, params)
        if isinstance(reason_or_grids, str):
            return reason_or_grids
        bounds, public, allowed = reason_or_grids
    else:
        given = request.meta.get("bounds") or {}
        if not isinstance(given, Mapping):
            return "the request's public bounds must map columns to [low, high]"
        held = [str(f) for f in features if str(f) in given]
        try:
            lo, hi = column_bounds({"bounds": dict(given)}, [str(f) for f in features], held=held)
        except (ValueError, TypeError) as exc:
            return str(exc)
        free = np.array([str(f) not in given for f in features])
        bounds = (np.where(free, -np.inf, lo), np.where(free, np.inf, hi))
        allowed = _agreed_grids(policy, site, [str(f) for f in features], set(held))
        if isinstance(allowed, str):
            return allowed
    reason = grid_refusal(request.arrays, len(features), max_edges=policy.max_split_thresholds, bounds=bounds,
                          public=public, allowed=allowed)
    if reason is not None:
        return reason
    keys = {f"gbdt edges of {f}": v for f, v in edge_keys(request.arrays, features).items()}
    return site.ledger.charge_distinct(keys, policy.max_split_thresholds, "bin edges (split thresholds) of feature",
                                       cap_name="max_split_thresholds")


def _dp_grids(site: "Site", features: list[str], dp: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
    """Under DP, ``(bounds, public grids, allowed points)`` of a grid check, or a refusal: a
    column with DP bounds (``dp["bounds"]``, one pair for all or per column) takes exactly the
    equal-width grid of its bounds; a column without takes edges on the fine grid of this
    site's last DP sketch of it (``state["gbdt_dp_sketch"]``); a column with neither is refused."""
    from ..learn.gbdt.grid import public_grid
    from ..learn.gbdt.sketch import fine_grid
    from .dp import column_bounds

    given = dp.get("bounds")
    held = [f for f in features if given is not None and (not isinstance(given, Mapping) or f in given)]
    max_bins = params.get("max_bins", 256)
    if isinstance(max_bins, bool) or not isinstance(max_bins, int) or not 2 <= max_bins <= 65535:
        return "max_bins must be an integer in 2..65535"
    lo = np.full(len(features), -np.inf)
    hi = np.full(len(features), np.inf)
    if held:
        try:
            a, b = column_bounds(dp, features, held=held)
        except (ValueError, TypeError) as exc:
            return str(exc)
        mask = np.isin(features, held)
        lo, hi = np.where(mask, a, lo), np.where(mask, b, hi)
    sketched = site.state.get("gbdt_dp_sketch") or {}
    public: list[Any] = []
    allowed: list[Any] = []
    for i, f in enumerate(features):
        if f in held:
            public.append(public_grid([lo[i]], [hi[i]], max_bins)[0])
            allowed.append(None)
            continue
        grid = sketched.get(f)
        if grid is None:
            return (f"under differential privacy the bin grid of column {f!r} must come from public bounds or a DP "
                    "sketch this site answered, and it has neither")
        public.append(None)
        allowed.append(fine_grid(grid[0], grid[1], int(grid[2])))
    return (lo, hi), public, allowed


def _gbdt_start(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A run whose every level this site would refuse (:func:`_gbdt_refused_run`), the setup
    checks, the class labels (:func:`_gbdt_classes`), then the grid (:func:`_gbdt_grid`, charged last)."""
    return (_gbdt_refused_run(policy, request) or _gbdt_setup(policy, site, request)
            or _gbdt_classes(policy, site, request) or _gbdt_grid(policy, site, request))


def _gbdt_refused_run(policy: DisclosurePolicy, request: "Message") -> str | None:
    """Refusal of a boosting run's setup (``gbdt_sketch``, ``gbdt_start``) when the site would
    refuse every ``gbdt_level`` of that run, else ``None``: a run's mode is chosen once, so a
    setup request in the clear (no secure-aggregation meta, no DP release) belongs to a plain
    run, whose tree-node histograms this site answers only with ``allow_server_row_sets``
    (:func:`_gbdt_level`). Refusing at the first summed exchange spares the sketch, the binning and
    the start of a run that cannot grow a tree. It protects nothing by itself (the level's own
    check does) and changes no state."""
    if server_row_set_refusal(policy, request, GBDT_ROW_SETS) is None:
        return None
    return (f"this site refuses the {request.kind!r} of a plain boosting run: it answers tree-node histograms "
            "(gbdt_level) only inside a secure sum or with differential privacy (allow_server_row_sets is off)")


def _gbdt_setup(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """The agreed columns; for ``gbdt_start`` also the boosting parameters within the caps
    (``max_param`` and the compute caps, as any server-chosen model)."""
    reason = _check_features(site, request.meta.get("features"))
    params = request.meta.get("params")
    if reason is None and request.kind == "gbdt_start" and isinstance(params, Mapping):
        features = request.meta.get("features")
        classes = request.meta.get("classes")
        spec = {"name": "gbdt", "params": {k: v for k, v in params.items() if k not in ("objective", "n_classes")}}
        reason = _check_model(policy, site, spec, features if isinstance(features, list) else site.feature_names,
                              classes if isinstance(classes, list) else ["0", "1"], "train", 1)
    return reason


#: what a GBDT level or importance request computes over, in its refusal
GBDT_ROW_SETS = "tree nodes under the server's splits and bin edges"


def _gbdt_level(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A level that asks for histograms (or validation loss sums of the server's trees) is
    computed over row sets the server chooses: plain only with ``allow_server_row_sets``
    (:func:`server_row_set_refusal`). A level with neither (the closing one that only
    delivers leaf values) releases nothing. A round's first level counts every tree it grows
    (one per class of a multiclass model) as one round of the run (at most ``max_rounds``),
    charged only once the request passed every other check."""
    nodes = request.arrays.get("nodes")
    asks_nodes = nodes is not None and bool(np.size(nodes))
    if asks_nodes or request.meta.get("validate"):
        reason = server_row_set_refusal(policy, request, GBDT_ROW_SETS)
        if reason is not None:
            return reason
    if request.meta.get("level") == 0 and asks_nodes:
        trees = np.unique(np.asarray(nodes).reshape(-1, 2)[:, 0]).size if np.ndim(nodes) else 1
        return _charge_run(policy, site, "gbdt_round", "boosting trees", n=max(int(trees), 1))
    return None


def _gbdt_importance(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """Per-site split gains are sums over the nodes of the server's splits: a plain release
    only with ``allow_server_row_sets`` (the handler answers once per boosting run)."""
    return server_row_set_refusal(policy, request, GBDT_ROW_SETS)


def _gbdt_evaluate(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """A server-sent tree model scored on a part (``gbdt_evaluate``, ``gbdt_score``): the score
    bins; the model is counted by :func:`charge_models` (the kind declares ``models``)."""
    return _score_bins(policy, request)


# ------------------------------------------------------------- evaluations of server-sent models
#: distinct server-sent models a site scores in the clear on one part per run, beyond the
#: models it trained in the run (``fit`` rounds, boosting trees, selection chains' rounds): an
#: honest run scores at most one model per round (a selection run each chain it trained), plus
#: its final one (and tuning one per candidate's ``rounds``)
PLAIN_MODELS_EXTRA = 3
#: what an evaluation of a server-sent model computes over, in its refusal
SERVER_MODEL_ROW_SETS = "the rows a model of the server's picks out (a step-function model sweeps thresholds)"
#: part aliases (as ``fedtab.federation.site.parts.canonical_part``): one part counts under one name
_PART_ALIASES = {"validation": "fold:0", "fit": "fit:0"}
#: ledger keys (per run) of the models a site trained: each lets one more distinct model through
TRAINED_KEYS = ("fit", "gbdt_round")
#: ledger key (per run) of the selection chains a site trained: each lets one more distinct model
#: through only in ``select_evaluate`` (the chains' own scoring), never in another kind's count, so
#: chains a server sends buy no allowance to score its crafted models elsewhere
CHAIN_KEY = "select_chains"


@dataclass(frozen=True)
class Evaluations:
    """The server-sent models one request asks a site to score, as a message kind's ``models``
    declaration extracts them (``fedtab.federation.protocol.kinds.MessageKind.models``).

    Attributes:
        models: ``(part, digest)`` per model the reply evaluates, in request order: the part it
            is scored on and a hash naming the model (:func:`model_digest`); the same model twice
            has the same digest.
        work: the request's compute on the site's rows (:class:`fedtab.learn.models.Cost`), held
            to ``max_work`` / ``max_size``; ``None``: scoring only (one pass per model).
    """

    models: tuple[tuple[str, str], ...]
    work: Any = None


def model_digest(request: "Message") -> str:
    """SHA-256 of a request's model arrays (``param:*``: names, dtypes, shapes, bytes): the
    ledger's name of a server-sent model."""
    return _digest((name, request.arrays[name]) for name in sorted(k for k in request.arrays
                                                                      if k.startswith("param:")))


def _digest(named: Any) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, value in named:
        a = np.ascontiguousarray(value)
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _part_name(part: Any) -> str:
    return _PART_ALIASES.get(str(part), str(part))


def one_model(site: "Site", request: "Message") -> Evaluations:
    """The ``models`` declaration of a kind that scores the one model its ``param:*`` arrays hold
    on the part ``meta["part"]`` names (default ``test``): ``evaluate``, ``gbdt_evaluate``..."""
    return Evaluations(((_part_name(request.meta.get("part") or "test"), model_digest(request)),))


def plain_model_cap(site: "Site", kind: str | None = None) -> int:
    """Distinct server-sent models ``site`` scores in the clear per part in its current run for a
    request of ``kind``: the models it trained in the run (:data:`TRAINED_KEYS`; for
    ``select_evaluate`` also its selection chains, :data:`CHAIN_KEY`) + :data:`PLAIN_MODELS_EXTRA`."""
    run = getattr(site, "run_id", "local")
    keys = TRAINED_KEYS + ((CHAIN_KEY,) if kind == "select_evaluate" else ())
    return sum(site.ledger.run_count(run, key) for key in keys) + PLAIN_MODELS_EXTRA


def charge_models(policy: DisclosurePolicy, site: "Site", request: "Message", evaluations: Evaluations
                  ) -> str | None:
    """The one count of the evaluations of server-sent models (every kind that declares
    ``models``), all or nothing:

    * at most ``max_models_per_request`` models in one request (beyond: a request over row sets
      the server chooses, :func:`server_row_set_refusal`);
    * the request's work within ``max_work`` / ``max_size``;
    * every model one evaluation of its part (``max_evaluations`` per part per run);
    * in the clear, at most :func:`plain_model_cap` distinct models per part per run (the same
      model again is free); inside a secure sum, with DP or with ``allow_server_row_sets``
      the distinct count does not apply.

    The ledger records the evaluations and the new models only when every rule passes
    (:meth:`fedtab.privacy.ledger.SiteLedger.charge_evaluations`)."""
    models = evaluations.models
    reason = _models_per_request(policy, request, len(models), "models to evaluate")
    if reason is None and evaluations.work is not None:
        reason = evaluations.work.refusal(policy.max_work, policy.max_size, "model", "the evaluated models")
    if reason is not None:
        return reason
    counts: dict[str, int] = {}
    by_part: dict[str, list[str]] = {}
    for part, digest in models:
        part = _part_name(part)
        counts[part] = counts.get(part, 0) + 1
        by_part.setdefault(part, []).append(digest)
    plain = server_row_set_refusal(policy, request, SERVER_MODEL_ROW_SETS)
    reason = site.ledger.charge_evaluations(
        getattr(site, "run_id", "local"), counts, policy.max_evaluations, models=by_part,
        model_cap=None if plain is None else plain_model_cap(site, request.kind),
        model_cap_name="the run's trained models + PLAIN_MODELS_EXTRA")
    if reason is not None and plain is not None and reason.startswith("models evaluated"):
        return f"{plain} past its cap ({reason})"
    return reason


def _select_prepare(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """Model selection's fold ballots (:mod:`fedtab.federation.workflows.selection`): as a ballot, the
    selector (the server's or the site's own) run once per fold and once on ``train``."""
    runs = 1 + sum(1 for part in site.part_sizes() if part.startswith("fold:"))
    return _check_selector(policy, request.meta.get("selector"), site, "train", runs)


#: ``Site.state`` key of the selection chains' setup (written by the ``select_fit`` handler)
_SELECT_SETUP = "select_setup"


def _bounded(policy: DisclosurePolicy, name: str, a: Any, shape: tuple[int, ...]) -> str | None:
    """``a`` a finite number array of ``shape`` with every ``|entry| <= max_model_abs``, else why not."""
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        return f"{name} is not a number array"
    if arr.shape != shape:
        return f"{name} has shape {arr.shape}, the chains need {shape}"
    if arr.size and not (np.isfinite(arr).all() and np.abs(arr).max() <= policy.max_model_abs):
        return f"{name} is not finite or beyond the site's bound max_model_abs={policy.max_model_abs:g}"
    return None


def _selection_setup(policy: DisclosurePolicy, site: "Site", request: "Message"
                     ) -> tuple[str | None, dict[str, Any] | None]:
    """``(refusal, shapes)`` of the chains a ``select_fit`` / ``select_evaluate`` request is
    about: its own setup (checked: shapes, indices, finite means, ``0 < std``, L2 within
    ``max_param``, every entry within ``max_model_abs``) or the one the site stored;
    ``shapes`` = ``{"M", "k", "d", "C", "fold", "features", "classes", "model"}`` or ``None``
    when there is none yet (the handler reports that)."""
    setup = request.meta.get("setup")
    if isinstance(setup, dict):
        features, classes = setup.get("features"), setup.get("classes")
        model = setup.get("model")
        linear = isinstance(model, dict) and model.get("name") == "linear"  # a regression: no classes
        if not isinstance(features, list) or not isinstance(classes, list) or len(classes) < (0 if linear else 2):
            return None, None  # the handler reports the malformed setup
        a = request.arrays
        if any(k not in a for k in ("setup:masks", "setup:chain_mask", "setup:chain_fold", "setup:mean",
                                    "setup:std", "setup:chain_l2")):
            return None, None
        d, M = len(features), int(np.size(a["setup:chain_mask"]))
        masks = np.asarray(a["setup:masks"])
        chain_mask = np.asarray(a["setup:chain_mask"])
        fold = np.asarray(a["setup:chain_fold"])
        if masks.ndim != 2 or masks.shape[1] != d or chain_mask.shape != (M,) or fold.shape != (M,) \
                or chain_mask.dtype.kind not in "iu" or fold.dtype.kind not in "iu" \
                or (M and (chain_mask.min() < 0 or chain_mask.max() >= len(masks) or fold.min() < -1)):
            return "the selection setup's masks, chain masks and folds do not fit its features", None
        without = setup.get("without")
        if not isinstance(without, list) or len(without) != M:
            return "the selection setup names no left-out site for every chain", None
        reason = _bounded(policy, "the chains' means", a["setup:mean"], (M, d)) or \
            _bounded(policy, "the chains' stds", a["setup:std"], (M, d))
        if reason is None and not (np.asarray(a["setup:std"], np.float64) > 1e-12).all():
            reason = "the chains' stds must be above 1e-12"
        l2 = np.asarray(a["setup:chain_l2"], dtype=np.float64) if np.size(a["setup:chain_l2"]) == M else None
        if reason is None and (l2 is None or not (np.isfinite(l2).all() and (l2 >= 0).all()
                                                  and (l2 <= policy.max_param).all())):
            reason = f"the chains' L2 strengths must be finite, non-negative and at most max_param={policy.max_param:g}"
        if reason is not None:
            return reason, None
    else:
        stored = site.state.get(_SELECT_SETUP)
        if not isinstance(stored, dict):
            return None, None
        features, classes, model = stored["features"], stored["classes"], stored["model"]
        d, M, fold = len(features), len(stored["chain_mask"]), np.asarray(stored["chain_fold"])
    C = len(classes)
    return None, {"M": M, "k": 1 if C <= 2 else C, "d": d, "C": C, "fold": fold, "features": features,
                  "classes": classes, "model": model}


def _chain_params(policy: DisclosurePolicy, request: "Message", shapes: Mapping[str, Any]) -> str | None:
    """The chains' parameters: ``param:coef`` ``(M, k, d)`` and ``param:intercept`` ``(M, k)``, bounded."""
    M, k, d = shapes["M"], shapes["k"], shapes["d"]
    for name, shape in (("param:coef", (M, k, d)), ("param:intercept", (M, k))):
        if name not in request.arrays:
            return f"the request carries no {name}"
        reason = _bounded(policy, f"model parameter {name!r}", request.arrays[name], shape)
        if reason is not None:
            return reason
    return None


def _models_per_request(policy: DisclosurePolicy, request: "Message", n: int, what: str) -> str | None:
    """More than ``max_models_per_request`` models in one request: a set of row sets the server
    chooses (a crafted model per threshold reads values off counts), answered only as such."""
    if n <= policy.max_models_per_request:
        return None
    return server_row_set_refusal(policy, request, f"{n} {what} (more than max_models_per_request="
                                                   f"{policy.max_models_per_request})")


def _models_cost(site: "Site", shapes: Mapping[str, Any], fits: float) -> Any:
    """The cost of ``fits`` local fits (chains × epochs) of the agreed model on the training rows
    (``None``: a model that cannot be built; the handler reports it)."""
    from ..learn.models import model_cost

    try:
        one = model_cost(shapes["model"], shapes["d"], max(shapes["C"], 2), _rows_of(site, "train"), 1)
    except (ValueError, TypeError, KeyError):
        return None
    return _times(one, max(int(fits), 1))


def _models_work(policy: DisclosurePolicy, site: "Site", shapes: Mapping[str, Any], fits: float) -> str | None:
    """``fits`` local fits (chains × epochs) of the agreed model on the training rows within ``max_work``."""
    cost = _models_cost(site, shapes, fits)
    return None if cost is None else cost.refusal(policy.max_work, policy.max_size, "model", shapes["model"])


def _select_fit(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """One round of every selection chain: the agreed columns, a bounded setup and bounded,
    well-shaped parameters, at most ``max_models_per_request`` chains (else only as a request
    over server-chosen row sets), every chain's local fit within ``max_work``, epochs capped,
    one fit round of the run."""
    setup = request.meta.get("setup")
    reason = _check_features(site, setup.get("features")) if isinstance(setup, dict) else None
    reason = reason or _epochs(policy, request.meta.get("epochs"))
    if reason is None and isinstance(setup, dict):
        reason = _check_model(policy, site, setup.get("model"), setup.get("features"), setup.get("classes"), "train",
                              request.meta.get("epochs", 1))
    if reason is not None:
        return reason
    reason, shapes = _selection_setup(policy, site, request)
    if reason is None and shapes is not None:
        epochs = request.meta.get("epochs", 1)
        epochs = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else 1
        reason = (_chain_params(policy, request, shapes)
                  or _models_per_request(policy, request, shapes["M"], "selection chains")
                  or _models_work(policy, site, shapes, shapes["M"] * epochs))
    reason = reason or _charge_run(policy, site, "fit", "fit rounds")
    if reason is None and shapes is not None and isinstance(setup, dict):  # new chains: a setup of its own
        reason = _charge_chains(policy, site, setup, shapes)
    return reason


def _charge_chains(policy: DisclosurePolicy, site: "Site", setup: Any, shapes: Mapping[str, Any]) -> str | None:
    """Every chain a ``select_fit`` request sets up here is one evaluation of the part it trains on
    (``fit:k``, ``train`` for the refit and for folds the site lacks; ``max_evaluations`` per part per
    run: a chain's update is the server's model answered over those rows) and one trained model
    (:data:`CHAIN_KEY`, counted only by ``select_evaluate``'s distinct models), once: the request
    that carries the chains' setup. Its later rounds (the stored setup) are fit rounds of the same
    chains, each charged as one of ``max_rounds`` with its work (:func:`_models_work`): an honest
    cross-validation runs several rounds of a few hundred chains within the default caps."""
    without = setup.get("without")
    name, n_folds = getattr(site, "name", None), site.parts.n_folds
    counts: dict[str, int] = {}
    for w, fold in zip(without, np.asarray(shapes["fold"]).tolist()):
        if w != name:
            part = _part_name(f"fit:{fold}" if 0 <= int(fold) < n_folds else "train")
            counts[part] = counts.get(part, 0) + 1
    run = getattr(site, "run_id", "local")
    reason = site.ledger.charge_evaluations(run, counts, policy.max_evaluations) if counts else None
    if reason is None and counts:
        reason = site.ledger.charge_run(run, CHAIN_KEY, 2 ** 62, "selection chains", n=sum(counts.values()))
    return reason


def _select_evaluate(policy: DisclosurePolicy, site: "Site", request: "Message") -> str | None:
    """Every selection slot's evaluation sums: bounded epochs and score bins, bounded,
    well-shaped models. The slots are counted by :func:`charge_models` (the kind declares
    ``models``: :func:`selection_models`): one evaluation per slot of the part it is scored on,
    at most ``max_models_per_request``, the distinct models per part, the personalisations'
    fits within ``max_work``."""
    personal = request.meta.get("personal")
    epochs = personal.get("epochs") if isinstance(personal, dict) else None
    reason = _score_bins(policy, request) or _epochs(policy, epochs)
    if reason is None and isinstance(personal, dict):
        reason = _epochs(policy, personal.get("local_epochs"))
    if reason is not None:
        return reason
    reason, shapes = _selection_setup(policy, site, request)
    slots = request.meta.get("slots")
    if reason is not None or shapes is None or not isinstance(slots, list):
        return reason  # no setup or no slot list: the handler reports it
    return _chain_params(policy, request, shapes)


def selection_models(site: "Site", request: "Message") -> Evaluations | None:
    """The ``models`` declaration of ``select_evaluate``: one model per slot the site scores (its
    chain's ``fold:k`` the site has, or the test rows for the test stage), named by the chain's
    parameters, standardisation, mask and L2 strength (a personalisation is the site's own
    procedure on that model); the work of the personalisations' fits and of the scoring.
    ``None`` when there is no setup or slot list (the handler reports it)."""
    stored = site.state.get(_SELECT_SETUP)
    slots = request.meta.get("slots")
    _, shapes = _selection_setup(DisclosurePolicy(), site, request)
    if not isinstance(stored, dict) or shapes is None or not isinstance(slots, list):
        return None
    stage = "test" if request.meta.get("stage") == "test" else "cv"
    coef, intercept = request.arrays.get("param:coef"), request.arrays.get("param:intercept")
    models = []
    for s in slots:
        if not (isinstance(s, list) and len(s) == 2 and isinstance(s[0], int) and 0 <= s[0] < shapes["M"]):
            continue  # the handler refuses a malformed slot
        m = int(s[0])
        fold = int(shapes["fold"][m])
        part = "test" if stage == "test" else f"fold:{fold}"
        if stage != "test" and (fold < 0 or not _rows_of(site, part)):
            continue  # a chain without held-out rows here is not scored
        mask = np.asarray(stored["masks"])[int(np.asarray(stored["chain_mask"])[m])]
        models.append((part, _digest([("coef", np.asarray(coef)[m]), ("intercept", np.asarray(intercept)[m]),
                                      ("mask", mask), ("mean", np.asarray(stored["mean"])[m]),
                                      ("std", np.asarray(stored["std"])[m]), ("l2", np.asarray(stored["l2"])[m])])))
    personal = request.meta.get("personal")
    epochs = personal.get("epochs") if isinstance(personal, dict) else None
    n_epochs = max(e for e in (epochs, personal.get("local_epochs") if isinstance(personal, dict) else None, 50)
                   if isinstance(e, int) and not isinstance(e, bool))
    personalised = sum(1 for s in slots if isinstance(s, list) and len(s) == 2 and s[1] != "none")
    return Evaluations(tuple(models), _models_cost(site, shapes, personalised * n_epochs + len(slots)))


def _secure_terms(policy: DisclosurePolicy, site: "Site", request: "Message", kind: "KindTerms | None" = None
                  ) -> str | None:
    """The site's terms for sums: a masking request must pass the secure-aggregation checks
    (verified peers, ``min_peers``, a majority threshold; :func:`fedtab.privacy.secagg.masking_refusal`);
    with ``require_secure_aggregation`` / ``require_dp`` a request for quantities the server
    needs only summed (``kind.is_summed(request)``, from the kind's declaration) must arrive
    masked / with DP settings. Per-site kinds (ballots, schema, profile, local baselines) are
    not summed: the require flags leave them to their own rules."""
    from .dp import DP_META
    from .secagg import SECAGG_META, masking_refusal

    if SECAGG_META in request.meta:
        reason = masking_refusal(site, request, policy.min_peers)
        if reason is not None:
            return reason
    summed = kind is not None and kind.is_summed(request)
    if (policy.require_secure_aggregation or policy.require_dp) and summed:
        if policy.require_secure_aggregation and SECAGG_META not in request.meta:
            return f"this site answers {request.kind!r} only with secure aggregation (require_secure_aggregation)"
        if policy.require_dp and not isinstance(request.meta.get(DP_META), dict):
            return f"this site answers {request.kind!r} only with differential privacy (require_dp)"
    return None



