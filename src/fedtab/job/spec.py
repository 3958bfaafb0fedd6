"""The job file: a TOML document (or a dict) -> a validated :class:`JobSpec`, the only settings object.

Every front door builds a :class:`JobSpec` and runs :func:`fedtab.job.workflow.run_workflow`:
``fedtab run`` / ``elect`` / ``impute`` / ``demo``, the Flower ServerApp and the FLARE
controller (which read it back from the plan in their run config, :func:`spec_from_plan`),
and the estimators' ``fit``. The keys, their types and defaults are listed in
``docs/job.md``. Parsing never reads a site's table; :func:`load_job` only resolves paths
relative to the job file. Every error is a :class:`JobError` whose message names the key
at fault (``[training] rounds``) and, for an unknown key, the closest valid one -- one
line, also for a file that cannot be read, is not TOML, or nests deeper than
:data:`MAX_DEPTH` levels.

Validation is declarative, as scikit-learn's ``_parameter_constraints``: a key's type is its
dataclass annotation (:data:`_TYPES`), each section's values meet its ``_constraints`` table
(:mod:`fedtab.job.constraints`), and the keys' interactions are the rows of :data:`RULES`; the
run's options (secure aggregation, robust reducers, ``max_site_share``, ``min_holders``) are
checked once, by the :class:`~fedtab.federation.protocol.RunOptions` the workflows are given.

A job *file* writes only inside its own folder: ``[run] out`` must resolve (symbolic links
followed) to the job file's folder or below it; an output elsewhere is given by the
caller (``fedtab run --out``, ``run_job(..., out=...)``), never by the file.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from .errors import JobError
from .constraints import Checked, Interval, Items, Names, Options, Rule, check_rules, validate_section
from .site_files import (check_dp_bounds, check_site_files, check_target, did_you_mean, dp_columns_without_bounds)

__all__ = ["JobError", "JobSpec", "SiteSpec", "ImputeSpec", "ElectionSpec", "TrainingSpec", "RunSpec",
           "PrivacySpec", "TrustSpec", "SchemaSpec", "EvaluationSpec", "ColumnsSpec", "LabelsSpec", "ENGINES", "TUNERS", "METHODS", "DP_KEYS",
           "check_dp_bounds", "check_site_files", "check_spec", "check_target", "did_you_mean", "dp_columns_without_bounds", "load_job", "parse_job", "spec_from_plan", "wants_profile"]

ENGINES = ("local", "flower", "nvflare")
TUNERS = ("none", "grid", "hill-climb", "cv")
#: deepest nesting of tables/arrays in a job (a real one needs 4: sites.<name>.selector.params)
MAX_DEPTH = 16
#: how ``[election]`` selects the columns: the Feature Election vote, or forward selection by pooled score tests
METHODS = ("vote", "score-test")
#: keys of ``[privacy] dp``
DP_KEYS = ("epsilon", "delta", "bounds", "clip")
#: field separators and decimal marks a site's CSV may use
SEPARATORS = (",", ";", "\t", "|")
DECIMALS = (".", ",")
#: the longest ``[trust] timeout`` (a year, in seconds): a longer wait overflows the platform's timers
MAX_TIMEOUT = 365 * 24 * 3600.0


def _late(module: str, name: str) -> Callable[..., Any]:
    """``fedtab.<module>.<name>``, imported when first called (the job module stays light to import)."""
    def call(*args: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(f"fedtab.{module}"), name)(*args)

    call.__name__ = name
    return call


def _each(check: Callable[[Any], Any]) -> Callable[[list], None]:
    """``check`` applied to every item of a list."""
    def run(values: list) -> None:
        for v in values:
            check(v)

    return run


_POSITIVE_INT = Interval(1, None, integer=True, text="a positive integer")


def _task_name(task: Any) -> None:
    """``[training] task``: one of :data:`fedtab.learn.tasks.TASKS`."""
    from ..learn.tasks import TASKS

    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


@dataclass
class SiteSpec:
    """One site: its table (CSV or Parquet), extra missing-value strings, its selector, and
    its disclosure floor ``min_rows`` where the job builds the site itself (the local engine,
    the in-process engines, loopback deployments; a site of a running deployment keeps its own)."""

    name: str
    path: Path | None  # None: the site's own deployment says where its table is (a SuperNode's data-path)
    na_values: list[str] = field(default_factory=list)
    selector: Any = None
    min_rows: int | None = None
    allow_server_row_sets: bool = False  # the policy's opt-in to plain answers over server-chosen row sets
    sep: str | None = None  # None: sniffed from the file (",", ";", tab or "|")
    decimal: str | None = None  # None: sniffed ("," with a ";" or tab separator and decimal commas)

    _constraints: ClassVar[dict] = {"selector": Checked(_late("election.selector_specs", "check_selector")),
                                    "min_rows": _POSITIVE_INT, "sep": Options(SEPARATORS),
                                    "decimal": Options(DECIMALS)}


@dataclass
class ImputeSpec:
    """FedHF-Impute settings: the fields of :class:`fedtab.federation.workflows.imputation.ImputeConfig`
    (``prior`` is its ``use_prior``; the seed is ``[run] seed``; robust mode, secure aggregation
    and DP come from ``[trust]`` and ``[privacy]``)."""

    rounds: int = 3
    local_epochs: int = 8
    hidden_dim: int = 32
    n_layers: int = 3
    k_neighbors: int = 10
    lr: float = 6e-3
    mask_fraction: float = 0.4
    prior: bool = True
    prior_rank: int | None = None
    prior_max_rank: int = 20
    min_abs_corr: float = 0.05
    dropout: float = 0.0
    weight_decay: float = 1e-5
    batch_size: int | None = None
    structural_share: float = 0.5
    max_steps_per_round: int | None = None
    validation_mask_fraction: float = 0.2
    keep_best: bool = True
    patience: int = 0
    tolerance: float = 0.005
    block_unavailable: bool = False
    n_threads: int | None = None

    _constraints: ClassVar[dict] = {
        "patience": Interval(0, None, integer=True, text="a non-negative integer (0 = no early stopping)"),
        "tolerance": Interval(0, 1, "left"),
    }


@dataclass
class ElectionSpec:
    """How the columns are selected. ``method="vote"``: Feature Election (``tune`` chooses the
    freedom degree, else ``freedom_degree`` is used; ``grid``: the tuning grid); ``"score-test"``:
    forward selection by score tests on the pooled sums at false discovery rate ``score_test_alpha``
    (per step), or with ``fdr = q`` the selection with error control: every column's pooled score
    test, one Benjamini-Hochberg (``fdr_method = "bh"``) or Benjamini-Yekutieli (``"by"``, any
    dependence) correction at FDR ``q`` (:func:`fedtab.election.score_test.fdr_score_selection`).
    ``grid`` / ``refine_step``: the grid tuner's freedom degrees (``None`` = 0, 0.1, ..., 1) and the
    step of its refinement around the best one (0 = none). ``tune = "cv"``: honest model selection
    (:func:`fedtab.federation.workflows.selection.select_model`, the job's ``selection`` step) instead of the
    tuning, election and training steps: ``grid`` its candidate freedom degrees (all columns always
    is one), ``modes`` the personalisations it compares (``None`` = its defaults), ``l2_grid`` the
    logistic model's L2 strengths (``None`` = the model's own), ``contributions`` the
    leave-one-site-out contributions (same exchanges)."""

    selector: Any = "lasso"
    freedom_degree: float | None = None
    tune: str = "none"
    aggregation: str = "weighted"
    normalization: str = "all"
    compat: str | None = None
    tolerance: float = 0.01
    consensus: str = "intersection"
    consensus_alpha: float = 0.05
    method: str = "vote"
    score_test_alpha: float = 0.05
    fdr: float | None = None
    fdr_method: str = "bh"
    grid: list | None = None
    refine_step: float = 0.025
    modes: list[str] | None = None
    l2_grid: list | None = None
    contributions: bool = True

    _constraints: ClassVar[dict] = {
        "method": Options(METHODS), "tune": Options(TUNERS), "freedom_degree": Interval(0, 1),
        "grid": Items(Interval(0, 1), text="freedom degrees in [0, 1]"), "refine_step": Interval(0, 1, "left"),
        "aggregation": Checked(_late("election.rule", "check_aggregation")),
        "normalization": Checked(_late("election.rule", "check_normalization")),
        "consensus": Checked(_late("election.evidence", "check_consensus")),
        "consensus_alpha": Checked(_late("election.evidence", "check_consensus_alpha")),
        "score_test_alpha": Interval(0, 1, "neither", text="a number in (0, 1)"),
        "selector": Checked(_late("election.selector_specs", "check_selector")),
        "fdr": Checked(lambda q: _late("election.score_test", "check_fdr")(q, "bh")),
        "fdr_method": Checked(lambda m: _late("election.score_test", "check_fdr")(0.05, m)),
        "modes": Checked(_each(_late("learn.personalise", "check_mode"))),
        "l2_grid": Items(Interval(0, math.inf, "left"), text="non-negative finite L2 strengths"),
    }


@dataclass
class TrainingSpec:
    """FedAvg training: ``model`` is a name or ``{name, params}``."""

    model: Any = "logistic"
    rounds: int = 10
    local_epochs: int = 5
    #: ``"binary"``, ``"multiclass"`` or ``"regression"``; ``None``: read from the sites' targets
    task: str | None = None

    _constraints: ClassVar[dict] = {"model": Checked(_late("learn.models", "make_model")),
                                    "rounds": Interval(1, None, text="at least 1"),
                                    "local_epochs": Interval(1, None, text="at least 1"),
                                    "task": Checked(_task_name)}


@dataclass
class RunSpec:
    """Run settings; ``out`` is relative to the job file. ``mlflow``: an MLflow tracking URI
    (``"file:./mlruns"``, a server's ``http://...``) the run is logged to (``None``: not tracked)."""

    seed: int = 0
    out: Path = Path("run-out")
    test_size: float = 0.2
    engine: str = "local"
    mlflow: str | None = None

    #: ``test_size`` is in (0, 1) or, without training, 0: a rule of the job (:data:`RULES`)
    _constraints: ClassVar[dict] = {"engine": Options(ENGINES)}


@dataclass
class PrivacySpec:
    """What the server may learn. ``secure_aggregation``: every quantity the server needs only
    summed travels masked. ``dp``: ``{"epsilon", "delta", "bounds", "clip"}``, the run's *total*
    differential-privacy budget, split over the steps that release (``None`` = no DP)."""

    secure_aggregation: bool = False
    dp: dict | None = None

    @property
    def private(self) -> bool:
        """Whether the run hides single sites' values (secure aggregation or DP)."""
        return self.secure_aggregation or self.dp is not None


@dataclass
class TrustSpec:
    """What the server trusts. ``robust``: robust reducers (median vote, screened and capped
    sums, median FedAvg) with ``max_site_share`` the ceiling on one site's share of a pooled sum;
    ``min_sites``: the quorum (a site that fails, times out or is rejected is dropped, named, while
    this many remain; ``None`` = every site must answer); ``timeout``: seconds a site may take per
    exchange (``None`` = the engine's); ``min_holders``: sites that must hold a column for it to be
    election consensus (``None`` = 2 with two or more sites)."""

    robust: bool = False
    max_site_share: float = 0.5
    min_sites: int | None = None
    timeout: float | None = None
    min_holders: int | None = None

    #: ``robust``, ``max_site_share`` and ``min_holders`` are the run's options: :class:`RunOptions
    #: <fedtab.federation.protocol.RunOptions>` checks them (:func:`_run_options`)
    _constraints: ClassVar[dict] = {
        "min_sites": _POSITIVE_INT,
        "timeout": Interval(0, MAX_TIMEOUT, "right",
                            text=f"a positive number of seconds, at most {MAX_TIMEOUT:.0f} (a year)"),
    }


@dataclass
class SchemaSpec:
    """``profile``: the column-profile exchange of the schema step (kinds, integer flags, coarse
    ranges, row counts; text columns are one-hot encoded with agreed categories). ``None`` = yes,
    except in a private run (``[privacy]``), which never asks for it; ``False`` = no exchange: the
    schema is what the sites declare in the first step's exchange (numeric tables only)."""

    profile: bool | None = None


@dataclass
class EvaluationSpec:
    """``baselines``: also score the majority class and each site's local-only model (one
    exchange; ``None`` = yes, except in a private run, where they would release each site's own
    scores). ``all_columns``: also train the model on every column, to compare with the selected
    ones (a second training run)."""

    baselines: bool | None = None
    all_columns: bool = False


@dataclass
class ColumnsSpec:
    """What the columns mean. ``categorical``: columns treated as categories (one-hot encoded,
    imputed to one of their categories) even when coded as numbers; ``ignore``: columns left
    out at every site; ``keep``: columns kept although they look like row identifiers (unique
    per row at the sites, or named like an id), which are otherwise left out with a warning.
    ``bounds`` (``{column: [low, high]}``) and ``levels`` (``{column: [code, ...]}``): the public
    data dictionary, the value bounds a DP run clips each column into (a column with only
    ``levels`` is bounded by its smallest and largest code); they are public facts about the
    column (age 0-120), never the sites' minimum and maximum."""

    categorical: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    bounds: dict = field(default_factory=dict)
    levels: dict = field(default_factory=dict)

    _constraints: ClassVar[dict] = {"categorical": Names(), "ignore": Names(), "keep": Names()}

    @property
    def declared(self) -> bool:
        """Whether the job gives any column a role (``bounds`` and ``levels`` are public facts
        that need no profile: they only bound values under DP)."""
        return bool(self.categorical or self.ignore or self.keep)

    def public_bounds(self) -> dict[str, list[float]]:
        """``{column: [low, high]}`` of the data dictionary: ``bounds``, and for a column
        given only ``levels`` the smallest and largest of its codes."""
        out = {c: [float(min(v)), float(max(v))] for c, v in self.levels.items()}
        out.update({c: [float(b[0]), float(b[1])] for c, b in self.bounds.items()})
        return out


@dataclass
class LabelsSpec:
    """``map``: ``{site's label: agreed label}`` applied to the target column at each site before
    anything else (``{ yes = 1, no = 0 }`` when one site codes the label as text, others as 0/1)."""

    map: dict | None = None


@dataclass
class JobSpec:
    """A validated job. ``impute`` / ``election`` are ``None`` when their table is absent;
    ``training`` is ``None`` only in a plan or a programmatic spec (a job file always trains),
    and ``target`` only when nothing is supervised (imputation alone)."""

    target: str | None
    sites: list[SiteSpec]
    na_values: list[str] = field(default_factory=list)
    impute: ImputeSpec | None = None
    election: ElectionSpec | None = None
    training: TrainingSpec | None = field(default_factory=TrainingSpec)
    run: RunSpec = field(default_factory=RunSpec)
    privacy: PrivacySpec = field(default_factory=PrivacySpec)
    trust: TrustSpec = field(default_factory=TrustSpec)
    schema: SchemaSpec = field(default_factory=SchemaSpec)
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    columns: ColumnsSpec = field(default_factory=ColumnsSpec)
    labels: LabelsSpec = field(default_factory=LabelsSpec)
    source: str = "<dict>"

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-able data (paths as strings), for ``result.json`` and the model file."""

        def plain(v: Any) -> Any:
            if isinstance(v, Path):
                return str(v)
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [plain(x) for x in v]
            return v

        return plain(asdict(self))

    def plan(self) -> dict[str, Any]:
        """What the server needs (:meth:`to_dict` without where the sites keep their files):
        the steps and settings and the site names, as the engines carry it in their run config
        (:func:`spec_from_plan` reads it back)."""
        plan = {k: v for k, v in self.to_dict().items() if k not in ("sites", "source")}
        plan["sites"] = {s.name: {} for s in self.sites}
        return plan


_SECTIONS: dict[str, type] = {"impute": ImputeSpec, "election": ElectionSpec, "training": TrainingSpec, "run": RunSpec,
                              "privacy": PrivacySpec, "trust": TrustSpec, "schema": SchemaSpec,
                              "evaluation": EvaluationSpec, "columns": ColumnsSpec, "labels": LabelsSpec}
#: sections a job has even when its table is absent (their defaults)
_ALWAYS = ("training", "run", "privacy", "trust", "schema", "evaluation", "columns", "labels")
_TOP = ("target", "na_values", "sites", *_SECTIONS)
_SITE_KEYS = ("path", "na_values", "selector", "min_rows", "sep", "decimal", "allow_server_row_sets")


def _unknown(where: str, key: str, valid: tuple[str, ...] | list[str], source: str) -> JobError:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"
    return JobError(f"{source}: unknown key {where}{key!r}{hint}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(v: Any) -> Any:
    return v


#: a field's declared type (its annotation) -> (what it accepts, what the error says it must be, the
#: value kept); an ``X | None`` field not listed takes ``X``'s row and also ``None``; any other
#: annotation (``Any``: selector and model specs, checked by their factories) takes the value as is
_TYPES: dict[str, tuple[Callable[[Any], bool], str, Callable[[Any], Any]]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", _same),
    "float": (_is_number, "a number", float),
    "bool": (lambda v: isinstance(v, bool), "true or false", _same),
    "str": (lambda v: isinstance(v, str), "a string", _same),
    "list | None": (lambda v: isinstance(v, list) and all(map(_is_number, v)), "a list of numbers",
                    lambda v: [float(x) for x in v]),
    "list[str] | None": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings",
                         list),
    "dict | None": (lambda v: isinstance(v, Mapping), "a table (an inline table { ... } in TOML)", dict),
    "list[str]": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
                  "a list of column names", list),
    "Path": (lambda v: isinstance(v, str) and bool(v), "a path string", Path),
}


def _typed(value: Any, default: Any, annotation: str, where: str, source: str) -> Any:
    """Check ``value`` against the field's declared type (from the dataclass annotation string,
    :data:`_TYPES`)."""
    optional = annotation.endswith(" | None")
    if value is None and optional:
        return None
    row = _TYPES.get(annotation) or (_TYPES.get(annotation.removesuffix(" | None")) if optional else None)
    if row is None:
        return value
    accepts, kind, keep = row
    if not accepts(value):
        raise JobError(f"{source}: {where} must be {kind}, got {value!r}")
    return keep(value)


def _section(cls: type, raw: Any, name: str, source: str) -> Any:
    if not isinstance(raw, Mapping):
        raise JobError(f"{source}: [{name}] must be a table, got {raw!r}")
    fields = cls.__dataclass_fields__
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown(f"[{name}] ", key, tuple(fields), source)
        f = fields[key]
        kwargs[key] = _typed(value, f.default, str(f.type), f"[{name}] {key}", source)
    return cls(**kwargs)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_dictionary(c: ColumnsSpec) -> None:
    """``[columns] bounds`` (``{column: [low, high]}``, finite ``low < high``) and ``levels``
    (``{column: [code, ...]}``, finite numbers)."""
    if not isinstance(c.bounds, Mapping):
        raise JobError(f"[columns] bounds must be a table {{ age = [0, 120], ... }}, got {c.bounds!r}")
    if not isinstance(c.levels, Mapping):
        raise JobError(f"[columns] levels must be a table {{ cp = [1, 2, 3, 4], ... }}, got {c.levels!r}")
    for column, b in c.bounds.items():
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(_finite(x) for x in b) and b[0] < b[1]):
            raise JobError(f"[columns] bounds.{column} must be [low, high] with finite low < high, got {b!r}")
    for column, v in c.levels.items():
        if not (isinstance(v, (list, tuple)) and v and all(_finite(x) for x in v)):
            raise JobError(f"[columns] levels.{column} must be a non-empty list of numeric codes, got {v!r}")
    c.bounds = {str(k): [float(x) for x in b] for k, b in c.bounds.items()}
    c.levels = {str(k): [float(x) for x in v] for k, v in c.levels.items()}


def _dp_bounds(spec: JobSpec) -> None:
    """Under ``[privacy] dp``, put the data dictionary's bounds (``[columns] bounds`` / ``levels``)
    into ``dp["bounds"]``, where every DP step reads them (:func:`fedtab.privacy.dp.column_bounds`).

    Raises:
        JobError: ``dp.bounds = [lo, hi]`` (one pair for every column) together with a data
            dictionary, or a column given two different bounds.
    """
    dp, table = spec.privacy.dp, spec.columns.public_bounds()
    if dp is None or not table:
        return
    given = dp.get("bounds")
    if given is None:
        dp["bounds"] = table
        return
    if not isinstance(given, Mapping):
        raise JobError("[privacy] dp.bounds = [low, high] (one range for every column) and [columns] bounds/levels "
                       "both bound the columns: give them in one place ([columns] bounds per column)")
    merged = {str(k): [float(x) for x in b] for k, b in given.items()}
    for column, b in table.items():
        if column in merged and merged[column] != b:
            raise JobError(f"[privacy] dp.bounds.{column} = {merged[column]} but [columns] gives {b}: "
                           "give the column's bounds in one place")
        merged[column] = b
    dp["bounds"] = merged


def _na_values(value: Any, where: str, source: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobError(f"{source}: {where} must be a list of strings, got {value!r}")
    return list(value)


def _dp(value: Any, source: str) -> dict[str, Any] | None:
    """``[privacy] dp``: ``{epsilon, delta, bounds, clip}`` checked by :func:`fedtab.privacy.dp.parse_dp`."""
    from ..privacy.dp import parse_dp

    if value is None:
        return None
    for key in value:
        if key not in DP_KEYS:
            raise _unknown("[privacy] dp.", key, DP_KEYS, source)
    if not isinstance(value, Mapping):
        raise JobError(f"{source}: [privacy] dp must be a table {{epsilon, delta, bounds, clip}}, got {value!r}")
    try:
        dp = parse_dp(value)
    except (TypeError, ValueError) as exc:
        raise JobError(f"{source}: [privacy] {exc}") from None
    if dp is not None and dp["bounds"] is not None:
        _check_bounds(dp["bounds"], source)
    return dp


def _check_bounds(bounds: Any, source: str) -> None:
    """``[lo, hi]`` for every column, or ``{column: [lo, hi]}``, with finite ``lo < hi``."""
    def pair(b: Any, where: str) -> None:
        ok = (isinstance(b, (list, tuple)) and len(b) == 2
              and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in b)
              and b[0] < b[1])
        if not ok:
            raise JobError(f"{source}: [privacy] dp.bounds{where} must be [low, high] with low < high, got {b!r}")

    if isinstance(bounds, Mapping):
        for column, b in bounds.items():
            pair(b, f".{column}")
    else:
        pair(bounds, "")


def _check_cv(spec: JobSpec) -> None:
    """``tune = "cv"``: logistic regression (or ``linear`` for a numeric target) with the training
    step, no private or robust run (the
    modes and L2 strengths are checked by ``[election]``'s table)."""
    from ..learn.models import LinearRegressionModel, LogisticRegressionModel, make_model

    blocked = [name for name, on in (("[privacy] secure_aggregation", spec.privacy.secure_aggregation),
                                     ("[privacy] dp", spec.privacy.dp is not None),
                                     ("[trust] robust", spec.trust.robust)) if on]
    if blocked:
        raise JobError(f"[election] tune = \"cv\" cannot run with {' or '.join(blocked)}: the cross-validation "
                       "sums travel in the clear and are reduced plainly (docs/privacy.md); use tune = \"none\" "
                       "with freedom_degree")
    if spec.training is None:
        raise JobError("[election] tune = \"cv\" needs the training step (it selects the model it trains)")
    fm = make_model(spec.training.model)
    if not isinstance(fm, (LogisticRegressionModel, LinearRegressionModel)):
        raise JobError(f"[election] tune = \"cv\" trains logistic regression (classes) or linear regression "
                       f"(a numeric target); [training] model is {fm.name!r}")


#: ``RunOptions`` argument -> the job key that sets it, to name the key in its errors
_OPTION_KEYS = {"robust=True": "[trust] robust", "secure_aggregation=True": "[privacy] secure_aggregation",
                "min_holders": "[trust] min_holders", "max_site_share": "[trust] max_site_share"}


def _run_options(spec: JobSpec) -> None:
    """The run's options (robust reducers, ``max_site_share``, ``min_holders``, secure aggregation)
    checked once, by :class:`~fedtab.federation.protocol.RunOptions` itself -- the object every
    workflow is given -- with its errors naming the job's keys. (DP is checked by ``[privacy] dp``,
    with the same :func:`~fedtab.privacy.dp.parse_dp`.)"""
    from ..federation.protocol.options import RunOptions

    t = spec.trust
    try:
        RunOptions.of(secure_aggregation=spec.privacy.secure_aggregation, robust=t.robust,
                      max_site_share=t.max_site_share, min_holders=t.min_holders)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        for option, key in _OPTION_KEYS.items():
            message = message.replace(option, key)
        raise JobError(message) from None


def _impute(spec: JobSpec) -> None:
    """``[impute]``: the settings :class:`~fedtab.federation.workflows.imputation.ImputeConfig` validates."""
    from .steps.impute_settings import impute_config

    try:
        impute_config(spec).validate()  # rounds = 0: the linear prior alone
    except ValueError as exc:
        raise JobError(f"[impute] {exc}") from None


def _profile_with_compat(spec: JobSpec) -> None:
    from ..election.rule import check_profile

    try:
        check_profile(spec.election.compat, spec.election.normalization)
    except ValueError as exc:
        raise JobError(f"[election] compat: {exc}") from None


def _labels_map(m: Any) -> bool:
    return bool(m) and all(isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
                           for k, v in m.items())


def wants_profile(spec: JobSpec) -> bool:
    """Whether the job asks for the column profile: ``[schema] profile``, by default yes unless private."""
    return spec.schema.profile if spec.schema.profile is not None else not spec.privacy.private


def _training_modes(spec: JobSpec) -> None:
    """The modes the training step declared (:mod:`fedtab.federation.workflows.training.steps`) hold this run's."""
    from ..federation.protocol.modes import check_modes, modes_of
    from fedtab.federation.workflows.training.steps import EXACT_TRAINING_MODES  # noqa: F401  (registers the declarations)
    from ..learn.models import make_model

    p, fm = spec.privacy, make_model(spec.training.model)
    try:
        check_modes("training.exact" if fm.exact else "training",
                    modes_of(secure=p.secure_aggregation, dp=p.dp is not None, robust=spec.trust.robust),
                    f"the exact-aggregation model {fm.name!r}" if fm.exact else f"the model {fm.name!r}")
    except ValueError as exc:
        raise JobError(f"[privacy] {exc}") from None


def _check_task(spec: JobSpec) -> None:
    """``[training] task``: one the model can serve (its name is checked by the section's table)."""
    from ..learn.models import make_model
    from ..learn.tasks import given_objective, model_refusal

    task, fm = spec.training.task, make_model(spec.training.model)
    why = None if task is None else model_refusal(fm.name, task,
                                                  given_objective(spec.training.model) if fm.name == "gbdt" else None)
    if why is not None:
        raise JobError(f"[training] {why}")


def _has(section: str) -> Callable[[JobSpec], bool]:
    return lambda spec: getattr(spec, section) is not None


_ROLES = ("categorical", "ignore", "keep")

#: the rules that tie keys together, in order (each names the keys; the sections' own tables run first)
RULES: tuple[Rule | Callable[[JobSpec], None], ...] = (
    Rule(lambda s: s.target is None and (s.training is not None or s.election is not None),
         "the job needs target = \"<label column>\" (it elects or trains)"),
    # [election]
    Rule(lambda s: s.election.tune != "none" and s.election.freedom_degree is not None,
         "[election] give either tune or freedom_degree, not both", when=_has("election")),
    lambda s: s.election is not None and _profile_with_compat(s),
    Rule(lambda s: s.election.method != "score-test" and (s.election.fdr is not None or s.election.fdr_method != "bh"),
         "[election] fdr and fdr_method apply to method = \"score-test\" (the score test's p-values)",
         when=_has("election")),
    Rule(lambda s: s.election.method == "score-test" and s.election.tune != "none",
         "[election] tune applies to method = \"vote\" (the score test has no freedom degree)", when=_has("election")),
    Rule(lambda s: s.election.method == "score-test" and (s.privacy.dp is not None or s.trust.robust),
         "[election] method = \"score-test\" has no DP or robust mode; use method = \"vote\" in a job with "
         "[privacy] dp or [trust] robust", when=_has("election")),
    lambda s: s.election is not None and s.election.method != "score-test" and s.election.tune == "cv" and _check_cv(s),
    Rule(lambda s: s.election.method != "score-test" and s.election.tune not in ("none", "cv") and s.privacy.private,
         "[privacy] secure_aggregation or dp cannot be combined with [election] tune (tuning scores every site's "
         "validation F1 in the clear; give freedom_degree instead)", when=_has("election")),
    Rule(lambda s: s.election.tune != "cv" and (s.election.modes is not None or s.election.l2_grid is not None),
         "[election] modes and l2_grid apply to tune = \"cv\"", when=_has("election")),
    # [columns] and [labels]
    *(Rule(lambda s, r=r: s.target is not None and s.target in getattr(s.columns, r),
           lambda s, r=r: f"[columns] {r} names the target {s.target!r} (the label is never a feature)")
      for r in _ROLES),
    Rule(lambda s: bool(set(s.columns.ignore) & set(s.columns.categorical + s.columns.keep)),
         lambda s: f"[columns] ignore and categorical/keep both name "
                   f"{sorted(set(s.columns.ignore) & set(s.columns.categorical + s.columns.keep))[:5]}"),
    lambda s: _check_dictionary(s.columns),
    Rule(lambda s: s.columns.declared and not wants_profile(s),
         "[columns] categorical, ignore and keep need the column profile ([schema] profile, not in a job with "
         "[privacy] secure_aggregation or dp): the sites apply the roles after it"),
    Rule(lambda s: not _labels_map(s.labels.map),
         lambda s: f"[labels] map must map labels to labels ({{ yes = 1, no = 0 }}), got {s.labels.map!r}",
         when=lambda s: s.labels.map is not None),
    Rule(lambda s: s.target is None, "[labels] map needs target = \"<label column>\"",
         when=lambda s: s.labels.map is not None),
    _dp_bounds,
    # [sites]
    Rule(lambda s: any(x.sep is not None and x.sep == x.decimal for x in s.sites),
         lambda s: next(f"[sites.{x.name}] sep and decimal must differ, both are {x.sep!r}"
                        for x in s.sites if x.sep is not None and x.sep == x.decimal)),
    # [run]
    Rule(lambda s: not 0 < s.run.test_size < 1 and not (s.run.test_size == 0 and s.training is None),
         lambda s: f"[run] test_size must be in (0, 1), got {s.run.test_size}"),
    lambda s: s.impute is not None and _impute(s),
    # [trust] and [privacy]: what the run guarantees
    Rule(lambda s: s.trust.min_sites is not None and bool(s.sites) and s.trust.min_sites > len(s.sites),
         lambda s: f"[trust] min_sites = {s.trust.min_sites} but the job has {len(s.sites)} site(s)"),
    _run_options,
    Rule(lambda s: s.privacy.private and bool(s.schema.profile),
         "[schema] profile = true sends each site's coarse column ranges in the clear: not in a job with "
         "[privacy] secure_aggregation or dp"),
    Rule(lambda s: s.privacy.private and bool(s.evaluation.baselines),
         "[evaluation] baselines = true scores each site's own model in the clear: not in a job with "
         "[privacy] secure_aggregation or dp"),
    lambda s: s.training is not None and _training_modes(s),
    lambda s: s.training is not None and _check_task(s),
)


def _sections(spec: JobSpec) -> list[tuple[Any, str]]:
    """``(section, its name in errors)`` of every section the job has, sites first."""
    out: list[tuple[Any, str]] = [(s, f"sites.{s.name}") for s in spec.sites]
    return out + [(getattr(spec, k), k) for k in _SECTIONS if getattr(spec, k) is not None]


def check_spec(spec: JobSpec) -> JobSpec:
    """Validate a :class:`JobSpec` however it was built (a job file, a plan, a command's options,
    an estimator's parameters); returns it.

    Every section is checked against its table (``_constraints``, :mod:`fedtab.job.constraints`),
    then the job against :data:`RULES`; the run's options by :class:`RunOptions
    <fedtab.federation.protocol.RunOptions>`, which the workflows then trust.

    Raises:
        JobError: naming the key at fault (``[trust] min_sites``) and the source.
    """
    src = spec.source
    spec.privacy.dp = _dp(spec.privacy.dp, src)
    try:
        for section, name in _sections(spec):
            validate_section(section, name, JobError)
        check_rules(spec, RULES, JobError)
    except JobError as exc:
        raise JobError(f"{src}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise JobError(f"{src}: {exc}") from None
    return spec


def nesting_depth(doc: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of tables/arrays (dicts and lists) in a parsed document, counted up to
    ``limit + 1`` (iterative: a hostile document cannot exhaust the stack)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            v = list(v.values())
        if isinstance(v, (list, tuple)):
            deepest = max(deepest, d)
            if d <= limit:
                stack.extend((x, d + 1) for x in v)
    return deepest


def _check_out(out: Path, base: Path, source: str) -> None:
    """A job file's ``[run] out`` must lie in the job's folder (symbolic links resolved)."""
    folder = base.resolve()
    if not (base / out).resolve().is_relative_to(folder):
        raise JobError(f"{source}: [run] out must be inside the job's folder {folder} (a job file writes only "
                       "there); give the output directory on the command line (--out) to write elsewhere")


def _site(name: str, raw: Any, base: Path, source: str) -> SiteSpec:
    """``[sites.<name>]``: its keys and their types (its values are checked by :meth:`SiteSpec`'s
    table in :func:`check_spec`); a relative path is resolved against ``base``."""
    if not isinstance(raw, Mapping):
        raise JobError(f"{source}: [sites.{name}] must be a table with path = \"...\"")
    for key in raw:
        if key not in _SITE_KEYS:
            raise _unknown(f"[sites.{name}] ", key, _SITE_KEYS, source)
    where = f"[sites.{name}]"
    path = _typed(raw["path"], None, "Path", f"{where} path", source) if raw.get("path") else None
    return SiteSpec(
        name=name,
        path=path if path is None or path.is_absolute() else base / path,
        na_values=_na_values(raw.get("na_values", []), f"{where} na_values", source),
        selector=raw.get("selector"),
        min_rows=_typed(raw.get("min_rows"), None, "int | None", f"{where} min_rows", source),
        allow_server_row_sets=_typed(raw.get("allow_server_row_sets", False), False, "bool",
                                     f"{where} allow_server_row_sets", source),
        sep=_typed(raw.get("sep"), None, "str | None", f"{where} sep", source),
        decimal=_typed(raw.get("decimal"), None, "str | None", f"{where} decimal", source),
    )


def parse_job(doc: Mapping[str, Any], base_dir: str | Path = ".", source: str = "<dict>", *,
              sites_required: bool = True, confine_out: bool = False) -> JobSpec:
    """Validate a job document (the parsed TOML) and resolve site paths against ``base_dir``.

    A section given as ``None`` (JSON ``null``, as in :meth:`JobSpec.to_dict`) is absent;
    ``"training": null`` means no training step. ``sites_required=False`` (a server's plan)
    accepts a job without ``[sites]``.

    Args:
        confine_out: ``[run] out`` must resolve inside ``base_dir`` (what :func:`load_job`
            asks of a job file).

    Raises:
        JobError: an unknown key (with the closest valid key), a missing ``target`` or
            ``sites``, a value of the wrong type, an unknown selector/model/engine/tuner,
            nesting deeper than :data:`MAX_DEPTH`, or (``confine_out``) an ``out``
            outside ``base_dir``.
    """
    if not isinstance(doc, Mapping):
        raise JobError(f"{source}: a job must be a table of keys, got {type(doc).__name__}")
    if nesting_depth(doc) > MAX_DEPTH:
        raise JobError(f"{source}: the job nests tables or arrays deeper than {MAX_DEPTH} levels")
    for key in doc:
        if key not in _TOP:
            raise _unknown("", key, _TOP, source)
    no_training = "training" in doc and doc["training"] is None
    if "target" not in doc and not (no_training and doc.get("election") is None):
        raise JobError(f"{source}: the job needs target = \"<label column>\"")
    target = None if doc.get("target") is None else _typed(doc["target"], None, "str", "target", source)
    sites_raw = doc.get("sites", {} if not sites_required else None)
    if not isinstance(sites_raw, Mapping) or (sites_required and not sites_raw):
        raise JobError(f"{source}: the job needs at least one [sites.<name>] table")
    base = Path(base_dir)
    sites = [_site(str(name), raw, base, source) for name, raw in sites_raw.items()]
    sections = {k: _section(cls, doc[k], k, source) for k, cls in _SECTIONS.items() if doc.get(k) is not None}
    run = sections.get("run", RunSpec())
    if confine_out:
        _check_out(run.out, base, source)
    if not run.out.is_absolute():
        run.out = base / run.out
    spec = JobSpec(
        target=target,
        sites=sites,
        na_values=_na_values(doc.get("na_values", []), "na_values", source),
        impute=sections.get("impute"),
        election=sections.get("election"),
        training=None if no_training else sections.get("training", TrainingSpec()),
        run=run,
        **{k: sections.get(k, _SECTIONS[k]()) for k in ("privacy", "trust", "schema", "evaluation", "columns",
                                                         "labels")},
        source=source,
    )
    return check_spec(spec)


def spec_from_plan(plan: Mapping[str, Any] | str, source: str = "the job plan") -> JobSpec:
    """The :class:`JobSpec` of a plan: :meth:`JobSpec.plan` or :meth:`JobSpec.to_dict` output, as a
    dict or JSON text (an engine's run config holds only strings).

    Raises:
        JobError: not valid JSON, not an object, or as :func:`parse_job`.
    """
    try:
        raw = json.loads(plan) if isinstance(plan, str) else plan
    except json.JSONDecodeError as exc:
        raise JobError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise JobError(f"{source} must be a JSON object (JobSpec.plan()), got {type(raw).__name__}")
    doc = {k: v for k, v in raw.items() if k != "source"}
    sites = doc.get("sites")
    if isinstance(sites, list):  # to_dict() form: [{name, path, ...}]
        doc["sites"] = {str(s.get("name")): {k: v for k, v in s.items() if k != "name" and v not in (None, [])}
                        for s in sites if isinstance(s, Mapping)}
    return parse_job(doc, source=source, sites_required=False)


def load_job(path_or_doc: str | Path | Mapping[str, Any], *, out_given: bool = False) -> JobSpec:
    """Read and validate a job file (TOML), or validate a dict (paths relative to the cwd).

    Args:
        out_given: the caller chose the output directory (``--out``), so a job file's
            ``[run] out`` is not held to the job's folder (it is not used).

    Raises:
        JobError: the file is missing, unreadable, not valid TOML or nested too deep, its
            ``[run] out`` lies outside its folder (unless ``out_given``), the target is not a
            column of a site file or a DP job lacks the bounds of a column in their headers
            (:func:`check_site_files`), or as :func:`parse_job`.
    """
    if isinstance(path_or_doc, Mapping):
        return parse_job(path_or_doc)
    p = Path(path_or_doc)
    if not p.is_file():
        raise JobError(f"{p}: no such job file")
    try:
        doc = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise JobError(f"{p}: not a valid TOML file ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise JobError(f"{p}: the job nests tables or arrays deeper than {MAX_DEPTH} levels") from None
    except OSError as exc:
        raise JobError(f"{p}: cannot read the job file ({exc.strerror or exc})") from None
    return check_site_files(parse_job(doc, p.parent, source=str(p), confine_out=not out_given))
