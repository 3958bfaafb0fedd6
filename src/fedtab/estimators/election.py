"""``FederatedFeatureElection``: the scikit-learn-style front door of Feature Election.

A simulation study in three lines::

    fe = FederatedFeatureElection(selector="lasso", freedom_degree=0.5).fit(tables, "target")
    fe.get_support(), fe.feature_names_out_
    fe.explain()

With ``fdr=q`` the columns are chosen instead by the pooled score test with error control
(``[election] method = "score-test"``, ``fdr = q``: every column's score test on the sites'
pooled rows, one Benjamini-Hochberg or Benjamini-Yekutieli correction at false discovery
rate ``q``; :func:`fedtab.election.score_test.fdr_score_selection`)::

    fe = FederatedFeatureElection(fdr=0.05).fit(tables, "target")
    fe.rejected_, fe.p_values_

``fit`` wraps each table in a :class:`~fedtab.federation.site.core.Site` (every row votes), builds
the :class:`~fedtab.job.spec.JobSpec` of an election (:meth:`FederatedFeatureElection.job_spec`)
and runs the job's step loop over an in-process :class:`~fedtab.engines.local.LocalFederation`:
the same ballots, wire format, validation and rule as a deployment on Flower or FLARE.
Tables follow the estimators' input contract (:mod:`fedtab.estimators.tables`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numbers

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, clone
from sklearn.feature_selection import SelectorMixin
from sklearn.utils.validation import check_is_fitted

from .tables import site_tables

if TYPE_CHECKING:
    from ..job.spec import JobSpec

__all__ = ["FederatedFeatureElection", "VOTE_SETTINGS", "vote_settings"]

#: the vote's settings (Feature Election) the pooled score test does not use, at their defaults
VOTE_SETTINGS: dict[str, Any] = {"selector": "lasso", "freedom_degree": 0.5, "tune": "none", "aggregation": "weighted",
                                 "normalization": "all", "compat": None, "consensus": "intersection",
                                 "consensus_alpha": 0.05, "pooled_comparison": False}


def _at_default(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, (bool, np.bool_)):
        return isinstance(value, (bool, np.bool_)) and bool(value) == default
    if value is None or isinstance(value, (str, numbers.Real)):
        return bool(value == default)
    return False  # an estimator, a spec dict, one selector per site: set by the user


def vote_settings(given: Mapping[str, Any]) -> list[str]:
    """The names of :data:`VOTE_SETTINGS` that ``given`` sets away from their defaults (a name
    ``given`` lacks counts as its default): what a score-test selection would silently ignore."""
    return [k for k, d in VOTE_SETTINGS.items() if k in given and not _at_default(given[k], d)]


def _per_site(value: Any, names: list[str], what: str) -> list[Any]:
    """``value`` for every site: a dict by site name, a list in site order, or one shared
    value (a selector spec ``{"name": ..., "params": ...}`` is one shared value)."""
    if isinstance(value, Mapping) and not (what == "selector" and "name" in value and "name" not in names):
        missing = [n for n in names if n not in value]
        if missing:
            raise ValueError(f"{what} has no entry for sites {missing}")
        return [value[n] for n in names]
    if isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise ValueError(f"{len(value)} {what} entries for {len(names)} sites")
        return list(value)
    return [value] * len(names)


def _own_copy(selector: Any) -> Any:
    """A fresh unfitted copy of an estimator (each site fits its own); other specs as given."""
    return clone(selector) if hasattr(selector, "get_params") and not isinstance(selector, type) else selector


class FederatedFeatureElection(SelectorMixin, BaseEstimator):
    """Feature Election over one table per site, as a scikit-learn selector.

    Args:
        selector: what every site selects with: a built-in name (``"lasso"``), a
            ``{"name", "params"}`` spec, a fedtab selector, any scikit-learn selector
            (``SelectKBest(k=5)``, ``SelectFromModel(...)``, ``RFE(...)``), or a callable
            ``(X, y) -> (mask, scores)``; or a list (site order) / dict (by site name) of
            those, one per site. Each site fits its own clone.
        freedom_degree: ``fd`` in [0, 1] (0 = intersection, 1 = union).
        aggregation: ``"weighted"`` (by sample count) or ``"uniform"``.
        compat: ``None`` (fedtab's rule) or ``"nvflare"`` / ``"flash"`` / ``"flower"``
            (see :mod:`fedtab.election.compat`).
        normalization: ``"all"`` or ``"selected"`` (fedtab's rule only).
        pooled_comparison: also run the (one, shared) selector on all sites' rows stacked
            and compare: ``pooled_support_`` and ``pooled_agreement_`` (Jaccard of the
            elected mask with the pooled mask per freedom degree), and a ``pooled``
            column in :meth:`explain`. Simulation only (no real server holds the pooled
            rows); costs one selector run on the pooled table.
        consensus: ``"intersection"`` (the rule) or ``"stouffer"``: the consensus is the
            features whose combined p-value over the sites (Stouffer's weighted Z of
            their selectors' test p-values) passes Benjamini-Hochberg at
            ``consensus_alpha`` -- robust to label-skewed sites (see
            :mod:`fedtab.election.evidence`); needs a test-based selector
            (``"anova"``, ``"chi2"``, ``SelectKBest``/``SelectFdr`` over a test).
        consensus_alpha: that consensus's false discovery rate.
        fdr: ``None`` (the vote), or the false discovery rate ``q`` in (0, 1) of the
            selection with error control: no vote, every column's score test on the sites'
            pooled rows and one correction at ``q`` (the job's ``[election] method =
            "score-test"``, ``fdr = q``; binary targets, or each class against the rest). The
            vote's settings (``selector``, ``freedom_degree``, ``aggregation``,
            ``normalization``, ``compat``, ``consensus``, ``consensus_alpha``,
            ``pooled_comparison``) must then stay at their defaults.
        fdr_method: that correction, ``"bh"`` (Benjamini-Hochberg, independent or
            positively dependent columns) or ``"by"`` (Benjamini-Yekutieli, any dependence);
            only with ``fdr``.

    Sites whose rows hold a single target value abstain from the vote (``abstained_``: site ->
    reason); the score test counts their rows.

    Learned attributes: ``result_`` (:class:`~fedtab.election.rule.ElectionResult`),
    ``ballots_`` (one :class:`~fedtab.election.ballot.Ballot` per site), ``site_names_``,
    ``feature_names_in_`` (the global feature order: ordered union of the sites'
    columns), ``n_features_in_``, ``support_`` and ``feature_names_out_`` (the elected
    names, in the global order), ``job_result_`` (the run's ``steps``, ``privacy``, ``trust``
    and ``participation``, as in a job's ``result.json``), ``sites_`` (per site ``n_train`` and
    ``columns``), ``fdr_`` and ``fdr_method_`` (the chosen ``q`` and correction; ``None`` for
    the vote). With ``fdr``: ``result_`` is the
    :class:`~fedtab.federation.workflows.score_test.server.PooledScoreTest`, ``ballots_`` is
    empty, ``p_values_`` ``(n_features_in_,)`` the pooled p-values, ``rejected_`` the names
    whose null hypothesis (no association with the label) was rejected at ``q`` (the kept
    columns; ``None`` for the vote) and ``election_`` the job's ``result["election"]`` record.

    Raises (in ``fit``): ValueError, one line naming the parameter: ``fdr`` outside (0, 1) or
    not a number, ``fdr_method`` not ``"bh"``/``"by"`` or given without ``fdr``, a vote
    setting changed together with ``fdr``.
    """

    def __init__(self, selector: Any = "lasso", freedom_degree: float = 0.5, aggregation: str = "weighted",
                 compat: str | None = None, normalization: str = "all", pooled_comparison: bool = False,
                 consensus: str = "intersection", consensus_alpha: float = 0.05, fdr: float | None = None,
                 fdr_method: str = "bh") -> None:
        self.selector = selector
        self.freedom_degree = freedom_degree
        self.aggregation = aggregation
        self.compat = compat
        self.normalization = normalization
        self.pooled_comparison = pooled_comparison
        self.consensus = consensus
        self.consensus_alpha = consensus_alpha
        self.fdr = fdr
        self.fdr_method = fdr_method

    def fit(self, tables: Any, target: Any = None) -> "FederatedFeatureElection":
        """Elect from one table per site.

        Args:
            tables: one table per site (:mod:`fedtab.estimators.tables`): a list of
                DataFrames or 2-D arrays (sites ``site0``, ``site1``...), a dict name -> table,
                or one table (one site). Columns are matched by name; sites may hold different
                columns (``compat`` profiles need the same).
            target: the label column's name in every table, or one label array per site
                (a list in site order or a dict by name; the tables then hold only features).

        Raises:
            ValueError: no tables, a missing target, a bad setting (unknown aggregation,
                compat, fd outside [0, 1]; a :class:`~fedtab.job.spec.JobError`).
            fedtab.federation.protocol.FederationError: a site's selector failed or sent an
                invalid ballot (naming the site).
        """
        from ..engines.local import LocalFederation
        from fedtab.federation.site.core import Site
        from ..job.workflow import run_workflow

        named = site_tables(tables)
        names = list(named)
        if target is None:
            raise ValueError("fit needs the target: a column name or one label array per site")
        if isinstance(target, str):
            frames = named
            column = target
        else:
            labels = _per_site(target, names, "target")
            column = "__fedtab_target__"
            frames = {}
            for (name, frame), y in zip(named.items(), labels):
                y = np.asarray(y)
                if y.ndim != 1 or len(y) != len(frame):
                    raise ValueError(f"site {name!r}: target has shape {y.shape}, the table {len(frame)} rows")
                frames[name] = frame.assign(**{column: y})
        selectors = _per_site(self.selector, names, "selector")
        spec = self.job_spec(column, dict(zip(names, selectors)))
        sites = [Site(name, frame, column, test_size=0.0, selector=_own_copy(sel))
                 for (name, frame), sel in zip(frames.items(), selectors)]
        outputs = run_workflow(LocalFederation(sites), spec)
        self.job_result_ = {k: outputs.result[k] for k in ("steps", "privacy", "trust", "participation")}
        self.site_names_ = names
        q = spec.election.fdr
        self.fdr_, self.fdr_method_ = q, (None if q is None else spec.election.fdr_method)
        result = self._fit_vote(outputs) if q is None else self._fit_score_test(outputs)
        self.feature_names_in_ = np.asarray(list(result.feature_names), dtype=object)
        self.n_features_in_ = len(self.feature_names_in_)
        self.support_ = np.asarray(result.mask, dtype=bool)
        self.feature_names_out_ = self.feature_names_in_[self.support_]
        if self.pooled_comparison:
            self._compare_with_pooled(sites, column, selectors, self.ballots_)
        return self

    def _fit_vote(self, outputs: Any) -> Any:
        """The vote's fitted state from the job's outputs; returns its ``ElectionResult``."""
        outcome = outputs.outcomes["election"]
        self.result_, self.ballots_, self.abstained_ = outcome.result, outcome.ballots, dict(outcome.abstained)
        self.sites_ = {b.site: {"n_train": b.n_samples, "columns": list(b.feature_names or outcome.result.feature_names)}
                       for b in self.ballots_}
        self.rejected_ = None
        return outcome.result

    def _fit_score_test(self, outputs: Any) -> Any:
        """The score test's fitted state from the job's outputs (the ``PooledScoreTest`` and the
        record the job's score-test step wrote); returns the ``PooledScoreTest``."""
        self.result_, self.ballots_, self.abstained_ = outputs.outcomes["election"], [], {}
        self.election_ = outputs.result["election"]
        self.sites_ = {s: {"n_train": info["n_train"], "columns": list(info["columns"])}
                       for s, info in (outputs.result["sites"] or {}).items()}
        self.p_values_ = np.asarray(self.result_.p, dtype=np.float64)
        self.rejected_ = np.asarray(self.result_.selected_names, dtype=object)
        return self.result_

    def _fdr_level(self) -> float | None:
        """``fdr`` checked (a float in (0, 1), or ``None`` for the vote) with ``fdr_method``.

        Raises:
            ValueError: one line naming the bad parameter (class docstring)."""
        from ..election.score_test import check_fdr

        check_fdr(0.05, self.fdr_method)
        if self.fdr is None:
            if self.fdr_method != "bh":
                raise ValueError(f"fdr_method={self.fdr_method!r} applies with fdr = q (the score test's selection); "
                                 "give fdr too")
            return None
        q = self.fdr
        if isinstance(q, numbers.Real) and not isinstance(q, (bool, np.bool_, int, float)):
            q = float(q)  # numpy's floats (np.float32 is no float)
        check_fdr(q, self.fdr_method)
        given = vote_settings(self.get_params(deep=False))
        if given:
            raise ValueError(f"fdr selects by the pooled score test, without a vote: {', '.join(given)} "
                             f"{'applies' if len(given) == 1 else 'apply'} to the vote (leave at the default or drop fdr)")
        return float(q)

    def job_spec(self, target: str, selectors: Mapping[str, Any]) -> "JobSpec":
        """The validated job :meth:`fit` runs: an election (no training) at this estimator's
        settings over sites ``selectors`` (name -> selector), every row voting; with ``fdr`` the
        score test's selection at that false discovery rate instead.

        Raises:
            ValueError: a bad ``fdr`` / ``fdr_method`` or a vote setting with ``fdr``.
            fedtab.job.spec.JobError: a bad setting, naming it.
        """
        from ..job.spec import (ElectionSpec, EvaluationSpec, JobSpec, RunSpec, SchemaSpec, SiteSpec,
                                check_spec)
        from ..election.ballot import check_freedom_degree

        q = self._fdr_level()
        if q is None:
            check_freedom_degree(self.freedom_degree)
            election = ElectionSpec(selector=next(iter(selectors.values())), freedom_degree=self.freedom_degree,
                                    aggregation=self.aggregation, normalization=self.normalization,
                                    compat=self.compat, consensus=self.consensus, consensus_alpha=self.consensus_alpha)
        else:
            election = ElectionSpec(selector=next(iter(selectors.values())), method="score-test", fdr=q,
                                    fdr_method=self.fdr_method)
        return check_spec(JobSpec(target=target, sites=[SiteSpec(n, None, selector=s) for n, s in selectors.items()],
                                  election=election, training=None, run=RunSpec(test_size=0.0),
                                  schema=SchemaSpec(profile=False), evaluation=EvaluationSpec(baselines=False),
                                  source=type(self).__name__))

    def _compare_with_pooled(self, sites: list[Any], column: str, selectors: list[Any], ballots: list[Any]) -> None:
        from ..election.agreement import DEFAULT_FREEDOM_DEGREES, pooled_agreement, pooled_mask
        from ..election.rule import RuleSettings

        if any(s is not selectors[0] and s != selectors[0] for s in selectors):
            raise ValueError("pooled_comparison needs one selector shared by every site, got one per site")
        names = list(self.feature_names_in_)
        self.pooled_support_ = pooled_mask([s.rows("all") for s in sites], column, _own_copy(selectors[0]), names)
        fds = sorted({*DEFAULT_FREEDOM_DEGREES, float(self.freedom_degree)})
        self.pooled_agreement_ = pd.DataFrame(pooled_agreement(
            ballots, self.pooled_support_, feature_names=names, freedom_degrees=fds,
            rule=RuleSettings(aggregation=self.aggregation, normalization=self.normalization, compat=self.compat,
                              consensus=self.consensus, consensus_alpha=self.consensus_alpha,
                              min_holders=self.result_.min_holders)))

    def report_data(self) -> dict[str, Any]:
        """The fitted election as the result data :func:`fedtab.report.write_report` reads:
        ``election`` (settings, stats, ``features`` = :meth:`ElectionResult.explain_records`
        and, with ``pooled_comparison``, ``pooled_agreement`` = the Jaccard agreement per
        freedom degree; with ``fdr`` the job's score-test record: ``method``, ``fdr``, ``p``...),
        ``sites`` (training rows and columns of each site that took part) and the run's
        ``steps``, ``privacy``, ``trust`` and ``participation`` (``job_result_``)."""
        check_is_fitted(self, "result_")
        if self.fdr_ is not None:
            election = dict(self.election_)
        else:
            election = {**self.result_.to_dict(), "features": self.result_.explain_records()}
        if getattr(self, "pooled_agreement_", None) is not None:
            election["pooled_agreement"] = self.pooled_agreement_.to_dict("records")
        return {"election": election, "sites": dict(self.sites_), "abstained": dict(self.abstained_),
                **self.job_result_}

    def write_report(self, path: Any) -> Any:
        """Write the self-contained election page (the ``elect`` template) of :meth:`report_data` to
        ``path``; returns the path."""
        from ..report import write_report

        return write_report(self.report_data(), path, command="elect")

    def _get_support_mask(self) -> np.ndarray:
        check_is_fitted(self, "support_")
        return self.support_

    def explain(self) -> pd.DataFrame:
        """One row per feature: held_by, selected_by, vote, rank, kept, reason (and
        ``pooled``: kept by the selector on the pooled rows, with ``pooled_comparison``); with
        ``fdr``: feature, p_value (pooled), kept (rejected at ``q``)."""
        check_is_fitted(self, "result_")
        if self.fdr_ is not None:
            return pd.DataFrame({"feature": self.feature_names_in_.astype(str), "p_value": self.p_values_,
                                 "kept": self.support_})
        table = self.result_.explain()
        if getattr(self, "pooled_support_", None) is not None:
            table["pooled"] = self.pooled_support_
        return table

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # transform only picks columns
        return tags
