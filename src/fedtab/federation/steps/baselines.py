"""Baselines for the federated model, scored on the same test splits with the same metrics.

One exchange, ``"local_baseline"``: every site trains the federated run's model (same
features, classes and model spec) on its own training rows only, standardised with its
own training means/stds, with the federated run's solver and budget — ``rounds ×
local_epochs`` local epochs for a FedAvg model; for a logistic model trained by federated
Newton–Raphson, the site's own Newton iterations (:mod:`fedtab.learn.newton` on its own sums,
a local computation: no extra exchange) to its local penalised MLE, or, when the federated run
stopped at its iteration cap before converging, as many iterations as it ran — and replies with
the evaluation sums of that local model on its own test split (confusion matrix, Brier
sum, score histogram — :func:`~fedtab.federation.steps.evaluate.evaluation_sums`) plus
its training class counts. No row and no prediction leaves a site.

The server reduces them into

- ``local_only``: each site's local model on its own test split, and the pooled sums
  (every site's own model on its own rows) — what each site gets without federating;
- ``majority``: the majority class of the pooled training class counts, predicted on
  every test row with the pooled training class frequencies as probabilities (so its
  AUROC is 0.5 and its PR-AUC the positive rate). It needs only the test class counts,
  which are the row sums of the confusion matrices above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedtab.learn.metrics import SCORE_BINS, pooled_ranking, score_histogram
from fedtab.learn.models import FederatedModel, LogisticRegressionModel, make_model
from fedtab.learn.newton import NEWTON_MAX_ITER, NEWTON_TOL, as_theta, from_theta, logistic_sums, newton_update
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import validate
from fedtab.federation.protocol import Federation, FederationError, exchange
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.steps.evaluate import checked_sums, evaluation_sums, pool_evaluations, smoothed_sites
from fedtab.federation.site.matrices import class_indices, requested_bins, site_matrix

if TYPE_CHECKING:  # the outcome a baseline repeats the settings of
    from fedtab.federation.workflows.training.outcome import TrainingOutcome

__all__ = ["RiddenBaselines", "baseline_meta", "majority_sums", "newton_budget", "ride_baselines", "run_baselines"]


def _standardise(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    Z = (X - mean) / std
    Z[np.isnan(Z)] = 0.0
    return Z


def _newton(model: FederatedModel) -> bool:
    return isinstance(model, LogisticRegressionModel) and model.newton


def _local_newton(model: LogisticRegressionModel, params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray,
                  max_iter: int) -> dict[str, np.ndarray]:
    """The federated Newton–Raphson iteration on one site's rows: the same steps as
    :func:`~fedtab.federation.workflows.training.server.run_training` takes from the pooled sums
    (so one site alone reproduces the federated model), at most ``max_iter`` of them, stopping
    after a step shorter than :data:`~fedtab.learn.newton.NEWTON_TOL`."""
    theta = as_theta(params)
    for _ in range(max_iter):
        grad, hess = logistic_sums(theta, X, y)
        theta, step = newton_update(theta, grad, hess, len(y), model.l2)
        if step < NEWTON_TOL:
            break
    return from_theta(theta)


@handler("local_baseline")
def _local_baseline(site: Site, request: Message) -> Message:
    meta = request.meta
    features, classes = list(meta["features"]), [str(c) for c in meta["classes"]]
    model = make_model(meta["model"])
    X, y_raw = site_matrix(site, features, "train")
    y = class_indices(y_raw, classes)
    obs = ~np.isnan(X)
    count = obs.sum(axis=0)
    mean = np.where(count > 0, np.where(obs, X, 0.0).sum(axis=0) / np.maximum(count, 1), 0.0)
    var = np.where(count > 0, (np.where(obs, X - mean, 0.0) ** 2).sum(axis=0) / np.maximum(count, 1), 0.0)
    std = np.where(np.sqrt(var) > 1e-12, np.sqrt(var), 1.0)
    seed = int(meta.get("seed", 0))
    params = model.init(len(features), len(classes), seed)
    if len(y) and _newton(model):  # "epochs" is the Newton iteration budget (the policy caps it as epochs)
        params = _local_newton(model, params, _standardise(X, mean, std), y, int(meta.get("epochs", 1)))
    elif len(y):
        params = model.local_update(params, _standardise(X, mean, std), y, epochs=int(meta.get("epochs", 1)),
                                    seed=seed)
        if model.exact:  # the update holds sufficient statistics: one site's "aggregate" is its model
            params = model.aggregate([(params, len(y))])
    Xt, yt_raw = site_matrix(site, features, "test")
    sums = evaluation_sums(model, params, _standardise(Xt, mean, std), class_indices(yt_raw, classes),
                           len(classes), requested_bins(meta))
    sums["train_counts"] = np.bincount(y, minlength=len(classes)).astype(np.int64)
    return Message("local_baseline", sums, {"n_train": int(len(y))})


def majority_sums(train_counts: np.ndarray, test_counts: np.ndarray, bins: int | None
                  ) -> tuple[Any, Any, Any, Any]:
    """Evaluation sums ``(confusion, score_hist, brier_sum, rank_pairs)`` of the majority-class
    predictor (every row scores the same: each (positive, negative) pair ties, ½).

    ``train_counts`` (pooled training rows per class) fix the predicted class (the most
    frequent; the first on ties) and the predicted probabilities (the class frequencies);
    ``test_counts`` are the test rows per true class being scored.
    """
    train_counts = np.asarray(train_counts, dtype=np.float64)
    test_counts = np.asarray(test_counts, dtype=np.int64)
    c = len(train_counts)
    prior = train_counts / train_counts.sum()
    cm = np.zeros((c, c), dtype=np.int64)
    cm[:, int(np.argmax(train_counts))] = test_counts
    # Σ over rows of true class k of Σ_c (prior_c − [c = k])² = Σ prior² − 2·prior_k + 1
    brier = float((test_counts * ((prior**2).sum() - 2 * prior + 1)).sum())
    hist = None
    if bins is not None and c == 2:
        rows = [np.repeat(k, test_counts[k]) for k in range(2)]
        hist = score_histogram(np.concatenate(rows), np.full(int(test_counts.sum()), prior[1]), bins).astype(np.int64)
    pairs = 0.5 * float(test_counts[1]) * float(test_counts[0]) if hist is not None else None
    return cm, hist, brier, pairs


def baseline_meta(features: list[str], classes: list[str], model_spec: Any, epochs: int, seed: int,
                  score_bins: int | None = SCORE_BINS) -> dict[str, Any]:
    """The ``local_baseline`` request's meta: the federated run's ``features``, ``classes`` and model
    spec, the local budget ``epochs`` (FedAvg epochs, or the most Newton iterations) and ``seed``."""
    meta: dict[str, Any] = {"features": list(features), "classes": list(classes), "model": model_spec,
                            "epochs": int(epochs), "seed": int(seed)}
    if score_bins is not None:
        meta["score_bins"] = int(score_bins)
    return meta


def newton_budget(trained: TrainingOutcome) -> int:
    """A Newton-trained run's local baseline budget: up to :data:`~fedtab.learn.newton.NEWTON_MAX_ITER`
    iterations when the federated run converged, else the ``rounds`` it ran."""
    converged = bool(trained.steps) and trained.steps[-1] < NEWTON_TOL
    return NEWTON_MAX_ITER if converged else max(1, trained.rounds)


class RiddenBaselines:
    """The local baselines asked ahead, riding on the next exchange (:func:`ride_baselines`):
    ``meta`` is the request sent; ``result`` is :func:`run_baselines`' result once the replies
    arrived (``None`` before, or when the riding part failed)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.result: dict[str, Any] | None = None


