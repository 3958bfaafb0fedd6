"""The front doors (issue 21, item 6): one table-input contract for both estimators, each ``fit``
building a :class:`~fedtab.job.spec.JobSpec` and running the job's step loop, old import paths kept."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.data import classification_table, split_rows
from fedtab.estimators import site_tables
from fedtab.federation.protocol import set_options


@pytest.fixture(scope="module")
def tables():
    table = classification_table(400, 8, 3, 2, seed=1, target="outcome")
    return split_rows(table, [0.5, 0.5], stratify="outcome")


def test_one_contract_names_the_sites():
    a, b = pd.DataFrame({"u": [1.0, 2.0]}), np.ones((3, 2))
    assert list(site_tables(a)) == ["site0"] and list(site_tables(b)["site0"].columns) == ["x0", "x1"]
    assert list(site_tables([a, b])) == ["site0", "site1"]
    named = site_tables({"north": a, "south": b})
    assert list(named) == ["north", "south"] and all(isinstance(t, pd.DataFrame) for t in named.values())
    with pytest.raises(ValueError, match="at least one site table"):
        site_tables([])
    with pytest.raises(ValueError, match="site 'site1': expected a 2D table"):
        site_tables([a, np.ones(3)])
    with pytest.raises(ValueError, match="site 'x': Complex data not supported"):
        site_tables({"x": np.ones((2, 2), dtype=complex)})
    with pytest.raises(TypeError, match="site 'site0': sparse"):
        from scipy import sparse

        site_tables(sparse.csr_matrix(np.ones((2, 2))))
    with pytest.raises(ValueError, match="tables must be"):
        site_tables("a.csv")


def test_old_import_paths_still_work():
    import fedtab
    import fedtab.election
    import fedtab.estimators
    from fedtab.imputer import FederatedImputer, ImputerNotFittedError

    assert fedtab.FederatedFeatureElection is fedtab.estimators.FederatedFeatureElection
    assert fedtab.election.FederatedFeatureElection is fedtab.estimators.FederatedFeatureElection
    assert fedtab.FederatedImputer is FederatedImputer is fedtab.estimators.FederatedImputer
    assert ImputerNotFittedError is fedtab.estimators.ImputerNotFittedError


def test_the_election_estimator_takes_arrays_and_runs_the_job(tables, monkeypatch):
    import fedtab.job.workflow as workflow
    from fedtab import FederatedFeatureElection

    specs = []
    real = workflow.run_workflow
    monkeypatch.setattr(workflow, "run_workflow", lambda fed, spec, **kw: specs.append(spec) or real(fed, spec, **kw))
    frames = FederatedFeatureElection(selector="anova", freedom_degree=0.5).fit(tables, "outcome")
    X = [t.drop(columns="outcome").to_numpy() for t in tables]
    y = [t["outcome"].to_numpy() for t in tables]
    arrays = FederatedFeatureElection(selector="anova", freedom_degree=0.5).fit(X, y)
    np.testing.assert_array_equal(arrays.get_support(), frames.get_support())  # same columns, by position
    assert list(arrays.feature_names_in_) == [f"x{j}" for j in range(8)]
    spec = specs[0]
    assert spec.training is None and spec.election.freedom_degree == 0.5 and spec.election.selector == "anova"
    assert [s.name for s in spec.sites] == ["site0", "site1"] and not spec.schema.profile
    assert not spec.evaluation.baselines  # an election alone: no exchange it does not need


def test_the_imputer_builds_its_job_and_equals_the_workflow(tables):
    pytest.importorskip("torch")
    from fedtab import FederatedImputer
    from fedtab.engines.local import LocalFederation
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation
    from fedtab.federation.site.core import Site

    fast = dict(rounds=2, local_epochs=1, hidden_dim=4, n_layers=1, k_neighbors=3, n_threads=1, seed=3,
                validation_fraction=0.2, robust=True, max_site_share=0.8, min_sites=1, timeout=120)
    parts = [t.drop(columns="outcome").mask(np.random.default_rng(i).random((len(t), 8)) < 0.1)
             for i, t in enumerate(tables)]
    imp = FederatedImputer(**fast)
    spec = imp.job_spec(["site0", "site1"])
    assert (spec.impute.rounds, spec.impute.hidden_dim, spec.run.seed) == (2, 4, 3)
    assert (spec.trust.robust, spec.trust.max_site_share, spec.trust.min_sites, spec.trust.timeout) == (
        True, 0.8, 1, 120.0)
    assert spec.target is None and spec.training is None and spec.election is None
    imp.fit(parts)
    assert imp.job_result_["trust"]["robust"] is True
    assert [s["step"] for s in imp.job_result_["steps"]] == ["imputation"]
    sites = [Site(f"site{i}", p, test_size=0.2, seed=3) for i, p in enumerate(parts)]
    cfg = ImputeConfig(rounds=2, local_epochs=1, hidden_dim=4, n_layers=1, k_neighbors=3, n_threads=1, seed=3)
    fed = LocalFederation(sites)
    set_options(fed, robust=True, max_site_share=0.8)
    direct = run_imputation(fed, cfg)
    assert [h["train_loss"] for h in imp.history_] == [h["train_loss"] for h in direct.history]
    for k, w in direct.weights.items():
        np.testing.assert_array_equal(imp.result_.weights[k], w)


def test_estimator_settings_are_checked_as_job_keys(tables):
    from fedtab import FederatedFeatureElection, FederatedImputer
    from fedtab.job.spec import JobError

    with pytest.raises(JobError, match=r"FederatedFeatureElection: \[election\] aggregation|unknown aggregation"):
        FederatedFeatureElection(aggregation="median").fit(tables, "outcome")
    with pytest.raises(JobError, match=r"FederatedImputer: \[trust\] min_sites = 3 but the job has 2 site\(s\)"):
        FederatedImputer(min_sites=3).job_spec(["a", "b"])
