"""A job's data dictionary reaches a plain GBDT run (issue 28, item 2): the columns of
``[columns] bounds`` are binned on the equal-width grid of their bounds (no site's values, no
sketch exchange for them); the others by the quantile sketch."""

from __future__ import annotations

import numpy as np

from fedtab import load_model
from fedtab.job.run import run_job
from fedtab.learn.gbdt.grid import public_grid
from tests.job.test_dp_bounds import _write

MAX_BINS = 16


def _job(folder, bounds: str):
    path = folder / "job.toml"
    path.write_text('target = "y"\n'
                    '[sites.a]\npath = "a.csv"\nallow_server_row_sets = true\n'
                    '[sites.b]\npath = "b.csv"\nallow_server_row_sets = true\n'
                    f'[training]\n[training.model]\nname = "gbdt"\nparams = {{ n_trees = 3, max_depth = 2, max_bins = {MAX_BINS} }}\n'
                    + (f'[columns]\nbounds = {{ {bounds} }}\n' if bounds else ''))
    return path


def _edges(out) -> dict[str, np.ndarray]:
    m = load_model(out / "model.fedtab")
    e, p = m.arrays["model/edges"], m.arrays["model/edge_ptr"]
    return {f: e[p[i]:p[i + 1]] for i, f in enumerate(m.features)}


def test_the_job_bounds_bin_their_columns_on_the_public_grid(tmp_path, monkeypatch):
    _write(tmp_path, "a.csv", ["age", "chol"], n=200)
    _write(tmp_path, "b.csv", ["age", "chol"], n=200, seed=1)
    asked: list[list[str]] = []  # the columns of every sketch request a site answered
    from fedtab.federation.workflows.gbdt import site as gbdt_site
    from fedtab.federation.site import registry

    plain = registry.HANDLERS["gbdt_sketch"]

    def spy(site, request):
        asked.append(list(request.meta["features"]))
        return plain(site, request)

    monkeypatch.setitem(registry.HANDLERS, "gbdt_sketch", spy)
    assert gbdt_site  # the handler module is imported (its registration is what the spy wraps)

    run_job(_job(tmp_path, "age = [0, 120]"), out=tmp_path / "one")
    edges = _edges(tmp_path / "one")
    np.testing.assert_array_equal(edges["age"], public_grid([0.0], [120.0], MAX_BINS)[0])
    assert asked and all(cols == ["chol"] for cols in asked)  # no sketch of the bounded column
    assert not np.allclose(np.diff(edges["chol"]), np.diff(edges["chol"]).mean(), rtol=1e-3)  # quantiles

    asked.clear()
    run_job(_job(tmp_path, "age = [0, 120], chol = [0, 100]"), out=tmp_path / "all")
    edges = _edges(tmp_path / "all")
    np.testing.assert_array_equal(edges["chol"], public_grid([0.0], [100.0], MAX_BINS)[0])
    assert asked == []  # every column bounded: no sketch exchange at all

    run_job(_job(tmp_path, ""), out=tmp_path / "none")  # without a dictionary: the sketch for both
    edges = _edges(tmp_path / "none")
    assert not np.array_equal(edges["age"], public_grid([0.0], [120.0], MAX_BINS)[0])
    assert asked and asked[-1] == ["age", "chol"]