def ride_baselines(federation: Federation, features: list[str], classes: list[str], model_spec: Any, *,
                   seed: int, score_bins: int | None = SCORE_BINS) -> RiddenBaselines | None:
    """Queue the local baselines of a Newton-trained logistic model with a converged budget
    (:data:`~fedtab.learn.newton.NEWTON_MAX_ITER` local iterations, what :func:`run_baselines` asks
    when the federated run converges) to ride on the next exchange — the first Newton iteration —
    as an independent part (:func:`fedtab.federation.protocol.piggyback.ride`): the sites answer it
    through their one release path exactly as the exchange of its own. Returns ``None`` (nothing
    queued) for another model, or when the run's options are not plain (secure sums, DP, robust
    reducers: the baselines keep their own exchange). Pass the holder to :func:`run_baselines`."""
    from fedtab.federation.protocol.piggyback import ride
    from fedtab.federation.protocol.riders import plain_run

    if not _newton(make_model(model_spec)) or not plain_run(federation):
        return None
    held = RiddenBaselines(baseline_meta(features, classes, model_spec, NEWTON_MAX_ITER, seed, score_bins))
    check, reduce = _baseline_checks(federation, len(classes), score_bins)

    def keep(replies: dict[str, Message]) -> None:
        held.result = reduce(replies, list(classes), "newton_iterations", NEWTON_MAX_ITER)

    ride(federation, Message("local_baseline", meta=held.meta), check, keep, step="local_baseline", independent=True)
    return held


