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


#: Test files that take a worker for minutes (real Flower deployments, long trainings) and the
#: seconds each took alone, one file at a time, on the shared 2-core machine (load 4-20, so about
#: 2-4x an idle machine's; only their order matters here). ``make test`` runs ``-n 3 --dist
#: loadfile``: xdist hands out whole files in collection order, by default re-sorted by test count,
#: which queued these few-test files last (the killed-SuperNode file 164th of 169): they started
#: when the other workers had nothing left and ran minutes alone. Handed out first, dearest first,
#: the cheap files fill the other workers behind them. A new minutes-long file belongs here.
HEAVY_FILES = {
    "tests/engines/test_engine_flower.py": 501,
    "tests/engines/test_ledger_flower_runs.py": 188,
    "tests/engines/test_flower_guide_loopback.py": 187,
    "tests/engines/test_trust_dropouts_flower.py": 143,
    "tests/federation/protocol/test_summing.py": 99,
    "tests/job/test_job.py": 76,
    "tests/federation/workflows/test_hostile_matrix.py": 62,
    "tests/job/test_job_guarantees.py": 53,
    "tests/engines/test_lean_client.py": 54,
    "tests/engines/test_engine_nvflare.py": 50,
    "tests/cli/test_robust_cli.py": 48,
    "tests/benchmarks/test_bench_vs_nvflare.py": 47,
    "tests/estimators/test_input_contract.py": 46,
    "tests/engines/test_flower_fab_guard.py": 46,
}
#: quick files of many tests (alone: 111 tests in 8 s, 60 in 7 s, 32 in 5 s) that go behind a heavy
#: file of 1 or 2 tests (see :func:`heavy_first`)
FILLERS = ("tests/job/test_constraints.py", "tests/federation/site/test_site.py",
           "tests/election/test_election_rule.py")


def _file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def heavy_first(files: list[tuple[str, int]], heavy: dict[str, float], fillers: tuple[str, ...] = FILLERS,
                ) -> list[str]:
    """``files`` (``(name, number of tests)``, in collection order) reordered for xdist's loadfile
    scheduler: the ``heavy`` ones first, dearest first, every other file after them in its order.

    xdist gives a worker its next file as soon as it has at most 2 tests pending, so a heavy file
    of 1 or 2 tests would have the next file queued behind it on the same worker at once: after
    such a file comes a cheap file of 3 or more tests (``fillers`` first, then any), never a heavy one.
    """
    dear = sorted((f for f in files if f[0] in heavy), key=lambda f: -heavy[f[0]])
    cheap = [f for f in files if f[0] not in heavy]
    preferred = {name: i for i, name in enumerate(fillers)}
    fillers = sorted((f for f in cheap if f[1] > 2), key=lambda f: preferred.get(f[0], len(preferred)))
    order: list[str] = []
    for name, count in dear:
        order.append(name)
        if count <= 2 and fillers:
            order.append(fillers.pop(0)[0])
    placed = set(order)
    return order + [name for name, _ in cheap if name not in placed]


def pytest_collection_modifyitems(config, items):
    """Run the files in :func:`heavy_first` order (the same on every xdist worker, so their
    collections still agree); each file's tests keep their order and stay together."""
    counts: dict[str, int] = {}
    for item in items:
        counts[_file_of(item)] = counts.get(_file_of(item), 0) + 1
    rank = {name: i for i, name in enumerate(heavy_first(list(counts.items()), HEAVY_FILES))}
    items.sort(key=lambda item: rank[_file_of(item)])


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*modules): skip unless each module imports (checked at setup)")
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        # keep the order of pytest_collection_modifyitems (xdist's default re-sorts files by test count)
        config.option.loadscopereorder = False


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
