"""Builders the test modules share: synthetic classification tables split into site parts,
the sites over them (in process), and the parts as CSV files with their engine site configs.

Import them as ``from tests.builders import ...`` (``pythonpath = ["."]`` in pyproject.toml);
pytest fixtures and hooks live in ``tests/conftest.py``. Each module keeps its own numbers
(rows, columns, seeds): the builders only stop every module re-writing the same steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from fedtab.data import classification_table, split_rows
from fedtab.engines.local import LocalFederation
from fedtab.federation.site.core import Site

__all__ = ["classification_parts", "make_sites", "federation", "write_csvs", "write_site_configs",
           "write_classification_sites", "gbdt_parts"]


def classification_parts(n: int, d: int, informative: int, redundant: int,
                         fractions: Sequence[float] = (0.5, 0.3, 0.2), *, seed: int = 0, split_seed: int | None = None,
                         target: str = "target", **table_options: Any) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """``(table, parts)``: ``classification_table(n, d, informative, redundant, seed=seed, **table_options)``
    and its rows split into ``fractions`` stratified by the target (``split_rows`` with ``split_seed``,
    default ``seed``)."""
    table = classification_table(n, d, informative, redundant, seed=seed, target=target, **table_options)
    return table, split_rows(table, fractions, stratify=target, seed=seed if split_seed is None else split_seed)


def make_sites(parts: Sequence[pd.DataFrame], *, names: str = "s{i}", target: str = "target",
               **site_options: Any) -> list[Site]:
    """One :class:`Site` per part, named ``names.format(i=i)``. A site option given as a list or a
    range is per site (``selector=["lasso", "anova", "mutual_info"]``, ``seed=range(3)``)."""
    def option(value: Any, i: int) -> Any:
        return value[i] if isinstance(value, (list, range)) else value

    return [Site(names.format(i=i), part, target, **{k: option(v, i) for k, v in site_options.items()})
            for i, part in enumerate(parts)]


def federation(parts: Sequence[pd.DataFrame], **options: Any) -> LocalFederation:
    """A :class:`LocalFederation` of :func:`make_sites` ``(parts, **options)``."""
    return LocalFederation(make_sites(parts, **options))


def base_rate_parts(seed: int = 0, n: int = 300) -> list[pd.DataFrame]:
    """Three sites with the same coefficients and very different base rates (logit shifts +2, 0,
    -2): four numeric columns ``f0..f3`` and ``target``; a per-site intercept helps."""
    import numpy as np

    rng = np.random.default_rng(seed)
    parts = []
    for shift in (2.0, 0.0, -2.0):
        X = rng.normal(size=(n, 4))
        p = 1 / (1 + np.exp(-(X[:, 0] - X[:, 1] + shift)))
        frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(4)])
        frame["target"] = (rng.random(n) < p).astype(int)
        parts.append(frame)
    return parts


def write_csvs(parts: Sequence[pd.DataFrame], root: Path, stem: str = "site{i}", *, first: int = 0) -> list[Path]:
    """Each part as ``root / stem.format(i=k) + ".csv"`` (no index column), ``k`` counting from
    ``first``; the paths."""
    paths = []
    for k, part in enumerate(parts, start=first):
        paths.append(Path(root) / f"{stem.format(i=k)}.csv")
        part.to_csv(paths[-1], index=False)
    return paths


def write_site_configs(parts: Sequence[pd.DataFrame], root: Path, *, first: int = 1, target: str = "target",
                       **config: Any) -> list[dict]:
    """The parts as ``root/site<k>.csv`` and their engine site configs ``{"name": "site-<k>",
    "data-path", "target", "seed": 0, **config}``, ``k`` counting from ``first``. The seed is the
    sites' operators' choice (a real site without one draws a secret seed of its own,
    :func:`fedtab.engines.site_config.own_split`): every engine then draws the local engine's parts."""
    paths = write_csvs(parts, root, first=first)
    return [{"name": f"site-{k}", "data-path": str(p), "target": target, "seed": 0, **config}
            for k, p in enumerate(paths, start=first)]


def write_classification_sites(root: Path, n: int, d: int, informative: int, redundant: int, *, table_seed: int,
                               split_seed: int, selector: str = "lasso") -> list[dict]:
    """Three sites' CSVs (a 50/30/20 stratified split of one classification table) under
    ``root`` and their engine site configs (``site-1`` ... ``site-3``)."""
    _, parts = classification_parts(n, d, informative, redundant, seed=table_seed, split_seed=split_seed)
    return write_site_configs(parts, root, selector=selector)


