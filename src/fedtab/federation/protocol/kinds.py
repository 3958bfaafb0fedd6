"""The message-kind registry: every kind a site answers is declared here, once.

A :class:`MessageKind` holds everything about one kind's release: the module whose
``@handler`` answers it (:attr:`MessageKind.home`), what its reply may carry and over which
part (:class:`~fedtab.privacy.gate.Releases`, which also says how differential privacy
applies), whether the server needs its numbers only as sums (and which arrays are
summable), the policy check that limits it, whether the server chooses the rows behind its
numbers, the words that describe it to the report's reader and its progress step. Every
other table is derived from these declarations:

* the handler homes (:func:`home_of`, ``fedtab.federation.site.registry.HANDLER_HOMES``): a Flower
  ClientApp imports only the module a request needs;
* the release gate's declarations (``fedtab.federation.site.registry.RELEASES``);
* the policy checks and the require flags (``Site.handle`` passes the declaration to
  :meth:`fedtab.privacy.policy.DisclosurePolicy.refusal`);
* the secure-aggregation kinds (:func:`summed_kinds`, :meth:`MessageKind.is_summed`) and the
  arrays a masked reply must mask (:meth:`MessageKind.summable`);
* the report's disclosure table (:mod:`fedtab.report.disclosure`) and the progress kinds
  (:mod:`fedtab.engines.progress`).

A workflow module registers its handler against a declared kind
(``@handler("fit")``); registering a kind that is not declared raises. This module imports
only :mod:`fedtab.privacy` and numpy (never a workflow module at import time): the
declaration of every kind is readable without importing what answers it. A part or DP
release count that only the handler's module can compute is named here
(:func:`_in_home`) and resolved when a request is answered, after that module is imported.

**Summed and per-site kinds.** A kind is *summed* when the server needs its numbers only as
a total over the sites (moments, model updates, gradient histograms, evaluation and score
sums). A site whose policy sets ``require_secure_aggregation`` (``require_dp``) refuses a
summed request unless it arrives with secure masking (with DP settings); a summed kind
without a DP release is then always refused under ``require_dp``. A request that carries
secure-aggregation meta must mask every summable array its reply holds, or the site
refuses it. The *per-site* kinds are releases of one site by design and are answered under
their own rules (the gate's floors, suppression, coarse ranges), whatever the require flags
say: ``schema``, ``job_profile``, ``column_roles``, ``category_sets``, ``one_hot``,
``ballot``, ``ballot_fit``, ``local_baseline``, ``gbdt_summary`` (class labels only), the acknowledgements
(``setup``, ``impute_setup``, ``impute_apply``) and the secure-aggregation protocol's own
messages.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from fedtab.privacy import policy as _policy
from fedtab.privacy.dp import DP_META
from fedtab.privacy.gate import CATEGORIES, COUNT, FLAG, LABELS, NAMES, NUMBER, SMOOTHED, STRUCT, TEXT, Releases

__all__ = ["MessageKind", "Progress", "KINDS", "TABLE_STEP_HOMES", "declare", "declare_table_step", "forget",
           "declared", "home_of", "summed_kinds", "server_row_set_kinds", "evaluating_kinds", "SUMMARY_PHRASES"]

Check = Callable[[Any, Any, Any], "str | None"]


@dataclass(frozen=True)
class Progress:
    """A kind that is the rounds of a job step: ``step`` (the step's name in progress lines)
    and ``rounds``, the dotted attribute path of the step's round count on the
    :class:`~fedtab.job.spec.JobSpec` (``"training.rounds"``; a missing section counts 0)."""

    step: str
    rounds: str

    def rounds_of(self, spec: Any) -> int:
        value = spec
        for name in self.rounds.split("."):
            value = getattr(value, name, None)
            if value is None:
                return 0
        return int(value)


@dataclass(frozen=True)
class MessageKind:
    """One message kind, declared once (see the module docstring).

    Attributes:
        name: the request's ``kind``.
        home: the module whose ``@handler(name)`` answers it (imported on demand).
        releases: what a reply may carry, over which part, and how DP applies (``dp``,
            ``dp_releases``): :class:`~fedtab.privacy.gate.Releases`.
        description: what one site's reply holds, in plain words, for the report's reader
            (``{floor}``, ``{floor_th}``, ``{ranges}``, ``{categories}`` are filled from the run).
        description_dp: the same under differential privacy, when it differs.
        summed: the server needs the reply's numbers only as sums over the sites.
        summed_when: ``meta -> bool``: only requests with this meta are summed (``None``: all).
        per_site: arrays of a summed kind that are per-site releases by design (not summable).
        masked_in_secure_runs: the workflows sum it through the run's summing strategy, so a
            secure run sends it masked (default: ``summed``). The report says "masked" from it.
        check: the policy check that limits it (a function of :mod:`fedtab.privacy.policy`,
            ``(policy, site, request) -> refusal or None``), run after the checks every
            request passes.
        server_row_set: the server chooses the rows behind its numbers (tree nodes under its
            splits or bin edges, its selection chains, the rows a model it sent picks out):
            differencing two answers can isolate rows, which is what
            ``DisclosurePolicy.allow_server_row_sets`` and
            :func:`fedtab.privacy.policy.server_row_set_refusal` are about. Documentation
            here; each workflow's check enforces it.
        summary: the phrases (:data:`SUMMARY_PHRASES`) the report's header uses for it.
        progress: the job step whose rounds it is (:class:`Progress`), or ``None``.
        rows: the rows behind its numbers in plain words, for docs/privacy.md's generated
            guarantees (:func:`fedtab.report.guarantees.guarantee_table`), when
            ``releases.part`` is computed by the handler's module (``None``: read from the part).
        models: for a kind whose reply is an evaluation of server-sent models, how to read them
            from a request: ``(site, request) -> Evaluations | None`` (a function of
            :mod:`fedtab.privacy.policy`: the part each model is scored on, a digest naming it,
            the work). Every such kind is counted by the one ledger function
            :func:`fedtab.privacy.policy.charge_models` after its ``check``: one evaluation per
            model, at most ``max_models_per_request`` per request and, in the clear,
            :func:`~fedtab.privacy.policy.plain_model_cap` distinct models per part per run.
        plain_bound: for a ``server_row_set`` kind, the :class:`~fedtab.privacy.policy.DisclosurePolicy`
            setting that bounds a plain answer: ``"allow_server_row_sets"`` (refused in the clear
            unless the site opts in), ``"max_evaluations"`` (each request one evaluation of the part,
            per run) or ``"max_rounds"`` (each request one round, per run); ``None`` otherwise.
        mods: ``((mode, mod), ...)``: the site-side wrappers of its handler under a mode
            (:mod:`fedtab.federation.site.mods`; e.g. ``("dp", the DP release)``), applied by
            ``Site.handle`` to a request in that mode, the first listed outermost.
        packed: its messages' arrays travel losslessly packed
            (:data:`fedtab.federation.protocol.messages.PACKED_KINDS`): for kinds whose replies are
            bytes-bound at scale (a ballot's scores at 10,000 columns, column sums), not for kinds
            sent hundreds of times per run whose CPU matters more (GBDT levels: 20 % of a run).
    """

    name: str
    home: str
    releases: Releases
    description: str
    description_dp: str | None = None
    summed: bool = False
    summed_when: Callable[[Mapping[str, Any]], bool] | None = None
    per_site: tuple[str, ...] = ()
    masked_in_secure_runs: bool | None = None
    check: Check | None = None
    server_row_set: bool = False
    summary: tuple[str, ...] = ()
    progress: Progress | None = None
    rows: str | None = None
    plain_bound: str | None = None
    models: Callable[[Any, Any], Any] | None = None
    mods: tuple[tuple[str, Callable[..., Any]], ...] = ()
    packed: bool = False

    def __post_init__(self) -> None:
        unknown = [p for p in self.summary if p not in SUMMARY_PHRASES]
        if unknown:
            raise ValueError(f"message kind {self.name!r}: unknown summary phrase(s) {unknown}")
        if self.per_site and not self.summed:
            raise ValueError(f"message kind {self.name!r}: per_site arrays are for summed kinds only")
        if self.models is not None and not self.server_row_set:
            raise ValueError(f"message kind {self.name!r}: an evaluation of server-sent models is over rows the "
                             "server chooses (server_row_set=True)")

    @property
    def secure(self) -> bool:
        """Whether a secure run sends it masked (:attr:`masked_in_secure_runs`, default ``summed``)."""
        return self.summed if self.masked_in_secure_runs is None else self.masked_in_secure_runs

    def is_summed(self, request: Any) -> bool:
        """Whether ``request`` (of this kind) asks for numbers the server needs only summed."""
        return self.summed and (self.summed_when is None or bool(self.summed_when(request.meta)))

    def summable(self, array: str) -> bool:
        """Whether a reply array called ``array`` is a number the server needs only summed: one
        of the declaration's counts, sums, histograms, aggregates or model parameters, not a
        per-site array, of a summed kind."""
        if not self.summed or array in self.per_site or array in self.releases.keys:
            return False
        return self.releases.declared(array)


#: the phrases of the report's one-sentence summary of what left the sites, in its order
#: (``{histograms}`` is filled with ``" and score histograms"`` unless the run used DP)
SUMMARY_PHRASES: tuple[str, ...] = (
    "per-column counts, sums and sums of squares",
    "pairwise correlation statistics",
    "each site's ballot (chosen columns and their scores)",
    "quantile summaries of feature values",
    "gradient histograms",
    "each site's split gains per feature",
    "model parameters after each round",
    "confusion matrices{histograms} of the test rows",
    "each site's local-only model scores",
)
_MOMENTS, _PAIRS, _BALLOTS, _QUANTILES, _GRADIENTS, _GAINS, _MODELS, _EVALUATIONS, _BASELINES = SUMMARY_PHRASES

#: kind -> declaration; filled by :func:`declare` (below for fedtab's own kinds)
KINDS: dict[str, MessageKind] = {}
#: table-step name -> the module whose ``@table_step`` registers it
TABLE_STEP_HOMES: dict[str, str] = {}


def declare(kind: MessageKind) -> MessageKind:
    """Add ``kind`` to the registry and return it.

    Raises:
        ValueError: another declaration of the same name exists.
    """
    old = KINDS.get(kind.name)
    if old is not None and old != kind:
        raise ValueError(f"message kind {kind.name!r} is already declared")
    KINDS[kind.name] = kind
    if kind.packed:
        from .messages import PACKED_KINDS

        PACKED_KINDS.add(kind.name)
    return kind


def declare_table_step(name: str, home: str) -> None:
    """Declare the table step ``name`` (``Site.apply_table_step``), registered by module ``home``.

    Raises:
        ValueError: declared before with another home.
    """
    if TABLE_STEP_HOMES.get(name, home) != home:
        raise ValueError(f"table step {name!r} is already declared in {TABLE_STEP_HOMES[name]}")
    TABLE_STEP_HOMES[name] = home


def forget(name: str) -> None:
    """Remove the declaration of ``name`` (a test's toy kind); unknown names are ignored."""
    KINDS.pop(name, None)


def declared(name: str) -> MessageKind | None:
    """The declaration of ``name``, or ``None``."""
    return KINDS.get(name)


def home_of(name: str) -> str | None:
    """The module that registers the handler or table step ``name`` (``None``: not declared)."""
    kind = KINDS.get(name)
    return kind.home if kind is not None else TABLE_STEP_HOMES.get(name)


def summed_kinds() -> frozenset[str]:
    """The kinds whose numbers the server needs only summed (the require flags cover them)."""
    return frozenset(k.name for k in KINDS.values() if k.summed)


def server_row_set_kinds() -> frozenset[str]:
    """The kinds over rows the server chooses (:attr:`MessageKind.server_row_set`)."""
    return frozenset(k.name for k in KINDS.values() if k.server_row_set)


def evaluating_kinds() -> frozenset[str]:
    """The kinds whose reply is an evaluation of server-sent models (:attr:`MessageKind.models`)."""
    return frozenset(k.name for k in KINDS.values() if k.models is not None)


def _in_home(module: str, name: str) -> Callable[..., Any]:
    """A call of ``module.name`` made when the declaration is used (answering a request, after
    the handler's module is imported), so that declaring it imports nothing."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


# ------------------------------------------------------------------------------------ declarations
_F = "fedtab.federation"
_TRAINING, _GBDT, _IMPUTE, _SELECT = f"{_F}.workflows.training.site", f"{_F}.workflows.gbdt.site", f"{_F}.workflows.imputation.site", \
    f"{_F}.workflows.selection.site"

_MOMENT_META = {"classes": LABELS, "n_train": COUNT, "n_test": COUNT, "features": NAMES}
# a ballot names no column: packed mask bits and scores over the declared columns (or the subset
# ``column_index`` gives by position), with the hash of that declared list (``schema:hash``)
_BALLOT = Releases(part="=train", aggregates=("mask", "scores", "pvalues", "column_index"),
                   meta={"n_features": COUNT, "schema:hash": TEXT, "n_samples": COUNT, "selector": TEXT,
                         "n_effective": NUMBER, "abstain": TEXT}, dp=("mask", "scores"), dp_releases=1)
#: the DP parameter mod of a handler that noises inside its own algorithm (``noise``: the DP settings)
_DP_NOISE_PARAM = _in_home(f"{_F}.site.mods", "dp_noise_param")
#: the secure-sums parameter mod (``masked``: the handler adds no per-site number beside its masked sums)
_SECURE_MASKED_PARAM = _in_home(f"{_F}.site.mods", "secure_masked_param")
#: the ballot's DP release mod: the noisy ballot of the selector's scores (both ballot kinds declare DP releases)
_DP_BALLOT = _in_home(f"{_F}.workflows.election.site", "dp_ballot")
_EVALUATE = Releases(part="part", default_part="test", per_class=True,
                     aggregates=("confusion", "brier_sum", "rank_pairs"), histograms=("score_hist",),
                     meta={"n": COUNT, SMOOTHED: FLAG}, dp=True,
                     dp_releases=lambda r: 2 if r.meta.get("score_bins") is not None else 1)
#: the evaluation sums as the site releases them under DP (Δ per array; the site adds the noise
#: after the handler): a replaced row moves one count between cells (Δ = √2) and its Brier term by ≤ 2
# under DP an evaluation releases its confusion matrix only (one replaced row moves one count between two
# cells: Δ = √2); a request that asks for score sums as well gets an error reply, nothing else leaves (a
# rank-pair count moves by up to the other class's size, no Δ of √2 bounds it)
_EVALUATE_NOISED = replace(_EVALUATE, dp_noise={"confusion": math.sqrt(2.0)})
_DP_EVALUATE = "per test part: the confusion matrix (per class) only — no score histogram, Brier sum or rank pairs"
# a boosting run's setup: a site that would refuse every level of a plain run refuses its setup already
_GBDT_PLAIN_SETUP = (" (refused in a plain run by a site that did not opt in to `allow_server_row_sets`: it would "
                     "refuse every `gbdt_level` of it)")




def _impute_fit_releases(request: Any) -> int:
    return _in_home(_IMPUTE, "_dp_steps")(request.meta.get(DP_META) or {})


for _kind in (
    # ----- schema, profile, encoding: per-site by design
    MessageKind("schema", f"{_F}.site.schema", Releases(part=None),
                "column names and kinds (the schema declaration)"),
    MessageKind("job_profile", f"{_F}.steps.profile",
                Releases(part="=all", cells={"observed": ("low", "high")}, aggregates=("integer", "unique"),
                         meta={"columns": NAMES, "kinds": STRUCT, "classes": LABELS, "rows": COUNT,
                               "unlabelled": COUNT, "train": COUNT, "test": COUNT, "selector": TEXT,
                               "levels": CATEGORIES}),
                "column names and kinds, row counts, class labels and, per numeric column, whether it holds only "
                "integers and a coarse min/max range (the {floor_th} smallest and largest values rounded outward "
                "to two significant digits){ranges}; whether a column is unique per row (a yes/no ID "
                "flag); for integer-coded columns with few values, the values held by at least {floor} rows "
                "(what imputation may fill in)"),
    MessageKind("column_roles", f"{_F}.steps.profile", Releases(part=None, meta={"n_columns": COUNT}),
                "the number of columns left after the job's [columns] ignore/categorical (no value)"),
    MessageKind("category_sets", f"{_F}.steps.encoding", Releases(part="=all", meta={"categories": CATEGORIES}),
                "the category lists of categorical columns (categories seen in at least {floor} rows){categories}",
                check=_policy._category_sets),
    MessageKind("one_hot", f"{_F}.steps.encoding", Releases(part=None, meta={"n_columns": COUNT}),
                "an acknowledgement (how many encoded columns)"),
    # ----- election and tuning
    MessageKind("ballot", f"{_F}.workflows.election.site", _BALLOT,
                "a ballot: which columns the site's selector chose, a score (and p-value) per column, the sample "
                "count", check=_policy._ballot, summary=(_BALLOTS,), mods=(("dp", _DP_BALLOT),), packed=True),
    MessageKind("ballot_fit", f"{_F}.workflows.tuning.site", replace(_BALLOT, part="=fit"),
                "a ballot on a tuning part of the training rows (mask and scores per column)",
                check=_policy._ballot, summary=(_BALLOTS,), mods=(("dp", _DP_BALLOT),)),
    MessageKind("set_mask", f"{_F}.workflows.election.site",
                Releases(part="describe", default_part=None, cells={"count": ("sum", "sumsq")},
                         meta={"kept": COUNT, "held": COUNT, "describe": _MOMENT_META}, dp=True,
                         dp_releases=lambda r: 3 if r.meta.get("describe") is not None else 0),
                "per elected column: count, sum and sum of squares over the training rows",
                summed=True, summed_when=lambda meta: meta.get("describe") is not None, check=_policy._describe,
                summary=(_MOMENTS,), mods=(("dp", _in_home(f"{_F}.workflows.election.site", "dp_described")),),
                packed=True),
    MessageKind("class_moments", f"{_F}.workflows.pooled_anova.site",
                Releases(part="part", default_part="train", per_class=True, cells={"count": ("sum", "sumsq")},
                         aggregates=("n_class",), meta={"classes": LABELS, "feature_names": NAMES, "n": COUNT}),
                "per class and column: count, sum and sum of squares", summed=True, masked_in_secure_runs=False,
                check=_policy._describe, summary=(_MOMENTS,)),
    MessageKind("score_sums", f"{_F}.workflows.score_test.site",
                Releases(part=_in_home(f"{_F}.workflows.score_test.site", "_score_part"),
                         aggregates=("grad", "hess", "loglik", "score", "info_diag", "info_cross"),
                         meta={"n": COUNT}),
                "score-test sums (gradient and curvature sums) over the training rows", summed=True,
                check=_policy._score_sums,
                rows="the part the score test's setup named (default `train`)"),
    # ----- training
    MessageKind("describe", f"{_F}.steps.describe",
                Releases(part="part", default_part="train", cells={"count": ("sum", "sumsq")}, meta=_MOMENT_META,
                         dp=True, dp_releases=3),
                "per column: count, sum and sum of squares over the training rows", summed=True,
                check=_policy._describe, summary=(_MOMENTS,), mods=(("dp", _in_home(f"{_F}.steps.describe", "dp_moments")),),
                packed=True),
    MessageKind("setup", _TRAINING, Releases(part=None, meta={"ok": FLAG}), "an acknowledgement",
                check=_policy._training_setup),
    MessageKind("fit", _TRAINING,
                Releases(part=_in_home(_TRAINING, "_fit_part"), model="param:", meta={"n_samples": COUNT}, dp=True,
                         dp_releases=_in_home(_TRAINING, "_fit_releases")),
                "model parameters after local training and the number of training rows (one update per round)",
                summed=True, check=_policy._fit, summary=(_MODELS,), progress=Progress("training", "training.rounds"),
                rows="the part the training setup named (default `train`)", mods=(("dp", _DP_NOISE_PARAM),), packed=True),
    # federated Newton–Raphson (logistic): the server chooses a *model*, the site its rows. Each reply
    # is the log-loss gradient and Hessian summed over the site's whole fixed training part (≥ min_rows
    # rows) at coefficients the server picks. Two replies at two points are sums of the same rows with
    # other smooth weights (the pooled fit needs them at d + 1 points anyway, and then the Hessian and
    # gradient are released in any case); but steep coefficients make the weights p(1 − p) and p − y
    # approach indicators of a half-space the server chose, so crafted points can approximate sums over
    # server-chosen row sets. Hence server_row_set with plain_bound="max_rounds": a plain answer counts
    # as a training round (max_rounds per run); secure sums show only the total; DP noises each reply.
    MessageKind("newton", _TRAINING,
                Releases(part=_in_home(_TRAINING, "_fit_part"), aggregates=("grad", "hess"),
                         meta={"n_samples": COUNT}, dp=True, dp_releases=2),
                "a logistic model's log-loss gradient and Hessian summed over all the training rows at coefficients "
                "the server sent (one Newton–Raphson iteration; counted as a training round)",
                summed=True, check=_policy._fit, server_row_set=True, summary=(_MODELS,),
                progress=Progress("training", "training.rounds"),
                rows="all rows of the part the training setup named (default `train`), weighted by the server's "
                     "coefficients: steep coefficients weight a half-space of them",
                plain_bound="max_rounds", mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("evaluate", f"{_F}.steps.evaluate", _EVALUATE_NOISED,
                "per test part: the confusion matrix (per class), a Brier sum, a histogram of predicted "
                "probabilities per class and a rank-pair count", description_dp=_DP_EVALUATE, summed=True,
                check=_policy._evaluate, server_row_set=True, summary=(_EVALUATIONS,),
                plain_bound="max_evaluations", models=_policy.one_model, mods=(("secure", _SECURE_MASKED_PARAM),)),
    MessageKind("regression_evaluate", f"{_F}.steps.evaluate",
                Releases(part="part", default_part="test", aggregates=("sse", "sae", "sum_y", "sum_y2"),
                         meta={"n": COUNT}),
                "per test part: a regression model's sums of squared and absolute errors and of the target and "
                "its square", summed=True, check=_policy._evaluate, server_row_set=True, summary=(_EVALUATIONS,),
                plain_bound="max_evaluations", models=_policy.one_model),
    MessageKind("local_baseline", f"{_F}.steps.baselines",
                Releases(part="=test", per_class=True, aggregates=("confusion", "brier_sum", "rank_pairs"),
                         histograms=("score_hist",), cells={"train_counts": ()},
                         meta={"n_train": COUNT, SMOOTHED: FLAG}),
                "the test-row scores of the site's own local-only model (confusion matrix, score histogram, "
                "Brier sum, rank pairs) and its training rows per class", check=_policy._local_baseline,
                summary=(_BASELINES,)),
    # ----- imputation
    MessageKind("impute_schema", _IMPUTE,
                Releases(part="=train", cells={"count": ("sum", "sumsq")},
                         meta={"columns": NAMES, "n_train": COUNT, "n_valid": COUNT}, dp=True, dp_releases=3),
                "per column: count, sum and sum of squares over the training rows (the imputer's scaling)",
                summed=True, summed_when=lambda meta: not meta.get("columns_only"), summary=(_MOMENTS,),
                mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("impute_stats", _IMPUTE,
                Releases(part="=train", cells={"count": ("sum", "sumsq"),
                                               "pair_count": ("pair_sx", "pair_sxx", "pair_sxy")},
                         aggregates=("shift",), meta={"columns": NAMES}, dp=True, dp_releases=7),
                "per column pair: co-observed count, sums, sums of squares and cross-products (correlations)",
                summed=True, per_site=("shift",), summary=(_PAIRS,),  # shift: the server's own, echoed
                mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("impute_setup", _IMPUTE, Releases(part=None, meta={"n_train": COUNT, "n_valid": COUNT}),
                "training and validation row counts", check=_policy._impute_setup),
    MessageKind("impute_fit", _IMPUTE,
                Releases(part="=train", model="w/", cells={"val_count": ("val_sse",)},
                         meta={"n_train": COUNT, "loss": NUMBER, "steps": COUNT}, dp=True,
                         dp_releases=_impute_fit_releases),
                "imputer (GNN) weights after local training and validation error sums", summed=True,
                check=_policy._impute_fit, summary=(_MODELS,), progress=Progress("imputation", "impute.rounds"),
                mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("impute_eval", _IMPUTE, Releases(part="=test", cells={"val_count": ("val_sse", "val_mean_sse")}),
                "imputation error sums on held-out test cells", summed=True, check=_policy._impute_eval),
    MessageKind("impute_apply", _IMPUTE, Releases(part="=all", meta={"imputed": COUNT, "clipped": COUNT}),
                "how many cells were imputed and clipped (counts only)"),
    # ----- gradient-boosted trees
    MessageKind("gbdt_summary", _GBDT,
                Releases(part="part", meta={"classes": LABELS, "n": COUNT}),
                "the class labels of the training rows (no value of any column)",
                check=_policy._gbdt_setup),
    MessageKind("gbdt_sketch", _GBDT,
                Releases(part="=train", aggregates=("counts",), dp=("counts",), dp_releases=1,
                         dp_noise={"counts": _in_home(_GBDT, "_sketch_sensitivity")}),
                "per feature: counts of the training rows over a public grid (signed powers of two, then "
                "1024 equal steps inside the agreed range, one such grid per column and period), in runs of at "
                "least {floor} rows; the bin edges are quantiles of the pooled counts" + _GBDT_PLAIN_SETUP,
                description_dp="per feature: counts of the training rows over a public grid (signed powers of two, "
                "then 1024 equal steps inside the noisy range) with Gaussian noise (sensitivity √features per "
                "request, each request charged); the bin edges are quantiles of the pooled noisy counts",
                summed=True, check=_policy._gbdt_sketch, summary=(_QUANTILES,),
                mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("gbdt_start", _GBDT,
                Releases(part=_in_home(_GBDT, "_start_part"), aggregates=("label_sums",), meta={"n": COUNT},
                         dp=True, dp_releases=1),
                "sums of the labels over the training rows" + _GBDT_PLAIN_SETUP, summed=True,
                check=_policy._gbdt_start,
                rows="the part the request names (default `train`)", mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("gbdt_level", _GBDT,
                Releases(part=_in_home(_GBDT, "_level_part"), aggregates=("hist", "hist_nz", "val_loss"),
                         meta={"withheld": COUNT, "n_val": COUNT, "round": COUNT}, dp=True,
                         dp_releases=_in_home(_GBDT, "_level_releases")),
                "gradient and hessian histograms per feature bin for the tree level, a validation loss",
                summed=True, check=_policy._gbdt_level, server_row_set=True, summary=(_GRADIENTS,),
                rows="tree nodes, under the server's splits and bin edges, of the part `gbdt_start` named",
                plain_bound="allow_server_row_sets",
                mods=(("dp", _DP_NOISE_PARAM), ("secure", _SECURE_MASKED_PARAM))),
    MessageKind("gbdt_evaluate", _GBDT, _EVALUATE_NOISED,
                "per test part: the confusion matrix, a Brier sum, a score histogram and a rank-pair count",
                description_dp=_DP_EVALUATE, summed=True, check=_policy._gbdt_evaluate, server_row_set=True,
                summary=(_EVALUATIONS,),
                plain_bound="max_evaluations", models=_policy.one_model, mods=(("secure", _SECURE_MASKED_PARAM),)),
    MessageKind("gbdt_score", _GBDT,
                Releases(part="part", default_part="test", aggregates=("sse", "sae", "sum_y", "sum_y2"),
                         meta={"n": COUNT}, dp=True, dp_releases=1),
                "a sum of squared errors over the test rows (and, without DP, of absolute errors, of the target "
                "and of its square)", summed=True, check=_policy._gbdt_evaluate,
                server_row_set=True,
                plain_bound="max_evaluations", models=_policy.one_model, mods=(("dp", _DP_NOISE_PARAM),)),
    MessageKind("gbdt_importance", _GBDT,
                Releases(part=_in_home(_GBDT, "_level_part"), aggregates=("gain",),
                         meta={"n": COUNT, "suppressed": COUNT}),
                "per feature: the split gain on the site's own training rows, from its record of the splits it "
                "applied (splits with a node or child of fewer than {floor} rows left out)", summed=True,
                masked_in_secure_runs=False, check=_policy._gbdt_importance, server_row_set=True,
                summary=(_GAINS,),
                rows="the nodes of the site's record of the splits it applied, on the part `gbdt_start` named",
                plain_bound="allow_server_row_sets"),
    # ----- model selection (plain sums only: a secure run does not ask these)
    MessageKind("select_prepare", _SELECT,
                Releases(part="=train", aggregates=("ballot_mask", "ballot_scores", "voted"),
                         cells={"measured_count": (), "missing_count": (),
                                "moment_count": ("moment_sum", "moment_sumsq")},
                         meta={"feature_names": NAMES, "columns": NAMES, "n_folds": COUNT, "selector": TEXT}),
                "ballots per fold (mask and scores per column) and per-column counts, sums and sums of squares",
                summed=True, per_site=("ballot_mask", "ballot_scores", "voted"), masked_in_secure_runs=False,
                check=_policy._select_prepare, summary=(_MOMENTS, _BALLOTS)),
    MessageKind("select_fit", _SELECT, Releases(part="=train", model="param:", meta={}),
                "model parameters after local training", summed=True, masked_in_secure_runs=False,
                check=_policy._select_fit, server_row_set=True, summary=(_MODELS,),
                plain_bound="max_rounds"),
    MessageKind("select_evaluate", _SELECT,
                Releases(part=_in_home(_SELECT, "_evaluate_part"), per_class=True,
                         aggregates=("logloss_sum", "confusion", "brier_sum", "rank_pairs",
                                     "sse", "sae", "sum_y", "sum_y2"),
                         histograms=("score_hist",), model="param:site:", meta={SMOOTHED: FLAG}),
                "per part: confusion matrix, log-loss and Brier sums, a score histogram and rank pairs (a "
                "regression: sums of squared and absolute errors and of the target and its square)",
                summed=True, masked_in_secure_runs=False, check=_policy._select_evaluate, server_row_set=True,
                summary=(_EVALUATIONS,),
                rows="the folds of `train` (cross-validation) or the `test` part, per selection chain",
                plain_bound="max_evaluations", models=_policy.selection_models),
    # ----- secure aggregation's own protocol: key material, no data
    MessageKind("secagg_keys", f"{_F}.site.secure", Releases(part=None, keys=("pk", "spk", "sig", "id")),
                "public keys for secure aggregation (no data)"),
    MessageKind("secagg_sign", f"{_F}.site.secure", Releases(part=None, keys=("sig",), meta={"label": TEXT}),
                "a signature of the survivor list (no data)"),
    MessageKind("secagg_unmask", f"{_F}.site.secure",
                Releases(part=None, keys=("b_shares", "b_salts", "seeds"),
                         meta={"label": TEXT, "unreadable": STRUCT}),  # {dealer: why its share failed}
                "secret shares to remove masks (no data)"),
):
    declare(_kind)

for _step, _home in (("column_roles", f"{_F}.steps.profile"), ("one_hot", f"{_F}.steps.encoding"),
                     ("impute_fill", _IMPUTE)):
    declare_table_step(_step, _home)
