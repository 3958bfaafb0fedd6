"""Shared fixtures, and the ``requires`` marker (shared plain builders: ``tests/builders.py``)."""

import os

# One thread per OpenMP/BLAS pool, here and in every process the tests start (engines' site
# processes, benchmarks), set before numpy/scikit-learn/torch load them: the tables are tiny, and
# two OpenMP threads on a 2-core machine that other jobs also load spin at every barrier (the
# HistGradientBoosting Markov-blanket test: 0.2 s with one thread, 7 s to 65 s with two under load).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fedtab.data import classification_table, split_rows  # noqa: E402
from tests.builders import write_csvs  # noqa: E402


@pytest.fixture
def imputation_site_configs(tmp_path):
    """Two sites' CSVs (8 numeric columns, 10 % missing cells) and their engine site configs."""
    table = classification_table(400, 8, 4, 2, seed=6).drop(columns=["target"])
    table = table.mask(np.random.default_rng(0).random(table.shape) < 0.1)
    paths = write_csvs(split_rows(table, [0.5, 0.5], seed=0), tmp_path, "imp{i}")
    return [{"name": f"site-{i + 1}", "data-path": str(p), "target": "", "seed": 0} for i, p in enumerate(paths)]


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*modules): skip unless each module imports (checked at setup)")


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("torch", ...)``: ``pytest.importorskip`` each module when the test runs,
    not when its file is collected (collection stays fast; a missing or broken install still skips)."""
    for mark in item.iter_markers("requires"):
        for name in mark.args:
            pytest.importorskip(name)


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
    """The run config of ``plan`` (the plan as JSON under ``job``, the job's server app under
    ``server-app``: :func:`fedtab.job.apps.engine_config`) plus engine keys (``min-sites``...)."""
    from fedtab.job.apps import engine_config

    return engine_config(plan, **engine_keys)


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