def gbdt_parts(seed: int = 3, n: int = 1200, missing: float = 0.05, drop: str | None = "f3") -> list[pd.DataFrame]:
    """Three sites (50/30/20) of a 6-column classification table with ``missing`` of the cells
    NaN and the last site lacking column ``drop``: the boosted trees' heterogeneous case."""
    import numpy as np

    _, parts = classification_parts(n, 6, 4, 1, (0.5, 0.3, 0.2), seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for i, p in enumerate(parts):
        p = p.copy()
        cols = [c for c in p.columns if c != "target"]
        p[cols] = p[cols].mask(rng.random((len(p), len(cols))) < missing)
        if drop is not None and i == 2:
            p = p.drop(columns=[drop])  # one site lacks a column: no imputation needed
        out.append(p)
    return out


class Hostile(Site):
    """A site whose replies of one kind are rewritten by ``tamper(reply) -> reply`` (a hostile site
    in the trust and wire-format tests)."""

    def __init__(self, *args: Any, tamper: Any = None, kind: str = "ballot", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tamper, self.kind = tamper, kind

    def handle(self, request):  # noqa: ANN001, ANN201 - as Site.handle
        reply = super().handle(request)
        if request.kind == self.kind and self.tamper is not None and not reply.is_error:
            reply = self.tamper(reply)
        return reply


def flare_context(workspace: Path, job_id: str, name: str = "site-1") -> Any:
    """The parts of an NVIDIA FLARE ``FLContext`` the fedtab executor reads: the client's name, the
    job id and the workspace folders (``workspace/local`` the site's own config folder,
    ``workspace/<job_id>`` the job's run folder, created)."""
    from types import SimpleNamespace

    ws = SimpleNamespace(get_site_config_dir=lambda: str(workspace / "local"),
                         get_run_dir=lambda job: str(workspace / job))
    engine = SimpleNamespace(get_workspace=lambda: ws)
    (workspace / job_id).mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(get_identity_name=lambda: name, get_job_id=lambda: job_id, get_engine=lambda: engine)


def write_flare_site_file(workspace: Path, own: dict[str, Any]) -> Path:
    """``own`` as the site's own ``workspace/local/fedtab-site.json`` (what a FLARE site keeps)."""
    import json

    path = workspace / "local" / "fedtab-site.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(own))
    return path


def trio_sites(hostile: str | None = None, kind: str = "ballot", n_features: int = 12) -> list[Site]:
    """Three sites of one 300-row classification table (``anova`` selectors): ``h0``, ``h1`` and
    ``h2``, or with ``hostile`` a tampering ``evil`` third site (:class:`Hostile` of that attack on
    replies of ``kind``)."""
    _, parts = classification_parts(300, n_features, 3, 2, [0.4, 0.3, 0.3], seed=1, class_sep=1.5)
    out = make_sites(parts[:2], names="h{i}", selector="anova")
    cls = (lambda *a, **k: Hostile(*a, tamper=hostile, kind=kind, **k)) if hostile else Site
    out.append(cls("evil" if hostile else "h2", parts[2], "target", selector="anova"))
    return out


def assert_hostile_ballot_refused(hostile: Any, match: str) -> None:
    """Gathering ballots from :func:`trio_sites` with ``hostile`` fails in one line naming only the
    tampering site ``evil``, with a reason matching ``match``."""
    import pytest

    from fedtab.federation import SiteError, gather_ballots

    fed = LocalFederation(trio_sites(hostile=hostile))
    with pytest.raises(SiteError, match=f"ballot step failed at 1 site\\(s\\): site 'evil': .*{match}") as exc:
        gather_ballots(fed)
    assert set(exc.value.sites) == {"evil"} and "\n" not in str(exc.value)


def lie_in_newton_hessians(site: Site, shift: float) -> None:
    """Make ``site`` a hostile one: every ``newton`` reply it sends has ``shift`` added to its Hessian."""

    from fedtab.federation import Message

    handle = site.handle

    def lying(request: Any) -> Any:
        reply = handle(request)
        if request.kind != "newton" or reply.is_error:
            return reply
        return Message("newton", {"grad": reply.arrays["grad"], "hess": reply.arrays["hess"] + shift},
                       dict(reply.meta))

    site.handle = lying  # type: ignore[method-assign]
