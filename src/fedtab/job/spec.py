"""The job file: a TOML document (or a dict) -> a validated :class:`JobSpec`.

The keys, their types and defaults are listed in ``docs/job.md``. Parsing never reads a
site's table; :func:`load_job` only resolves paths relative to the job file. Every error
is a :class:`JobError` whose message names the key at fault (``[training] rounds``) and,
for an unknown key, the closest valid one.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["JobError", "JobSpec", "SiteSpec", "ImputeSpec", "ElectionSpec", "TrainingSpec", "RunSpec",
           "ENGINES", "TUNERS", "load_job", "parse_job"]

ENGINES = ("local", "flower", "nvflare")
TUNERS = ("none", "grid", "hill-climb")


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


@dataclass
class ImputeSpec:
    """FedHF-Impute settings (fields of :class:`fedtab.federation.impute_flow.ImputeConfig`)."""

    rounds: int = 20
    local_epochs: int = 2
    hidden_dim: int = 32
    n_layers: int = 3
    k_neighbors: int = 10
    lr: float = 3e-3
    mask_fraction: float = 0.4
    prior: bool = True
    prior_rank: int | None = None


@dataclass
class ElectionSpec:
    """Feature Election settings; ``tune`` chooses the freedom degree, else ``freedom_degree`` is used."""

    selector: Any = "lasso"
    freedom_degree: float | None = None
    tune: str = "none"
    aggregation: str = "weighted"
    normalization: str = "all"
    compat: str | None = None
    tolerance: float = 0.01
    consensus: str = "intersection"
    consensus_alpha: float = 0.05


@dataclass
class TrainingSpec:
    """FedAvg training: ``model`` is a name or ``{name, params}``."""

    model: Any = "logistic"
    rounds: int = 10
    local_epochs: int = 5


@dataclass
class RunSpec:
    """Run settings; ``out`` is relative to the job file."""

    seed: int = 0
    out: Path = Path("run-out")
    test_size: float = 0.2
    engine: str = "local"


@dataclass
class JobSpec:
    """A validated job. ``impute`` / ``election`` are ``None`` when their table is absent."""

    target: str
    sites: list[SiteSpec]
    na_values: list[str] = field(default_factory=list)
    impute: ImputeSpec | None = None
    election: ElectionSpec | None = None
    training: TrainingSpec = field(default_factory=TrainingSpec)
    run: RunSpec = field(default_factory=RunSpec)
    source: str = "<dict>"

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-able data (paths as strings), for ``result.json`` and the model file."""

        def plain(v: Any) -> Any:
            if isinstance(v, Path):
                return str(v)
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v

        return plain(asdict(self))


_SECTIONS: dict[str, type] = {"impute": ImputeSpec, "election": ElectionSpec, "training": TrainingSpec, "run": RunSpec}
_TOP = ("target", "na_values", "sites", *_SECTIONS)
_SITE_KEYS = ("path", "na_values", "selector", "min_rows")


def _unknown(where: str, key: str, valid: tuple[str, ...] | list[str], source: str) -> JobError:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(valid)})"
    return JobError(f"{source}: unknown key {where}{key!r}{hint}")


