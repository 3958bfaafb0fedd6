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
from typing import Any, Mapping

__all__ = ["JobError", "JobSpec", "SiteSpec", "ImputeSpec", "ElectionSpec", "TrainingSpec", "RunSpec",
           "PrivacySpec", "TrustSpec", "SchemaSpec", "EvaluationSpec", "ColumnsSpec", "LabelsSpec", "ENGINES", "TUNERS", "METHODS", "DP_KEYS",
           "check_dp_bounds", "check_site_files", "check_spec", "check_target", "did_you_mean", "dp_columns_without_bounds", "load_job", "parse_job", "spec_from_plan"]

ENGINES = ("local", "flower", "nvflare")
TUNERS = ("none", "grid", "hill-climb", "cv")
#: deepest nesting of tables/arrays in a job (a real one needs 4: sites.<name>.selector.params)
MAX_DEPTH = 16
#: how ``[election]`` selects the columns: the Feature Election vote, or forward selection by pooled score tests
METHODS = ("vote", "score-test")
#: keys of ``[privacy] dp``
DP_KEYS = ("epsilon", "delta", "bounds", "clip")


class JobError(ValueError):
    """The job file cannot be used; the message names the file and the key at fault."""


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


@dataclass
class ImputeSpec:
    """FedHF-Impute settings: the fields of :class:`fedtab.federation.imputation.ImputeConfig`
    (``prior`` is its ``use_prior``; the seed is ``[run] seed``; robust mode, secure aggregation
    and DP come from ``[trust]`` and ``[privacy]``)."""

    rounds: int = 20
    local_epochs: int = 2
    hidden_dim: int = 32
    n_layers: int = 3
    k_neighbors: int = 10
    lr: float = 3e-3
    mask_fraction: float = 0.4
    prior: bool = True
    prior_rank: int | None = None
    prior_max_rank: int = 20
    min_abs_corr: float = 0.05
    dropout: float = 0.0
    weight_decay: float = 1e-5
    batch_size: int = 64
    structural_share: float = 0.5
    max_steps_per_round: int | None = None
    validation_mask_fraction: float = 0.2
    keep_best: bool = True
    block_unavailable: bool = False
    n_threads: int | None = None


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
    (:func:`fedtab.federation.selection.select_model`, the job's ``selection`` step) instead of the
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


@dataclass
class TrainingSpec:
    """FedAvg training: ``model`` is a name or ``{name, params}``."""

    model: Any = "logistic"
    rounds: int = 10
    local_epochs: int = 5
    #: ``"binary"``, ``"multiclass"`` or ``"regression"``; ``None``: read from the sites' targets
    task: str | None = None


@dataclass
class RunSpec:
    """Run settings; ``out`` is relative to the job file. ``mlflow``: an MLflow tracking URI
    (``"file:./mlruns"``, a server's ``http://...``) the run is logged to (``None``: not tracked)."""

    seed: int = 0
    out: Path = Path("run-out")
    test_size: float = 0.2
    engine: str = "local"
    mlflow: str | None = None


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
#: field separators and decimal marks a site's CSV may use
SEPARATORS = (",", ";", "\t", "|")
DECIMALS = (".", ",")


def _unknown(where: str, key: str, valid: tuple[str, ...] | list[str], source: str) -> JobError:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"
    return JobError(f"{source}: unknown key {where}{key!r}{hint}")


def _typed(value: Any, default: Any, annotation: str, where: str, source: str) -> Any:
    """Check ``value`` against the field's declared type (from the dataclass annotation string)."""
    def bad(kind: str) -> JobError:
        return JobError(f"{source}: {where} must be {kind}, got {value!r}")

    if value is None and annotation.endswith("| None"):
        return None
    if annotation in ("int", "int | None"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if annotation in ("float", "float | None"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if annotation in ("bool", "bool | None"):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if annotation == "list | None":
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value):
            raise bad("a list of numbers")
        return [float(v) for v in value]
    if annotation == "list[str] | None":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return list(value)
    if annotation == "dict | None":
        if not isinstance(value, Mapping):
            raise bad("a table (an inline table { ... } in TOML)")
        return dict(value)
    if annotation == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise bad("a list of column names")
        return list(value)
    if annotation in ("str", "str | None"):
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if annotation == "Path":
        if not isinstance(value, str) or not value:
            raise bad("a path string")
        return Path(value)
    return value  # Any: selector / model specs are checked by their factories


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


def _min_rows(value: Any, where: str, source: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobError(f"{source}: {where} must be a positive integer, got {value!r}")
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str, source: str) -> str | None:
    if value is None or value in choices:
        return value
    raise JobError(f"{source}: {where} must be one of {list(choices)}, got {value!r}")


def _check_columns(spec: JobSpec) -> None:
    """``[columns]`` and ``[labels]``: no column in two roles, never the target, a profile to apply them."""
    c = spec.columns
    roles = {"categorical": c.categorical, "ignore": c.ignore, "keep": c.keep}
    for role, names in roles.items():
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise JobError(f"[columns] {role} must be a list of column names, got {names!r}")
        if spec.target is not None and spec.target in names:
            raise JobError(f"[columns] {role} names the target {spec.target!r} (the label is never a feature)")
    if set(c.ignore) & set(c.categorical + c.keep):
        both = sorted(set(c.ignore) & set(c.categorical + c.keep))
        raise JobError(f"[columns] ignore and categorical/keep both name {both[:5]}")
    _check_dictionary(c)
    from .steps.schema import wants_profile

    if c.declared and not wants_profile(spec):
        raise JobError("[columns] categorical, ignore and keep need the column profile ([schema] profile, not in a "
                       "job with [privacy] secure_aggregation or dp): the sites apply the roles after it")
    m = spec.labels.map
    if m is not None:
        if not m or not all(isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
                            for k, v in m.items()):
            raise JobError(f"[labels] map must map labels to labels ({{ yes = 1, no = 0 }}), got {m!r}")
        if spec.target is None:
            raise JobError("[labels] map needs target = \"<label column>\"")


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


def needs_dp_bounds(spec: JobSpec) -> bool:
    """Whether the job's DP releases clip column values into public bounds (imputation and
    training do: the moments, statistics and tree edges they release are of bounded values)."""
    return spec.privacy.dp is not None and (spec.impute is not None or spec.training is not None)


def dp_columns_without_bounds(spec: JobSpec, columns: list[str]) -> list[str]:
    """The feature columns among ``columns`` (the label and ``[columns] ignore`` excluded) that
    ``spec``'s DP releases need bounds for and that have none (empty when the job needs none)."""
    if not needs_dp_bounds(spec):
        return []
    bounds = (spec.privacy.dp or {}).get("bounds")
    if bounds is not None and not isinstance(bounds, Mapping):
        return []  # one [low, high] for every column
    have = set(bounds or {})
    skip = {spec.target, *spec.columns.ignore}
    return [c for c in dict.fromkeys(columns) if c not in skip and c not in have]


def _site_columns(site: SiteSpec) -> list[str] | None:
    """The column names of a site's file (its header only), or ``None`` when it cannot be read here
    (the run reports it)."""
    from ..data.tables import csv_header, csv_sample, sniff_csv

    p = site.path
    if p is None or not p.is_file():
        return None
    try:
        if p.name.lower().endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            return [str(c) for c in pq.read_schema(p).names if not str(c).startswith("__index_level_")]
        default = "\t" if p.name.lower().endswith((".tsv", ".tsv.gz")) else ","
        sep, _ = sniff_csv(csv_sample(p), default, site.sep)
        return [c.strip() for c in csv_header(p, sep)]
    except Exception:  # noqa: BLE001 - an unreadable file is the run's error, not the job file's
        return None


def did_you_mean(name: str, candidates: list[str] | tuple[str, ...]) -> str:
    """``" (did you mean 'x'?)"`` for the candidate closest to ``name`` (one that differs only
    in case first, then :func:`difflib.get_close_matches`), or ``""``."""
    same = [c for c in candidates if c.lower() == name.lower() and c != name]
    close = same or difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_target(spec: JobSpec, headers: Mapping[str, list[str]]) -> None:
    """Refuse a target that site files' headers lack, naming the target, the sites and the
    closest column there (``headers``: ``{site: its file's column names}``, readable files only),
    when too few sites are left for the quorum (``[trust] min_sites``; without it every site must
    answer): with a quorum that allows it, the run drops such a site and names it.

    Raises:
        JobError: ``target`` is not a column of so many files that the quorum cannot hold.
    """
    if spec.target is None:
        return
    lacking = [name for name, cols in headers.items() if spec.target not in cols]
    quorum = spec.trust.min_sites or len(spec.sites)
    if not lacking or len(spec.sites) - len(lacking) >= quorum:
        return
    hints = {name: did_you_mean(spec.target, headers[name]) for name in lacking}
    if len(set(hints.values())) == 1:
        where = f"site(s) {', '.join(lacking)}{hints[lacking[0]]}"
    else:
        where = ", ".join(f"{name}{hints[name]}" for name in lacking)
    raise JobError(f"{spec.source}: target = {spec.target!r} is not a column in the file of {where}")


def check_site_files(spec: JobSpec) -> JobSpec:
    """What a job file can be checked against in the headers of the site files it names (a site
    kept by its own deployment is checked when the run starts): the target is a column of every
    file (:func:`check_target`) and a DP job has the bounds it needs (:func:`check_dp_bounds`);
    returns ``spec``.

    Raises:
        JobError: as :func:`check_target` and :func:`check_dp_bounds`.
    """
    headers = {s.name: cols for s in spec.sites if (cols := _site_columns(s)) is not None}
    check_target(spec, headers)
    return check_dp_bounds(spec, headers)


def check_dp_bounds(spec: JobSpec, headers: Mapping[str, list[str]] | None = None) -> JobSpec:
    """Refuse a DP job whose releases need public bounds it lacks, naming the columns: from the
    headers of the site files the job names (``headers``: ``{site: column names}``, default read
    here; a site kept by its own deployment is checked when the run starts: its site names the
    column); returns ``spec``.

    Raises:
        JobError: ``[privacy] dp`` with imputation or training and a feature column without
            bounds (in ``[columns] bounds`` / ``levels`` or ``dp.bounds``).
    """
    if not needs_dp_bounds(spec):
        return spec
    if headers is None:
        headers = {s.name: cols for s in spec.sites if (cols := _site_columns(s)) is not None}
    columns = [c for cols in headers.values() for c in cols]
    missing = dp_columns_without_bounds(spec, columns)
    if not columns and (spec.privacy.dp or {}).get("bounds") is None:
        raise JobError(f"{spec.source}: [privacy] dp needs public value bounds for every feature column: give "
                       "[columns] bounds = { age = [0, 120], ... } (the data dictionary; or levels = { cp = "
                       "[1, 2, 3, 4] } for coded columns)")
    if missing:
        example = ", ".join(f"{c} = [low, high]" for c in missing[:2])
        raise JobError(f"{spec.source}: [privacy] dp needs public value bounds for the column(s) "
                       f"{', '.join(missing)}: add them to [columns] bounds = {{ {example} }} (public ranges, "
                       "not the sites' minimum and maximum) or levels = { column = [codes] }")
    return spec


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


def _positive_int(value: Any, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise JobError(f"{where} must be a positive integer, got {value!r}")


def _check_election(spec: JobSpec) -> None:
    from ..election.evidence import check_consensus, check_consensus_alpha
    from ..election.rule import check_aggregation, check_normalization, check_profile
    from ..election.selectors import make_selector

    e = spec.election
    assert e is not None
    if e.method not in METHODS:
        raise JobError(f"[election] method must be one of {list(METHODS)}, got {e.method!r}")
    if e.tune not in TUNERS:
        raise JobError(f"[election] tune must be one of {list(TUNERS)}, got {e.tune!r}")
    if e.tune != "none" and e.freedom_degree is not None:
        raise JobError("[election] give either tune or freedom_degree, not both")
    if e.freedom_degree is not None and not 0 <= e.freedom_degree <= 1:
        raise JobError(f"[election] freedom_degree must be in [0, 1], got {e.freedom_degree}")
    if e.grid is not None and (not e.grid or not all(0 <= g <= 1 for g in e.grid)):
        raise JobError(f"[election] grid must be freedom degrees in [0, 1], got {e.grid}")
    if not 0 <= e.refine_step < 1:
        raise JobError(f"[election] refine_step must be in [0, 1), got {e.refine_step}")
    check_aggregation(e.aggregation)
    check_normalization(e.normalization)
    check_profile(e.compat, e.normalization)
    check_consensus(e.consensus)
    check_consensus_alpha(e.consensus_alpha)
    if not 0 < e.score_test_alpha < 1:
        raise JobError(f"[election] score_test_alpha must be a number in (0, 1), got {e.score_test_alpha}")
    make_selector(e.selector)
    if e.method != "score-test" and (e.fdr is not None or e.fdr_method != "bh"):
        raise JobError("[election] fdr and fdr_method apply to method = \"score-test\" (the score test's p-values)")
    if e.fdr is not None or e.fdr_method != "bh":
        from ..election.score_test import check_fdr

        try:
            check_fdr(0.05 if e.fdr is None else e.fdr, e.fdr_method)
        except ValueError as exc:
            raise JobError(f"[election] {exc}") from None
    if e.method == "score-test":
        if e.tune != "none":
            raise JobError("[election] tune applies to method = \"vote\" (the score test has no freedom degree)")
        if spec.privacy.dp is not None or spec.trust.robust:
            raise JobError("[election] method = \"score-test\" has no DP or robust mode; use method = \"vote\" "
                           "in a job with [privacy] dp or [trust] robust")
    elif e.tune == "cv":
        _check_cv(spec)
    elif e.tune != "none" and spec.privacy.private:
        raise JobError("[privacy] secure_aggregation or dp cannot be combined with [election] tune (tuning scores "
                       "every site's validation F1 in the clear; give freedom_degree instead)")
    if e.tune != "cv" and (e.modes is not None or e.l2_grid is not None):
        raise JobError("[election] modes and l2_grid apply to tune = \"cv\"")


def _check_cv(spec: JobSpec) -> None:
    """``tune = "cv"``: logistic regression, valid modes and L2 strengths, no private or robust run."""
    from ..learn.models import LogisticRegressionModel, make_model
    from ..learn.personalise import check_mode

    e = spec.election
    assert e is not None
    blocked = [name for name, on in (("[privacy] secure_aggregation", spec.privacy.secure_aggregation),
                                     ("[privacy] dp", spec.privacy.dp is not None),
                                     ("[trust] robust", spec.trust.robust)) if on]
    if blocked:
        raise JobError(f"[election] tune = \"cv\" cannot run with {' or '.join(blocked)}: the cross-validation "
                       "sums travel in the clear and are reduced plainly (docs/privacy.md); use tune = \"none\" "
                       "with freedom_degree")
    if spec.training is None:
        raise JobError("[election] tune = \"cv\" needs the training step (it selects the model it trains)")
    if not isinstance(make_model(spec.training.model), LogisticRegressionModel):
        raise JobError(f"[election] tune = \"cv\" trains logistic regression; [training] model is "
                       f"{make_model(spec.training.model).name!r}")
    for mode in e.modes or ():
        try:
            check_mode(mode)
        except ValueError as exc:
            raise JobError(f"[election] modes: {exc}") from None
    if e.l2_grid is not None and (not e.l2_grid or not all(math.isfinite(x) and x >= 0 for x in e.l2_grid)):
        raise JobError(f"[election] l2_grid must be non-negative finite L2 strengths, got {e.l2_grid}")


#: the longest ``[trust] timeout`` (a year, in seconds): a longer wait overflows the platform's timers
MAX_TIMEOUT = 365 * 24 * 3600.0


def _check_guarantees(spec: JobSpec) -> None:
    t, p = spec.trust, spec.privacy
    from ..federation.reduce import check_max_site_share

    check_max_site_share(t.max_site_share)
    _positive_int(t.min_sites, "[trust] min_sites")
    _positive_int(t.min_holders, "[trust] min_holders")
    if t.min_sites is not None and spec.sites and t.min_sites > len(spec.sites):
        raise JobError(f"[trust] min_sites = {t.min_sites} but the job has {len(spec.sites)} site(s)")
    if t.timeout is not None and not (math.isfinite(t.timeout) and 0 < t.timeout <= MAX_TIMEOUT):
        raise JobError(f"[trust] timeout must be a positive number of seconds, at most {MAX_TIMEOUT:.0f} (a year), "
                       f"got {t.timeout:g}")
    if t.robust and p.secure_aggregation:
        raise JobError("[trust] robust cannot be combined with [privacy] secure_aggregation: the robust reducers "
                       "need each site's values, secure aggregation shows the server only their sum")
    if p.private and spec.schema.profile:
        raise JobError("[schema] profile = true sends each site's coarse column ranges in the clear: not in a job "
                       "with [privacy] secure_aggregation or dp")
    if p.private and spec.evaluation.baselines:
        raise JobError("[evaluation] baselines = true scores each site's own model in the clear: not in a job "
                       "with [privacy] secure_aggregation or dp")
    if spec.training is not None:  # the modes the training step declared (federation.training.steps)
        from ..federation.protocol.modes import check_modes, modes_of
        from ..federation.training.steps import EXACT_TRAINING_MODES  # noqa: F401  (registers the declarations)
        from ..learn.models import make_model

        fm = make_model(spec.training.model)
        try:
            check_modes("training.exact" if fm.exact else "training",
                        modes_of(secure=p.secure_aggregation, dp=p.dp is not None, robust=t.robust),
                        f"the exact-aggregation model {fm.name!r}" if fm.exact else f"the model {fm.name!r}")
        except ValueError as exc:
            raise JobError(f"[privacy] {exc}") from None


def _check_task(spec: JobSpec) -> None:
    """``[training] task``: one of the tasks, and one the model can serve (one line otherwise)."""
    from ..learn.models import make_model
    from ..learn.tasks import TASKS, given_objective, model_refusal

    assert spec.training is not None
    task = spec.training.task
    if task is None:
        return
    if task not in TASKS:
        raise JobError(f"[training] task must be one of {', '.join(TASKS)}, got {task!r}")
    fm = make_model(spec.training.model)
    why = model_refusal(fm.name, task, given_objective(spec.training.model) if fm.name == "gbdt" else None)
    if why is not None:
        raise JobError(f"{spec.source}: [training] {why}")


def check_spec(spec: JobSpec) -> JobSpec:
    """Validate a :class:`JobSpec` however it was built (a job file, a plan, a command's options,
    an estimator's parameters); returns it.

    Raises:
        JobError: naming the key at fault (``[trust] min_sites``) and the source.
    """
    from ..election.selectors import make_selector
    from ..learn.models import make_model

    src = spec.source
    spec.privacy.dp = _dp(spec.privacy.dp, src)
    try:
        if spec.target is None and (spec.training is not None or spec.election is not None):
            raise JobError("the job needs target = \"<label column>\" (it elects or trains)")
        if spec.election is not None:
            _check_election(spec)
        _check_columns(spec)
        _dp_bounds(spec)
        for s in spec.sites:
            if s.selector is not None:
                make_selector(s.selector)
        if spec.training is not None:
            make_model(spec.training.model)
        if spec.run.engine not in ENGINES:
            raise JobError(f"[run] engine must be one of {list(ENGINES)}, got {spec.run.engine!r}")
        if not 0 < spec.run.test_size < 1 and not (spec.run.test_size == 0 and spec.training is None):
            raise JobError(f"[run] test_size must be in (0, 1), got {spec.run.test_size}")
        if spec.training is not None:
            for where, n in (("[training] rounds", spec.training.rounds),
                             ("[training] local_epochs", spec.training.local_epochs)):
                if n < 1:
                    raise JobError(f"{where} must be at least 1, got {n}")
            _check_task(spec)
        if spec.impute is not None:  # rounds = 0: the linear prior alone
            from .steps.imputation import impute_config

            impute_config(spec).validate()
        _check_guarantees(spec)
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
    sites = []
    for name, raw in sites_raw.items():
        if not isinstance(raw, Mapping):
            raise JobError(f"{source}: [sites.{name}] must be a table with path = \"...\"")
        for key in raw:
            if key not in _SITE_KEYS:
                raise _unknown(f"[sites.{name}] ", key, _SITE_KEYS, source)
        path = _typed(raw["path"], None, "Path", f"[sites.{name}] path", source) if raw.get("path") else None
        sites.append(SiteSpec(
            name=str(name),
            path=path if path is None or path.is_absolute() else base / path,
            na_values=_na_values(raw.get("na_values", []), f"[sites.{name}] na_values", source),
            selector=raw.get("selector"),
            min_rows=_min_rows(raw.get("min_rows"), f"[sites.{name}] min_rows", source),
            allow_server_row_sets=_typed(raw.get("allow_server_row_sets", False), False, "bool",
                                         f"[sites.{name}] allow_server_row_sets", source),
            sep=_choice(raw.get("sep"), SEPARATORS, f"[sites.{name}] sep", source),
            decimal=_choice(raw.get("decimal"), DECIMALS, f"[sites.{name}] decimal", source),
        ))
        if sites[-1].sep is not None and sites[-1].sep == sites[-1].decimal:
            raise JobError(f"{source}: [sites.{name}] sep and decimal must differ, both are {sites[-1].sep!r}")
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
