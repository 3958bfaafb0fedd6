"""Shared fixtures."""

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows


def write_classification_sites(root, n: int, d: int, informative: int, redundant: int, *, table_seed: int,
                               split_seed: int, selector: str = "lasso") -> list[dict]:
    """Three sites' CSVs (a 50/30/20 stratified split of one classification table) under
    ``root`` and their engine site configs."""
    table = classification_table(n, d, informative, redundant, seed=table_seed)
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify="target", seed=split_seed)
    configs = []
    for i, part in enumerate(parts):
        path = root / f"site{i + 1}.csv"
        part.to_csv(path, index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(path), "target": "target", "selector": selector})
    return configs


@pytest.fixture(scope="session")
def classification_sites():
    """:func:`write_classification_sites`, for module-scoped fixtures."""
    return write_classification_sites


@pytest.fixture
def imputation_site_configs(tmp_path):
    """Two sites' CSVs (8 numeric columns, 10 % missing cells) and their engine site configs."""
    table = classification_table(400, 8, 4, 2, seed=6).drop(columns=["target"])
    table = table.mask(np.random.default_rng(0).random(table.shape) < 0.1)
    configs = []
    for i, part in enumerate(split_rows(table, [0.5, 0.5], seed=0)):
        part.to_csv(tmp_path / f"imp{i}.csv", index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(tmp_path / f"imp{i}.csv"), "target": ""})
    return configs


def make_job_plan(target: str | None = "target", **sections) -> dict:
    """A job plan (``JobSpec.plan()``) as the engines carry it in their run config, validated.

    By default the pipeline-sized job the engine tests compare: no column profile and no
    baselines (``schema.profile`` / ``evaluation.baselines`` false), so a job of an election
    and training costs rounds + 3 exchanges; ``sections`` are the job's tables by name.
    """
    from fedtab.job.spec import parse_job

    doc = {"schema": {"profile": False}, "evaluation": {"baselines": False}, **sections}
    if target is not None:
        doc["target"] = target
    return parse_job(doc, sites_required=False).plan()


def run_config(plan: dict, **engine_keys) -> dict:
    """The run config of ``plan`` (the plan as JSON under ``job``) plus engine keys (``min-sites``...)."""
    import json

    return {"job": json.dumps(plan), **engine_keys}


def run_locally(site_configs: list[dict], plan: dict, **kwargs) -> dict:
    """``plan`` on the in-process engine, sites built from ``site_configs``: the job's result."""
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.spec import spec_from_plan
    from fedtab.job.workflow import run_workflow

    return run_workflow(LocalFederation([build_site(c) for c in site_configs]), spec_from_plan(plan), **kwargs).result


@pytest.fixture(scope="session")
def jobs():
    """The job builders for tests and module-scoped fixtures: ``jobs.plan`` (:func:`make_job_plan`),
    ``jobs.config`` (:func:`run_config`), ``jobs.local`` (:func:`run_locally`)."""
    from types import SimpleNamespace

    return SimpleNamespace(plan=make_job_plan, config=run_config, local=run_locally)
