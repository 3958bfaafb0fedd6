"""Freedom-degree tuning as a federated workflow (engine-independent).

Steps (each a request built on the server, a pure site handler, a validated reduction):

1. The fit and validation rows are each site's own fixed parts ``"fit"`` / ``"validation"``
   (``fit:0`` / ``fold:0`` of its cross-validation folds, :mod:`fedtab.federation.site.parts`),
   drawn by the site from its own seed: the server neither sizes nor seeds them. The test
   part is never touched. A site without folds validates nothing (its fit rows are all
   its training rows).
2. ``"ballot_fit"`` — every site runs its selector on its fit rows and sends a ballot.
3. For each candidate fd the server elects a mask from those ballots (no traffic);
   each *distinct* mask is scored by :func:`~fedtab.federation.workflows.training.run_training`
   on the fit rows, evaluated on the validation rows. The score is the sample-weighted
   mean of the sites' validation weighted-F1 (``Σ n_i F1_i / Σ n_i``).
4. The search (:mod:`fedtab.election.tuning`) picks fd; the mask it elects is sent to the
   sites with ``"set_mask"`` (unless ``apply=False``), ready for the final
   ``run_training`` on the train/test split.

Nothing here depends on an engine: only :class:`~fedtab.federation.protocol.Federation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

from fedtab._settings import settings_with
from fedtab.election.ballot import Ballot
from fedtab.election.rule import ElectionResult
from fedtab.election.tuning import DEFAULT_GRID, TuningResult, tune
from fedtab.federation.workflows.election.server import (_selector_request, _valid_ballots, ballot_checker, broadcast_mask, elect_from_ballots)
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, exchange
from fedtab.federation.protocol.modes import declare_modes, run_strategy
from fedtab.federation.workflows.training import run_training

__all__ = ["TuneOutcome", "TuneSettings", "tune_flow", "tune_and_train", "split_validation", "gather_fit_ballots", "validation_scorer"]

#: the modes freedom-degree tuning runs in: plain sums only (its validation fits and ballots are
#: answered per site)
TUNING_MODES = declare_modes("tuning")


def split_validation(federation: Federation) -> dict[str, dict[str, int]]:
    """``{site: {"n_fit", "n_validation"}}``: the sizes of each site's own fit and validation
    parts, as it declared them in the agreed schema (no exchange: the sites draw them).

    Raises:
        ValueError: no schema agreed yet (run an exchange first, e.g. the fit ballots).
    """
    schema = federation.schema
    if schema is None:
        raise ValueError("the fit/validation parts are known once the schema is agreed (after the first exchange)")
    return {s: {"n_fit": schema.rows(s, "fit"), "n_validation": schema.rows(s, "validation")}
            for s in federation.active}


def gather_fit_ballots(federation: Federation, selector: Any = None, *,
                       selectors: Mapping[str, Any] | None = None,
                       abstained: dict[str, str] | None = None) -> list[Ballot]:
    """Ballots computed on each site's fit rows (its own ``fit`` part).

    Sites whose fit rows hold a single target value abstain; ``abstained`` (if given)
    receives ``{site: reason}``.

    Raises:
        FederationError: a site failed. ValueError: a ballot is invalid (naming the site).
    """
    requests = {n: Message("ballot_fit", meta=_selector_request((selectors or {}).get(n, selector)))
                for n in federation.active}
    ballots: dict[str, Ballot] = {}
    left_out: dict[str, str] = {}
    replies = exchange(federation, requests, ballot_checker(federation, "fit", ballots, left_out))
    return _valid_ballots([ballots[n] for n in replies if n in ballots], left_out, abstained)


def validation_scorer(federation: Federation, feature_names: list[str], *, model: Any = "logistic",
                      rounds: int = 10, local_epochs: int = 5, seed: int = 0) -> Callable[[np.ndarray], float]:
    """``mask -> Σ n_i F1_i / Σ n_i``: train on the fit rows by FedAvg, score on validation rows.

    An empty mask is scored as a model without features (it predicts from the class prior).
    """

    def score(mask: np.ndarray) -> float:
        feats = [f for f, m in zip(feature_names, mask) if m]
        out = run_training(federation, feats, model=model, rounds=rounds, local_epochs=local_epochs, seed=seed,
                           train_part="fit", eval_part="validation", score_bins=None)  # F1 only: no histograms
        n = np.array([m["n"] for m in out.per_site.values()], dtype=np.float64)
        f1 = np.array([m["weighted_f1"] for m in out.per_site.values()])
        return float((n * f1).sum() / n.sum()) if n.sum() else 0.0

    return score


@dataclass
class TuneOutcome:
    """What :func:`tune_flow` returns.

    Attributes:
        tuning: the search result (choice + whole curve).
        election: the election at the chosen fd (``.selected_names`` were sent to the sites if applied).
        ballots: the fit-row ballots (reuse them to tune another model without re-selecting).
        split: ``{site: {"n_fit", "n_validation"}}``.
        abstained: ``{site: reason}`` for sites that did not vote (e.g. one class in their fit rows).
    """

    tuning: TuningResult
    election: ElectionResult
    ballots: list[Ballot]
    split: dict[str, dict[str, int]] = field(default_factory=dict)
    abstained: dict[str, str] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        return self.election.selected_names


@dataclass(frozen=True)
class TuneSettings:
    """The options of :func:`tune_flow` (each is also a keyword argument of it; see there for their
    meaning): the selectors (``selector``, ``selectors``), the scoring model (``model``, ``rounds``,
    ``local_epochs``, ``seed``), the search (``tune_method``, ``grid``, ``tolerance``,
    ``refine_step``, ``start``), the election rule (``aggregation``, ``normalization``, ``compat``),
    earlier ``ballots`` and whether to ``apply`` the chosen mask."""

    selector: Any = None
    selectors: Mapping[str, Any] | None = None
    model: Any = "logistic"
    tune_method: Literal["grid", "hill-climb"] = "grid"
    rounds: int = 10
    local_epochs: int = 5
    grid: tuple[float, ...] = DEFAULT_GRID
    tolerance: float = 0.01
    refine_step: float = 0.025
    start: float = 0.5
    aggregation: str = "weighted"
    normalization: str = "all"
    compat: str | None = None
    ballots: list[Ballot] | None = None
    seed: int = 0
    apply: bool = True


def tune_flow(federation: Federation, *, settings: TuneSettings | None = None, **options: Any) -> TuneOutcome:
    """Tune the freedom degree on validation rows and (by default) send the chosen mask.

    Args:
        selector / selectors: as :func:`~fedtab.federation.workflows.election.server.gather_ballots`.
        model, rounds, local_epochs: the model that scores each mask (trained by FedAvg
            on fit rows, or exactly for GaussianNB).
        tune_method: ``"grid"`` (grid + refine + parsimony within ``tolerance``) or
            ``"hill-climb"`` (the peers' procedure from ``start``).
        ballots: fit-row ballots from an earlier call (skips the selectors).
        apply: broadcast the chosen mask to the sites (``"set_mask"``).
        aggregation / normalization / compat: the election rule every candidate mask is
            elected with (``compat``: a peer's server rule, see :mod:`fedtab.election.compat`),
            so the tuned mask is the one that rule gives at the chosen freedom degree.

    The options are the fields of :class:`TuneSettings`, given as keyword arguments
    (``tune_flow(fed, selector="lasso", model="gnb")``), as ``settings=TuneSettings(...)``, or both
    (the keywords override the settings' fields).

    Raises:
        FederationError: a site failed (naming it). ValueError: invalid settings or ballots, or
            a run in a mode tuning does not support (secure, DP or robust: :data:`TUNING_MODES`).
        TypeError: a keyword that is no field of :class:`TuneSettings`.
    """
    o = settings_with(TuneSettings, settings, options, "tune_flow")
    run_strategy(federation).check_supported(TUNING_MODES, "freedom-degree tuning (it runs with plain sums only)")
    abstained: dict[str, str] = {}
    ballots = o.ballots
    if ballots is None:
        ballots = gather_fit_ballots(federation, o.selector, selectors=o.selectors, abstained=abstained)
    split = split_validation(federation)
    first = elect_from_ballots(ballots, 0.0, o.aggregation, o.normalization, o.compat)
    names = list(first.feature_names)

    def mask_of(fd: float) -> np.ndarray:
        return np.asarray(elect_from_ballots(ballots, fd, o.aggregation, o.normalization, o.compat).mask, dtype=bool)

    score_of = validation_scorer(federation, names, model=o.model, rounds=o.rounds, local_epochs=o.local_epochs,
                                 seed=o.seed)
    if o.tune_method == "grid":
        search: dict[str, Any] = {"grid": o.grid, "tolerance": o.tolerance, "refine_step": o.refine_step}
    else:
        search = {"start": o.start}
    result = tune(mask_of, score_of, o.tune_method, **search)
    election = elect_from_ballots(ballots, result.freedom_degree, o.aggregation, o.normalization, o.compat)
    if o.apply:
        broadcast_mask(federation, election.selected_names)
    return TuneOutcome(result, election, ballots, split, abstained)


def tune_and_train(
    federation: Federation,
    *,
    selector: Any = None,
    selectors: Mapping[str, Any] | None = None,
    model: Any = "logistic",
    tune_method: Literal["grid", "hill-climb"] = "grid",
    rounds: int = 10,
    local_epochs: int = 5,
    tolerance: float = 0.01,
    seed: int = 0,
) -> dict[str, Any]:
    """Tune fd, then train ``model`` on all columns and on the elected ones; a JSON-able report.

    A one-call report (tuning, then training on all and on the elected columns). Returns
    ``{"tuning": TuningResult.to_dict(), "freedom_degree", "selected", "stats",
    "training": {"model", "rounds", "all_features": {"f1", "macro_f1", "n_params"},
    "elected": {...}, "communication": communication_report(...)}}``.

    Raises:
        FederationError / ValueError: as :func:`tune_flow` and ``run_training``.
    """
    from fedtab.learn.accounting import communication_report

    tuned = tune_flow(federation, selector=selector, selectors=selectors, model=model, tune_method=tune_method,
                      rounds=rounds, local_epochs=local_epochs, tolerance=tolerance, seed=seed)
    all_cols = list(tuned.election.feature_names)
    full = run_training(federation, all_cols, model=model, rounds=rounds, local_epochs=local_epochs, seed=seed)
    fe = run_training(federation, tuned.features, model=model, rounds=rounds, local_epochs=local_epochs, seed=seed)

    def part(out: Any) -> dict[str, Any]:
        return {"f1": out.pooled["weighted_f1"], "macro_f1": out.pooled["macro_f1"], "n_params": out.n_params,
                "bytes_down": out.bytes_down, "bytes_up": out.bytes_up, "rounds": out.rounds}

    return {
        "tuning": tuned.tuning.to_dict(),
        "freedom_degree": tuned.tuning.freedom_degree,
        "selected": tuned.features,
        "stats": dict(tuned.election.stats),
        "training": {"model": full.model, "rounds": full.rounds, "all_features": part(full), "elected": part(fe),
                     "communication": communication_report(model, len(all_cols), len(tuned.features),
                                                           len(full.classes), rounds=rounds,
                                                           n_sites=len(federation.sites))},
    }