def _typed(value: Any, default: Any, annotation: str, where: str, source: str) -> Any:
    """Check ``value`` against the field's declared type (from the dataclass annotation string)."""
    def bad(kind: str) -> JobError:
        return JobError(f"{source}: {where} must be {kind}, got {value!r}")

    if annotation in ("int", "int | None"):
        if value is None and "None" in annotation:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if annotation in ("float", "float | None"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if annotation == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if annotation == "str":
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


def _na_values(value: Any, where: str, source: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobError(f"{source}: {where} must be a list of strings, got {value!r}")
    return list(value)


def _check_choices(spec: JobSpec) -> None:
    from ..election.evidence import check_consensus, check_consensus_alpha
    from ..election.rule import check_aggregation, check_normalization, check_profile
    from ..election.selectors import make_selector
    from ..learn.models import make_model

    src = spec.source
    try:
        if spec.election is not None:
            e = spec.election
            if e.tune not in TUNERS:
                raise JobError(f"[election] tune must be one of {list(TUNERS)}, got {e.tune!r}")
            if e.tune != "none" and e.freedom_degree is not None:
                raise JobError("[election] give either tune or freedom_degree, not both")
            if e.freedom_degree is not None and not 0 <= e.freedom_degree <= 1:
                raise JobError(f"[election] freedom_degree must be in [0, 1], got {e.freedom_degree}")
            check_aggregation(e.aggregation)
            check_normalization(e.normalization)
            check_profile(e.compat, e.normalization)
            check_consensus(e.consensus)
            check_consensus_alpha(e.consensus_alpha)
            make_selector(e.selector)
        for s in spec.sites:
            if s.selector is not None:
                make_selector(s.selector)
        make_model(spec.training.model)
        if spec.run.engine not in ENGINES:
            raise JobError(f"[run] engine must be one of {list(ENGINES)}, got {spec.run.engine!r}")
        if not 0 < spec.run.test_size < 1:
            raise JobError(f"[run] test_size must be in (0, 1), got {spec.run.test_size}")
        for where, n in (("[training] rounds", spec.training.rounds), ("[training] local_epochs", spec.training.local_epochs),
                         *((("[impute] rounds", spec.impute.rounds),) if spec.impute else ())):
            if n < 1:
                raise JobError(f"{where} must be at least 1, got {n}")
    except JobError as exc:
        raise JobError(f"{src}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise JobError(f"{src}: {exc}") from None


def parse_job(doc: Mapping[str, Any], base_dir: str | Path = ".", source: str = "<dict>") -> JobSpec:
    """Validate a job document (the parsed TOML) and resolve site paths against ``base_dir``.

    Raises:
        JobError: an unknown key (with the closest valid key), a missing ``target`` or
            ``sites``, a value of the wrong type, an unknown selector/model/engine/tuner.
    """
    if not isinstance(doc, Mapping):
        raise JobError(f"{source}: a job must be a table of keys, got {type(doc).__name__}")
    for key in doc:
        if key not in _TOP:
            raise _unknown("", key, _TOP, source)
    if "target" not in doc:
        raise JobError(f"{source}: the job needs target = \"<label column>\"")
    target = _typed(doc["target"], None, "str", "target", source)
    sites_raw = doc.get("sites")
    if not isinstance(sites_raw, Mapping) or not sites_raw:
        raise JobError(f"{source}: the job needs at least one [sites.<name>] table")
    base = Path(base_dir)
    sites = []
    for name, raw in sites_raw.items():
        if not isinstance(raw, Mapping):
            raise JobError(f"{source}: [sites.{name}] must be a table with path = \"...\"")
        for key in raw:
            if key not in _SITE_KEYS:
                raise _unknown(f"[sites.{name}] ", key, _SITE_KEYS, source)
        path = _typed(raw["path"], None, "Path", f"[sites.{name}] path", source) if "path" in raw else None
        sites.append(SiteSpec(
            name=str(name),
            path=path if path is None or path.is_absolute() else base / path,
            na_values=_na_values(raw.get("na_values", []), f"[sites.{name}] na_values", source),
            selector=raw.get("selector"),
            min_rows=_min_rows(raw.get("min_rows"), f"[sites.{name}] min_rows", source),
        ))
    sections = {k: _section(cls, doc[k], k, source) for k, cls in _SECTIONS.items() if k in doc}
    run = sections.get("run", RunSpec())
    if not run.out.is_absolute():
        run.out = base / run.out
    spec = JobSpec(
        target=target,
        sites=sites,
        na_values=_na_values(doc.get("na_values", []), "na_values", source),
        impute=sections.get("impute"),
        election=sections.get("election"),
        training=sections.get("training", TrainingSpec()),
        run=run,
        source=source,
    )
    _check_choices(spec)
    return spec


def load_job(path_or_doc: str | Path | Mapping[str, Any]) -> JobSpec:
    """Read and validate a job file (TOML), or validate a dict (paths relative to the cwd).

    Raises:
        JobError: the file is missing or not valid TOML, or as :func:`parse_job`.
    """
    if isinstance(path_or_doc, Mapping):
        return parse_job(path_or_doc)
    p = Path(path_or_doc)
    if not p.is_file():
        raise JobError(f"{p}: no such job file")
    try:
        doc = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise JobError(f"{p}: not a valid TOML file ({exc})") from None
    return parse_job(doc, p.parent, source=str(p))