def run_baselines(federation: Federation, trained: TrainingOutcome, *, local_epochs: int | None = None,
                  seed: int | None = None, score_bins: int | None = SCORE_BINS,
                  ridden: RiddenBaselines | None = None) -> dict[str, Any]:
    """Score the majority-class predictor and each site's local-only model (one exchange, none
    when ``ridden`` answered the same request ahead: :func:`ride_baselines`).

    Args:
        trained: the federated run to compare with; its features, classes, model and
            ``rounds × local_epochs`` (the local budget) are reused. A logistic model trained by
            Newton–Raphson gets up to :data:`~fedtab.learn.newton.NEWTON_MAX_ITER` local Newton
            iterations when the federated run converged, else the ``rounds`` it ran.
        local_epochs / seed: override the values stored in ``trained`` (``local_epochs``: FedAvg only).
        score_bins: grid of the score histograms (None: no AUROC/PR-AUC/Brier).
        ridden: the baselines asked ahead; their result is returned when they were answered with
            exactly the request this call would send (else the exchange is made).

    Returns:
        ``{"majority": {"class", "pooled", "per_site"}, "local_only": {"pooled", "per_site",
        "epochs" | "newton_iterations"}}`` (the local budget: FedAvg epochs, or the most Newton
        iterations), each metrics dict as :func:`fedtab.learn.metrics.evaluation_scores`.

    Raises:
        FederationError: a site failed, or sent sums that do not fit the agreed classes
            (naming it).
    """
    newton = _newton(make_model(trained.model_spec or trained.model))
    if newton:  # the run's solver: to the local MLE, or the federated run's iterations when it stopped unconverged
        epochs = newton_budget(trained)
    else:
        epochs = max(1, trained.rounds * int(local_epochs if local_epochs is not None else trained.local_epochs or 1))
    meta = baseline_meta(trained.features, trained.classes, trained.model_spec or {"name": trained.model, "params": {}},
                         epochs, int(seed if seed is not None else trained.seed), score_bins)
    if ridden is not None and ridden.result is not None and ridden.meta == meta:
        return ridden.result
    check, reduce = _baseline_checks(federation, len(trained.classes), score_bins)
    replies = exchange(federation, Message("local_baseline", meta=meta), check)
    return reduce(replies, list(trained.classes), "newton_iterations" if newton else "epochs", epochs)


def _baseline_checks(federation: Federation, c: int, score_bins: int | None) -> tuple[Any, Any]:
    """``(check, reduce)``: the validator of ``local_baseline`` replies (keeping their sums) and
    ``reduce(replies, classes, budget name, budget)`` -> :func:`run_baselines`' result."""
    sums, train_counts = {}, {}

    def check(name: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        n_test = schema.rows(name, "test")
        validate.confusion_matrix(reply, c, n_test)  # sums to the test rows the site declared
        sums[name] = checked_sums(name, reply, c, score_bins)
        n_train = validate.integer(reply.meta.get("n_train"), "training rows", equal=schema.rows(name, "train"))
        counts = validate.counts(validate.array(reply, "train_counts", (c,)), n_train, "training class counts")
        if counts.sum() > n_train:  # less when the site's gate suppressed a class below its min_rows
            raise ValueError("training class counts add up to more than its n_train")
        train_counts[name] = counts.astype(np.int64)

    def reduce(replies: dict[str, Message], classes: list[str], budget: str, epochs: int) -> dict[str, Any]:
        got = {name: sums[name] for name in replies}
        counts = {name: train_counts[name] for name in replies}
        pooled_train = sum(counts.values())
        if pooled_train.sum() == 0:
            raise FederationError("no site has training rows for the majority-class baseline")
        majority = pool_evaluations({name: majority_sums(pooled_train, s[0].sum(axis=1), score_bins)
                                     for name, s in got.items()})
        if majority["pooled"].get("auroc") is not None:  # one score for every row of every site: pooled, all pairs tie
            totals = sum(s[0].sum(axis=1) for s in got.values())
            majority["pooled"].update(pooled_ranking([majority_sums(pooled_train, totals, score_bins)[1]],
                                                     [0.5 * float(totals[1]) * float(totals[0])]))
        local = pool_evaluations(got, smoothed=smoothed_sites(replies))
        return {
            "majority": {"class": classes[int(np.argmax(pooled_train))], **majority},
            "local_only": {**local, budget: epochs},
        }

    return check, reduce
