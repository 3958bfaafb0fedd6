"""What a job can be checked against in the headers of the site files it names, when it is read:
the target is a column of enough files for the quorum, and a DP job has public bounds for every
feature column. A site kept by its own deployment is checked when the run starts.

Every name here is also importable from :mod:`fedtab.job.spec`.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Mapping

from .errors import JobError

if TYPE_CHECKING:
    from .spec import JobSpec, SiteSpec

__all__ = ["check_dp_bounds", "check_site_files", "check_target", "did_you_mean", "dp_columns_without_bounds",
           "needs_dp_bounds"]


def _error(message: str) -> Exception:
    return JobError(message)


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
    raise _error(f"{spec.source}: target = {spec.target!r} is not a column in the file of {where}")


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
        raise _error(f"{spec.source}: [privacy] dp needs public value bounds for every feature column: give "
                       "[columns] bounds = { age = [0, 120], ... } (the data dictionary; or levels = { cp = "
                       "[1, 2, 3, 4] } for coded columns)")
    if missing:
        example = ", ".join(f"{c} = [low, high]" for c in missing[:2])
        raise _error(f"{spec.source}: [privacy] dp needs public value bounds for the column(s) "
                       f"{', '.join(missing)}: add them to [columns] bounds = {{ {example} }} (public ranges, "
                       "not the sites' minimum and maximum) or levels = { column = [codes] }")
    return spec

