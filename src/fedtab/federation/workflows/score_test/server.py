"""Pooled forward selection by score tests: the multivariate signal a marginal test misses.

Feature Election, its Stouffer consensus and the pooled ANOVA
(:mod:`~fedtab.federation.workflows.pooled_anova.server`) all test one feature at a time. A column
that separates the classes only together with others has no marginal effect, and no
marginal test finds it (on ``benchmarks/scale.py``'s table 9 of the 20 informative
columns). Forward selection by Rao score tests in a logistic model
(:mod:`fedtab.election.score_test`) finds them, and every quantity it needs is a sum over
rows: the server runs the procedure on the *pooled* rows exactly, whatever the label
skew (a site that saw one class contributes its sums like any other).

Exchanges, each on the protocol path (agreed schema → site policy → handler → validation
of every reply → sum):

1. ``"describe"`` (the training workflow's) — per feature count/sum/sum of squares and
   the class labels; the server fixes the pooled mean/std and the two classes.
2. ``"score_sums"`` × (Newton iterations + 1) per step — the server sends the
   coefficients of the current model (intercept + selected columns, by index into the
   agreed features); each site replies ``grad`` (m,), ``hess`` (m, m) and ``loglik`` of its
   training rows, and, when the request sets ``with_score``, ``score`` (d,),
   ``info_diag`` (d,) and ``info_cross`` (d, m). The first request carries the setup
   (features, classes, mean/std, row part), which the site stores.

A site standardises with the pooled mean/std and fills missing cells (and features it
lacks) with the pooled mean, i.e. 0 — the training workflow's convention — so the
result equals :func:`~fedtab.election.score_test.pooled_score_selection` on the stacked,
mean-filled, standardised training rows. A column a site observed in fewer than its
``min_rows`` rows is treated as missing there (its ``"describe"`` reply suppressed it too).

Validation (each reply, before anything is summed; a rejected reply names its site):
exact names and shapes, finite values, ``n`` equal to the rows the site declared, a
symmetric positive semi-definite ``hess``, and bounds that honest sums cannot exceed
given the site's own described moments: ``|Σ (y − p)| ≤ n``, ``Σ w ≤ n/4``,
``Σ w z_j² ≤ ¼ Σ z_j²``, ``|Σ z_j (y − p)| ≤ √(n Σ z_j²)``, Cauchy-Schwarz between the
information pieces, ``loglik ≤ 0``, and the selected columns' score pieces equal to the
rows of ``grad``/``hess``. Within those bounds a lying site still moves the sums (no
robust reducer exists for this step).

Disclosure: per step, sums over each site's rows at coefficients the server chooses —
gradients and information matrices of the logistic model (``d·(m + 2) + m² + m + 1``
floats), no row. Each reply is a weighted sum of the site's rows, so a server asking
many times about few rows learns more; the site's policy bounds it (``min_rows``, at most
``max_rounds`` such requests per setup). With ``secure_aggregation=True`` every reply is
masked (:mod:`fedtab.privacy.secagg`) and the server learns the totals only; they are
validated against the same bounds over the pooled rows (and each site's row count, sent in
the clear, against the rows it declared).

Each ``"score_sums"`` exchange is one configure/aggregate pair (:func:`score_step`) run on the
run's strategy (:mod:`fedtab.federation.protocol.modes`); the score test supports plain and
secure sums only (:data:`SCORE_TEST_MODES`), and a DP or robust run is refused before anything
is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from fedtab._settings import settings_with
from fedtab.election.score_test import (FDR_METHODS, NEWTON_KEYS, SCORE_KEYS, ScoreSelection, check_fdr,
                                   forward_score_selection)
from fedtab.privacy.secagg import FRAC_BITS
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, FederationError, Summed, SumSpec, set_quorum
from fedtab.federation.protocol.modes import SumStep, declare_modes, run_strategy
from fedtab.federation.protocol.agreement import agree_schema
from fedtab.federation.steps.describe import describe as describe_step, pooled_standardisation

from fedtab.federation.steps.params import SETUP

__all__ = ["PooledScoreTest", "ScoreTestSettings", "run_pooled_score_test", "score_step", "MAX_CLASSES", "SCORE_TEST_MODES"]

#: most classes :func:`run_pooled_score_test` runs one-vs-rest over (more looks like a continuous target)
MAX_CLASSES = 50
#: relative tolerance of the bounds an honest reply meets (float rounding of its sums)
_TOL = 1e-6
#: the modes the score test supports: plain and secure sums (no DP release, no robust reducer)
SCORE_TEST_MODES = declare_modes("score_test", "secure")





# ----------------------------------------------------------------------------- server side
@dataclass(frozen=True)
class PooledScoreTest:
    """Result of :func:`run_pooled_score_test`.

    Attributes:
        feature_names: the ``d`` features tested; mask: ``(d,)`` bool, the selection.
        selected: names in order of entry.
        z / p: ``(d,)`` score statistic and p-value at entry (selected features) or at
            the last test (the others).
        steps: per step ``{"added": names, "z", "p": at entry, "coef": the model they were
            tested against (intercept, then the earlier selected in order of entry),
            "loglik", "newton_iterations"}``.
        coef: the model refitted on every selected feature (intercept first, in order of
            entry; standardised units); mean / std: the pooled standardisation.
        classes: the class labels; with two, ``positive`` is ``classes[1]``.
        n_rows: pooled rows; converged / stopped / exchanges: see
            :class:`~fedtab.election.score_test.ScoreSelection`.
        participation: per exchange ``{"step", "sites"}``.
        by_class: one-vs-rest only: ``{class: PooledScoreTest}`` of each class against the
            rest. The top level then holds the union: ``selected`` in order of first entry
            (classes in order), ``z``/``p`` of the class with the smallest p per feature,
            every step with its ``"class"``, ``coef`` empty, ``stopped = "one-vs-rest"``.
        fdr / fdr_method: the FDR level ``q`` and correction (``"bh"`` / ``"by"``) of a
            selection with error control (``fdr=`` of :func:`run_pooled_score_test`; ``fdr``
            is ``None`` for the forward selection, whose ``fdr_method`` is its steps').
    """

    feature_names: list[str]
    mask: np.ndarray
    selected: list[str]
    z: np.ndarray
    p: np.ndarray
    steps: list[dict[str, Any]]
    coef: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    classes: list[str]
    n_rows: int
    converged: bool
    stopped: str
    exchanges: int
    participation: list[dict[str, Any]]
    by_class: dict[str, "PooledScoreTest"] = field(default_factory=dict)
    fdr: float | None = None
    fdr_method: str = "bh"

    @property
    def selected_names(self) -> list[str]:
        """The selected features in table order (what :func:`~fedtab.federation.run_training` takes)."""
        return [n for n, keep in zip(self.feature_names, self.mask) if keep]


def _column_energy(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, mean: np.ndarray, std: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(Σ z², its rounding scale)`` per column of one site, from its described moments.

    Overflow-safe: ``Σ (x − m)² = n·(v + (μ − m)²)`` with the site's own per-row mean ``μ``
    and variance ``v``, each divided by ``std`` before it is squared (no sum is squared)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        n = np.maximum(np.asarray(count, dtype=np.float64), 0.0)
        mu = np.where(n > 0, total / np.maximum(n, 1.0), 0.0)
        msq = np.where(n > 0, sumsq / np.maximum(n, 1.0), 0.0)
        spread = np.sqrt(np.maximum(msq - mu * mu, 0.0)) / std  # |μ| <= √msq once the moments are validated
        shift = (mu - mean) / std
        rms, centre = np.sqrt(np.maximum(msq, 0.0)) / std, mean / std
        return n * (spread * spread + shift * shift), n * (rms * rms + centre * centre)


def _checker(n_rows: Mapping[str, int], energy: Mapping[str, tuple[np.ndarray, np.ndarray]], d: int,
             selected: list[int], with_score: bool, slack: float = 1e-9):
    """Validator of one ``"score_sums"`` exchange (see the module docstring); ``slack`` is the
    absolute tolerance of every bound (fixed-point rounding of a secure sum needs more)."""
    m = len(selected) + 1
    keys = set(NEWTON_KEYS) | (set(SCORE_KEYS) if with_score else set())
    shapes = {"grad": (m,), "hess": (m, m), "loglik": (1,), "score": (d,), "info_diag": (d,), "info_cross": (d, m)}

    def check(site: str, reply: Message) -> None:
        n = validate.integer(reply.meta.get("n"), "score rows", equal=n_rows[site])
        if not reply.arrays:
            return  # masked in a secure sum: the total is checked (see :func:`score_step`)
        if set(reply.arrays) != keys:
            raise ValueError(f"score sums must be exactly {sorted(keys)}, got {sorted(reply.arrays)[:8]}")
        a = {k: validate.array(reply, k, shapes[k]) for k in keys}
        s2, scale = energy[site]
        if not (np.isfinite(s2).all() and np.isfinite(scale).all()):
            raise ValueError("its described moments are too large to bound its score sums")
        tol_s2 = _TOL * scale + slack
        H = a["hess"]
        diag = np.diag(H)
        cap = np.concatenate([[n / 4.0], s2[selected] / 4.0]) + _TOL * np.concatenate([[n], scale[selected]]) + slack
        root = np.sqrt(np.maximum(diag, 0.0))
        if np.any(np.abs(H - H.T) > _TOL * np.outer(root, root) + slack):
            raise ValueError("the information matrix 'hess' is not symmetric")
        if np.any(diag < -slack) or np.any(diag > cap):
            raise ValueError("the information matrix 'hess' has a diagonal outside [0, n/4] / [0, Σz²/4]")
        if np.any(np.abs(H) > np.outer(root, root) * (1 + _TOL) + slack) \
                or np.linalg.eigvalsh(H).min() < -_TOL * max(float(diag.sum()), 1.0):
            raise ValueError("the information matrix 'hess' is not positive semi-definite")
        # √n·√Σz², never n·Σz² (no product of site-derived sums is formed before its root)
        g_cap = np.sqrt(n) * np.sqrt(np.concatenate([[float(n)], s2[selected] + tol_s2[selected]])) * (1 + _TOL) \
            + slack
        if np.any(np.abs(a["grad"]) > g_cap):
            raise ValueError("the gradient 'grad' exceeds what the site's rows allow")
        if a["loglik"][0] > slack:
            raise ValueError("a positive log-likelihood")
        if not with_score:
            return
        info = a["info_diag"]
        if np.any(info < -slack) or np.any(info > s2 / 4.0 + tol_s2):
            raise ValueError("'info_diag' outside [0, Σz²/4] of the site's described columns")
        if np.any(np.abs(a["score"]) > np.sqrt(n) * np.sqrt(s2 + tol_s2) * (1 + _TOL) + slack):
            raise ValueError("the score 'score' exceeds what the site's rows allow")
        C = a["info_cross"]
        bound = np.sqrt(np.maximum(info, 0.0))[:, None] * np.sqrt(np.maximum(diag, 0.0))[None, :]
        if np.any(np.abs(C) > bound * (1 + _TOL) + slack):
            raise ValueError("'info_cross' breaks Cauchy-Schwarz against 'info_diag' and 'hess'")
        if selected and not (np.allclose(C[selected], H[1:], rtol=_TOL, atol=slack)
                             and np.allclose(info[selected], diag[1:], rtol=_TOL, atol=slack)
                             and np.allclose(a["score"][selected], a["grad"][1:], rtol=_TOL, atol=slack)):
            raise ValueError("the selected columns' score pieces disagree with 'grad'/'hess'")

    return check


@dataclass(frozen=True)
class ScoreTestSettings:
    """The options of :func:`run_pooled_score_test` but ``alpha`` (each is also a keyword argument
    of it; see there for their meaning): ``max_steps``, ``features``, ``part``, ``ridge``, ``tol``,
    ``max_newton``, ``min_sites``, ``one_vs_rest``, ``fdr``, ``fdr_method``."""

    max_steps: int = 10
    features: list[str] | None = None
    part: str = "train"
    ridge: float = 1e-8
    tol: float = 1e-8
    max_newton: int = 25
    min_sites: int | None = None
    one_vs_rest: bool = False
    fdr: float | None = None
    fdr_method: str = "bh"


def run_pooled_score_test(
    federation: Federation,
    alpha: float = 0.05,
    *,
    settings: ScoreTestSettings | None = None,
    **options: Any,
) -> PooledScoreTest:
    """Forward selection by score tests on the sites' pooled rows (module docstring), or with
    ``fdr`` a selection with error control.

    Args:
        alpha: FDR level of each forward step's correction, in (0, 1].
        fdr: instead of the forward selection, the selection with error control
            (:func:`~fedtab.election.score_test.fdr_score_selection`): every feature's score
            test against the intercept-only model on the pooled rows, one correction at false
            discovery rate ``fdr`` in (0, 1) over them all (``alpha`` and ``max_steps`` unused).
        fdr_method: the correction, ``"bh"`` (Benjamini-Hochberg) or ``"by"``
            (Benjamini-Yekutieli, for any dependence between the features); also the forward
            steps' correction without ``fdr``.
        max_steps: most steps that admit features.
        features: the features to test (default: every column of the agreed schema).
        part: the sites' row part to use (``"train"``; ``"fit"`` after a fit/validation split).
        ridge / tol / max_newton: as :func:`~fedtab.election.score_test.forward_score_selection`.
        min_sites: quorum (as :func:`~fedtab.federation.run_training`); a site dropped
            mid-run leaves the remaining steps' sums.
        one_vs_rest: with more than two classes, run the selection once per class against
            the rest (same describe, one forward selection each) and keep the union
            (``PooledScoreTest.by_class``). Each run controls its own FDR at ``alpha``
            (at ``fdr``): the union's FDR is at most the number of classes times it.

    With the run's secure sums (``federation.options``) every reply (the description and every
    ``"score_sums"``) is summed securely: the server learns only the totals (and each site's
    row count and class labels). The totals are validated with the same bounds over the
    pooled rows, but a bad total cannot be traced to a site. Each sum costs one more exchange
    (the unmasking), the session one key exchange; the result equals the plain run's up to
    fixed-point rounding (2⁻²⁴ per site and entry). The score test has no DP or robust mode.

    Returns:
        :class:`PooledScoreTest`; ``.selected_names`` feeds ``run_training``.

    Raises:
        SiteError / SiteRefused: a site failed, refused or sent a rejected reply (naming it).
        FederationError: with secure sums, a secure sum failed or its total is implausible.
        ValueError: a DP or robust run (:data:`SCORE_TEST_MODES`; refused before anything is
            sent); fewer than two classes in the pooled target, more than two without
            ``one_vs_rest``, more than :data:`MAX_CLASSES` (a continuous target), no
            features, or bad arguments.
        TypeError: a keyword that is no field of :class:`ScoreTestSettings`.

    The options other than ``alpha`` are the fields of :class:`ScoreTestSettings`, given as keyword
    arguments (``run_pooled_score_test(fed, 0.05, fdr=0.1)``), as ``settings=ScoreTestSettings(...)``,
    or both (the keywords override the settings' fields).
    """
    o = settings_with(ScoreTestSettings, settings, options, "run_pooled_score_test")
    part, fdr, fdr_method, one_vs_rest = o.part, o.fdr, o.fdr_method, o.one_vs_rest
    alpha, max_steps = _step_level(alpha, o)
    strategy = run_strategy(federation)
    strategy.check_supported(SCORE_TEST_MODES, "the score test (it has no DP or robust mode; use the election for a "
                             "dp or robust run)")
    set_quorum(federation, o.min_sites)
    p0 = len(federation.participation)
    feats = _tested_features(federation, o.features)
    d_ = describe_step(federation, feats, part)
    mean, std = pooled_standardisation(d_.count, d_.total, d_.sumsq)
    classes = d_.classes
    if len(classes) < 2 or (len(classes) > 2 and not one_vs_rest) or len(classes) > MAX_CLASSES:
        raise ValueError(f"the pooled score test needs a binary target (or one_vs_rest=True for up to {MAX_CLASSES} "
                         f"classes): the sites' training rows hold {len(classes)} class label(s) "
                         f"{classes[:5]}{' …' if len(classes) > 5 else ''}")
    schema = federation.schema
    assert schema is not None  # agreed by the description at the latest
    rows = {s: int(schema.rows(s, part)) for s in federation.active}
    # each site's column energies (the sites whose moments the server saw) and the pooled ones (a secure total)
    energy = {s: _column_energy(*m, mean, std) for s, m in d_.per_site.items()}
    pooled = _column_energy(d_.count, d_.total, d_.sumsq, mean, std)
    d = len(feats)
    setup = {"features": feats, "classes": classes, "part": part}
    first, positive, last_n = [True], [1], [0]

    def sums(selected: list[int], coef: np.ndarray, with_score: bool) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {"coef": np.asarray(coef, dtype=np.float64)}
        meta: dict[str, Any] = {"selected": [int(i) for i in selected], "with_score": bool(with_score),
                                "positive": positive[0]}
        if first[0]:
            arrays.update({SETUP + "mean": mean, SETUP + "std": std})
            meta["setup"] = setup
        step = score_step(Message("score_sums", arrays, meta), rows, energy, pooled, d, list(selected), with_score)
        totals, last_n[0] = strategy.run(federation, step).result
        first[0] = False
        return totals

    def result(run: ScoreSelection, exchanges: int) -> PooledScoreTest:
        steps = [{"added": [feats[i] for i in s.added], "z": s.z, "p": s.p, "coef": s.coef, "loglik": s.loglik,
                  "newton_iterations": s.newton_iterations} for s in run.steps]
        return PooledScoreTest(feats, run.mask, [feats[i] for i in run.selected], run.z, run.p, steps, run.coef, mean,
                               std, classes, int(last_n[0]), run.converged, run.stopped, exchanges,
                               federation.participation[p0:], fdr=fdr, fdr_method=fdr_method)

    options = {"max_steps": max_steps, "ridge": o.ridge, "tol": o.tol, "max_newton": o.max_newton,
               "fdr_method": fdr_method}
    if len(classes) == 2:
        run = forward_score_selection(sums, d, alpha, **options)  # type: ignore[arg-type]
        return result(run, run.exchanges + 1)
    by_class = {}
    for k, label in enumerate(classes):
        positive[0] = k
        run = forward_score_selection(sums, d, alpha, **options)  # type: ignore[arg-type]
        by_class[label] = result(run, run.exchanges)
    return _union(by_class, 1 + sum(r.exchanges for r in by_class.values()))


def _step_level(alpha: float, o: ScoreTestSettings) -> tuple[float, int]:
    """``(alpha, max_steps)`` of the forward selection: as given, or with ``o.fdr`` the one
    correction at ``fdr`` over every feature (``(fdr, 1)``).

    Raises:
        ValueError: ``alpha`` outside (0, 1], a bad ``fdr`` or an unknown ``fdr_method``.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if o.fdr is not None:
        check_fdr(o.fdr, o.fdr_method)
        return float(o.fdr), 1  # fdr_score_selection: one correction over every feature
    if o.fdr_method not in FDR_METHODS:
        raise ValueError(f"fdr_method must be one of {list(FDR_METHODS)}, got {o.fdr_method!r}")
    return alpha, o.max_steps


def _tested_features(federation: Federation, features: list[str] | None) -> list[str]:
    """The features to test: ``features`` as names, or every column of the agreed schema (agreed
    now if no exchange has run yet).

    Raises:
        ValueError: repeated names, or no feature.
    """
    if features is None:
        schema = federation.schema or agree_schema(federation)
        feats = list(schema.columns)
    else:
        feats = [str(f) for f in features]
        if len(set(feats)) != len(feats):
            raise ValueError("features must be distinct names")
    if not feats:
        raise ValueError("the score test needs at least one feature")
    return feats


def _union(by_class: dict[str, PooledScoreTest], exchanges: int) -> PooledScoreTest:
    """The one-vs-rest result: the union of the per-class selections (see :class:`PooledScoreTest`)."""
    runs = list(by_class.values())
    first = runs[0]
    p = np.stack([r.p for r in runs])
    best = p.argmin(axis=0)
    cols = np.arange(p.shape[1])
    selected = list(dict.fromkeys(n for r in runs for n in r.selected))
    steps = [{**s, "class": label} for label, r in by_class.items() for s in r.steps]
    return PooledScoreTest(first.feature_names, np.logical_or.reduce([r.mask for r in runs]), selected,
                           np.stack([r.z for r in runs])[best, cols], p[best, cols], steps, np.zeros(0), first.mean,
                           first.std, first.classes, first.n_rows, all(r.converged for r in runs), "one-vs-rest",
                           exchanges, runs[-1].participation, dict(by_class), first.fdr, first.fdr_method)


def score_step(request: Message, rows: Mapping[str, int], energy: Mapping[str, tuple[np.ndarray, np.ndarray]],
               pooled: tuple[np.ndarray, np.ndarray], d: int, selected: list[int], with_score: bool
               ) -> SumStep[tuple[dict[str, np.ndarray], int]]:
    """One ``"score_sums"`` exchange's configure/aggregate pair: ``request`` to every site, each reply
    validated against its site's declared ``rows`` and described column ``energy`` (:func:`_checker`),
    the summed pieces ``({key: (m,) / (m, m) / (d,) / (d, m) total}, pooled rows)``.

    Each part the sites' replies did not show the server (the run's secure total) is validated in
    the reduction against the same bounds over the ``pooled`` energies, with the fixed-point rounding
    of the sum as slack.

    Raises (in the reduction):
        FederationError: the secure total is implausible (no site can be named).
    """
    keys = NEWTON_KEYS + (SCORE_KEYS if with_score else ())
    site_check = _checker(rows, energy, d, selected, with_score)
    seen: set[str] = set()  # the sites whose summed arrays the checker saw

    def check(site: str, reply: Message) -> None:
        site_check(site, reply)
        if reply.arrays:
            seen.add(site)

    def aggregate(summed: Summed) -> tuple[dict[str, np.ndarray], int]:
        n = sum(int(r.meta["n"]) for r in summed.replies.values())  # each validated against the site's rows
        slack = 4.0 * len(summed.sites) * 2.0 ** -FRAC_BITS  # fixed-point rounding of a secure sum
        for key, part in summed.parts.items():
            if key in seen:
                continue
            total = Message("score_sums", {k: part.arrays[k] for k in keys}, {"n": n})
            try:
                _checker({key: n}, {key: pooled}, d, selected, with_score, slack)(key, total)
            except ValueError as exc:
                raise FederationError(f"the secure sum of the sites' score sums is implausible: {exc}") from None
        return {k: summed.sums[k] for k in keys}, n

    return SumStep(request, SumSpec({k: FRAC_BITS for k in keys}), check, aggregate, kind="score_sums")
