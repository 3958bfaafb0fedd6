"""The server-side job an engine runs: fedtab workflows in order, from a flat config.

Flower passes a ServerApp its ``run_config`` (flat TOML values), FLARE passes a
controller its job arguments; both hand that mapping to :func:`run_pipeline` together
with their :class:`~fedtab.federation.protocol.Federation`. The workflows themselves
are the shared ones in ``fedtab.federation``; this module only reads settings and
gathers a JSON-able summary. It imports no engine.

Config keys (hyphens or underscores)::

    steps             comma list of "imputation", "tuning", "election", "score-test",
                      "training" (default "election,training"); they run in that order, and
                      with imputation before other steps every site fills its table
                      first (the label is never imputed), clipped to the pooled observed
                      range — in a private run (secure-aggregation or dp) to dp's public
                      bounds instead, as the sites' min/max are individual values;
                      "score-test" selects the columns instead of the election (not both):
                      forward selection by score tests on the pooled sums
                      (fedtab.federation.score_test_flow; no DP or robust mode)
    freedom-degree    election freedom degree (default 0.5)
    selector          "" = each site's own selector, else a name / JSON spec / alias
    normalization     "all" (fedtab's rule) or "selected" (FLARE 2.9's normalisation only)
    consensus         "intersection" (the rule, default) or "stouffer": the election's
                      consensus from the sites' combined p-values (fedtab.election.evidence)
    consensus-alpha   false discovery rate of consensus "stouffer" (default 0.05)
    score-test-alpha  false discovery rate of each score-test step (default 0.05)
    compat            "" = fedtab's rule, or "nvflare" / "flash" / "flower": a peer's whole
                      server rule, exactly (see fedtab.election.compat)
    aggregation       "weighted" or "uniform"
    model, rounds, local-epochs, seed        training settings
    impute-rounds, impute-local-epochs       imputation settings (others: defaults)
    impute-config     JSON object with more ImputeConfig fields
    tuning-config     JSON object of more keyword arguments for
                      fedtab.federation.tuning_flow.tune_flow (tune_method, grid...)
    min-sites         quorum: sites that fail, time out or send a rejected reply are
                      dropped (named in the summary's "dropped") while this many remain;
                      unset = every site must answer every step
    min-holders       holders a feature needs to be election consensus (default 2
                      with two or more sites)
    robust            true/false (default false): robust reducers for the election,
                      training and imputation (see fedtab.federation.reduce)
    max-site-share    robust mode's ceiling on one site's share of a pooled sum (default 0.5)
    secure-aggregation  true/false (default false): every quantity the server only needs
                      summed (descriptions, model updates, confusion matrices, imputation
                      statistics and weights) travels masked (fedtab.privacy.secagg)
    dp                JSON object {"epsilon", "delta", "bounds", "clip"} (default none):
                      differential privacy at the sites (fedtab.privacy.dp); every step
                      (imputation, election, training) spends this ε on its own, so a run
                      of k steps spends at most k·ε; each step's summary has "privacy"
                      (ε spent per exchange and in total, from the dp-accounting RDP accountant)

With "tuning" the freedom degree is tuned on a fit/validation split of each site's
training rows (model, rounds and local-epochs score the masks); "election" then elects
on all training rows at the tuned freedom degree (the tuning step then does not send its
own mask, which the election replaces anyway).

Exchanges (request/reply rounds with every site) of "election,training": ``ballot``,
``set_mask`` (which also answers training's ``describe``), ``fit`` × rounds (the first
carries the training setup), ``evaluate`` — ``rounds + 3`` in all (8 for 5 rounds).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..federation.election_flow import run_election
from ..federation.protocol import Federation, set_options, set_quorum
from ..federation.reduce import DEFAULT_MAX_SITE_SHARE, check_max_site_share
from ..federation.training_flow import run_training
from .site_config import parse_selector

__all__ = ["PipelineConfig", "load_workflow", "run_pipeline", "STEPS"]

STEPS = ("election", "tuning", "training", "imputation", "score-test")


def load_workflow(path: str) -> Any:
    """The workflow ``"module:function"`` names (``""`` = :func:`run_pipeline`).

    Only functions inside the ``fedtab`` package can be named: a run config must not be
    able to make the server import arbitrary code.

    Raises:
        ValueError: a path outside ``fedtab``, a missing module or attribute, or not callable.
    """
    if not path:
        return run_pipeline
    module, _, attr = str(path).partition(":")
    if not (module == "fedtab" or module.startswith("fedtab.")) or not attr:
        raise ValueError(f"workflow {path!r} must be 'fedtab.<module>:<function>'")
    import importlib

    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"workflow {path!r} cannot be loaded: {exc}") from None
    if not callable(fn):
        raise ValueError(f"workflow {path!r} is not callable")
    return fn


def _json_obj(value: Any, key: str) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    try:
        obj = json.loads(str(value))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{key} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{key} must be a JSON object")
    return obj


@dataclass
class PipelineConfig:
    """Settings of :func:`run_pipeline` (see the module docstring)."""

    steps: tuple[str, ...] = ("election", "training")
    freedom_degree: float = 0.5
    selector: Any = None
    consensus: str = "intersection"
    consensus_alpha: float = 0.05
    score_test_alpha: float = 0.05
    normalization: str = "all"
    compat: str | None = None
    aggregation: str = "weighted"
    model: Any = "logistic"
    rounds: int = 5
    local_epochs: int = 5
    seed: int = 0
    impute_rounds: int = 20
    impute_local_epochs: int = 1
    impute_config: dict[str, Any] = field(default_factory=dict)
    tuning_config: dict[str, Any] = field(default_factory=dict)
    min_sites: int | None = None
    min_holders: int | None = None
    robust: bool = False
    max_site_share: float = DEFAULT_MAX_SITE_SHARE
    secure_aggregation: bool = False
    dp: dict[str, Any] | None = None

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> "PipelineConfig":
        """Read a flat mapping; unknown keys are ignored (engines add their own).

        Raises:
            ValueError: an unknown step, an unknown compat profile (or one given with
                ``normalization="selected"``), or a value of the wrong type.
        """
        from ..election.rule import check_profile

        c = {str(k).replace("-", "_"): v for k, v in config.items()}
        steps = c.get("steps", "election,training")
        if isinstance(steps, str):
            steps = [s.strip() for s in steps.split(",") if s.strip()]
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise ValueError(f"unknown pipeline steps {bad}; known: {list(STEPS)}")
        if "score-test" in steps and "election" in steps:
            raise ValueError("steps 'election' and 'score-test' both select the columns; give one of them")
        from ..election.evidence import check_consensus, check_consensus_alpha
        selector = c.get("selector") or None
        model = c.get("model", "logistic")
        if isinstance(model, str) and model.strip().startswith("{"):
            model = _json_obj(model, "model")
        try:
            return cls(
                steps=tuple(steps),
                freedom_degree=float(c.get("freedom_degree", 0.5)),
                selector=parse_selector(selector) if selector is not None else None,
                consensus=check_consensus(str(c.get("consensus") or "intersection")),
                consensus_alpha=check_consensus_alpha(float(c.get("consensus_alpha", 0.05))),
                score_test_alpha=check_consensus_alpha(float(c.get("score_test_alpha", 0.05))),
                normalization=str(c.get("normalization", "all")),
                compat=check_profile(c.get("compat") or None, str(c.get("normalization", "all"))),
                aggregation=str(c.get("aggregation", "weighted")),
                model=model,
                rounds=int(c.get("rounds", 5)),
                local_epochs=int(c.get("local_epochs", 5)),
                seed=int(c.get("seed", 0)),
                impute_rounds=int(c.get("impute_rounds", 20)),
                impute_local_epochs=int(c.get("impute_local_epochs", 1)),
                impute_config=_json_obj(c.get("impute_config"), "impute-config"),
                tuning_config=_json_obj(c.get("tuning_config"), "tuning-config"),
                min_sites=_optional_int(c.get("min_sites")),
                min_holders=_optional_int(c.get("min_holders")),
                robust=_flag(c.get("robust", False), "robust"),
                max_site_share=check_max_site_share(c.get("max_site_share", DEFAULT_MAX_SITE_SHARE)),
                secure_aggregation=_flag(c.get("secure_aggregation", False), "secure-aggregation"),
                dp=_dp_setting(c.get("dp")),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid pipeline config: {exc}") from None


def _dp_setting(value: Any) -> dict[str, Any] | None:
    """The ``dp`` key: a JSON object checked by :func:`fedtab.privacy.dp.parse_dp` (empty = no DP)."""
    from ..privacy.dp import parse_dp

    spec = _json_obj(value, "dp")
    return dict(spec) if spec and parse_dp(spec) is not None else None


def _optional_int(value: Any) -> int | None:
    if value in (None, ""):
        return None
    if isinstance(value, bool) or float(value) != int(float(value)) or int(float(value)) < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return int(float(value))


def _flag(value: Any, key: str) -> bool:
    """A boolean from a config value: a bool, or the strings true/false/1/0/yes/no."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _tune(federation: Federation, cfg: PipelineConfig) -> dict[str, Any]:
    """Tune the freedom degree with :func:`fedtab.federation.tuning_flow.tune_flow`."""
    try:
        from ..federation.tuning_flow import tune_flow
    except ImportError as exc:  # pragma: no cover - only while the tuning workflow is absent
        raise ValueError(f"the tuning step needs fedtab.federation.tuning_flow: {exc}") from None
    kwargs = {"model": cfg.model, "rounds": cfg.rounds, "local_epochs": cfg.local_epochs, "seed": cfg.seed,
              "aggregation": cfg.aggregation, "normalization": cfg.normalization, **cfg.tuning_config}
    if cfg.selector is not None:
        kwargs.setdefault("selector", cfg.selector)
    if "election" in cfg.steps:  # the election sends its own mask right after
        kwargs.setdefault("apply", False)
    if isinstance(kwargs.get("grid"), list):
        kwargs["grid"] = tuple(kwargs["grid"])
    outcome = tune_flow(federation, **kwargs)
    return {"freedom_degree": float(outcome.tuning.freedom_degree), "summary": _jsonable(outcome.tuning.to_dict()),
            "selected": list(outcome.features)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _impute(federation: Federation, cfg: PipelineConfig) -> dict[str, Any]:
    """FedHF-Impute; when other steps follow, every site then fills its table (clipped to the
    pooled observed range, integer columns rounded) so that they work on the imputed data."""
    from ..federation.impute_flow import ImputeConfig, apply_imputation, run_imputation
    from ..federation.profile_flow import pooled_ranges, profile_sites

    rest = [s for s in cfg.steps if s != "imputation"]
    # a site's observed min/max are individual values: a private run does not ask for them
    private = cfg.secure_aggregation or cfg.dp is not None
    ranges = pooled_ranges(profile_sites(federation)) if rest and not private else {}
    icfg = ImputeConfig(**{"rounds": cfg.impute_rounds, "local_epochs": cfg.impute_local_epochs,
                           "seed": cfg.seed, "robust": cfg.robust, "max_site_share": cfg.max_site_share,
                           "secure_aggregation": cfg.secure_aggregation, "dp": cfg.dp, **cfg.impute_config})
    im = run_imputation(federation, icfg)
    summary = {
        "left_out": dict(im.left_out),
        "columns": list(im.columns),
        "validation": _jsonable(getattr(im, "validation", None)),
        "best_round": _jsonable(getattr(im, "best_round", None)),
        "history": _jsonable(getattr(im, "history", None)),
        "privacy": _jsonable(im.privacy),
    }
    if rest:
        if private:  # clipped to dp's public bounds when given, else not at all; nothing rounded
            low, high = _public_bounds(cfg.dp, im.columns)
            integer = np.zeros(len(im.columns), dtype=bool)
        else:
            low = np.array([ranges[c]["low"] for c in im.columns])
            high = np.array([ranges[c]["high"] for c in im.columns])
            integer = np.array([ranges[c]["integer"] for c in im.columns])
        summary["applied"] = apply_imputation(federation, im, low, high, integer)
    return summary


def _score_test(federation: Federation, cfg: PipelineConfig) -> dict[str, Any]:
    """The pooled score-test selection (one-vs-rest with more than two classes).

    Raises:
        ValueError: with ``dp`` or ``robust`` (the score test has neither mode), or from
            the selection (a continuous or single-class target, ...).
    """
    if cfg.dp is not None or cfg.robust:
        raise ValueError("the score-test step has no DP or robust mode; use the election for a dp or robust run")
    from ..federation.score_test_flow import run_pooled_score_test

    st = run_pooled_score_test(federation, alpha=cfg.score_test_alpha, one_vs_rest=True)
    return {"selected": list(st.selected_names), "kept": len(st.selected_names), "entered": list(st.selected),
            "feature_names": list(st.feature_names), "mask": [bool(m) for m in st.mask],
            "p": _jsonable(st.p), "alpha": cfg.score_test_alpha, "stopped": _jsonable(st.stopped),
            "exchanges": int(st.exchanges)}


def _public_bounds(dp: Mapping[str, Any] | None, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` per column from ``dp["bounds"]`` (the float range where none is given)."""
    bounds = (dp or {}).get("bounds")
    big = float(np.finfo(np.float64).max)
    low, high = np.full(len(columns), -big), np.full(len(columns), big)
    for i, c in enumerate(columns):
        b = bounds.get(c) if isinstance(bounds, Mapping) else bounds
        if isinstance(b, (list, tuple)) and len(b) == 2:
            low[i], high[i] = float(b[0]), float(b[1])
    return low, high


def _plan_dp(federation: Federation, cfg: PipelineConfig) -> None:
    from ..federation import election_flow
    from ..federation.protocol import plan_run_ledger
    from ..federation.training.steps import dp_plan as training_plan
    from ..learn.models import make_model

    plans = []
    if "election" in cfg.steps:
        plans.append(election_flow.dp_plan(True, "training" in cfg.steps))
    if "training" in cfg.steps:
        plans.append(training_plan(make_model(cfg.model), cfg.rounds, cfg.local_epochs, 0, "election" in cfg.steps))
    if plans:
        plan_run_ledger(federation, plans)


def run_pipeline(federation: Federation, config: Mapping[str, Any] | PipelineConfig) -> dict[str, Any]:
    """Run the configured steps on ``federation`` and return a JSON-able summary.

    Returns:
        ``{"sites", "steps", "seconds", "election"?, "tuning"?, "training"?, "imputation"?}``;
        ``election`` has ``selected`` (names), ``kept``, ``mask`` (over the global feature
        order) and ``stats``; ``score_test`` has ``selected``, ``entered`` (order of
        entry), ``mask``, ``p``, ``stopped`` and ``exchanges``; ``training`` has ``weighted_f1``, ``pooled``, ``per_site``,
        ``features``, ``classes`` and ``params`` (lists); ``imputation`` has the validation
        RMSE and the best round; ``participation`` lists per exchange the sites whose
        reply was used (``{"step", "sites"}``) and ``dropped`` the sites left out, with why;
        ``imputation`` also has ``applied`` (cells imputed and clipped per site) when other
        steps followed.

    Raises:
        FederationError / ValueError: from the workflows (naming the failing site).
    """
    cfg = config if isinstance(config, PipelineConfig) else PipelineConfig.from_mapping(config)
    set_quorum(federation, cfg.min_sites)
    set_options(federation, secure_aggregation=cfg.secure_aggregation, dp=cfg.dp, robust=cfg.robust,
                max_site_share=cfg.max_site_share, min_holders=cfg.min_holders)
    if cfg.dp is not None:  # one accountant for the election's and the training's releases
        _plan_dp(federation, cfg)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"sites": list(federation.sites), "steps": list(cfg.steps)}
    if "imputation" in cfg.steps:  # first: the other steps work on the imputed tables
        out["imputation"] = _impute(federation, cfg)
    fd = cfg.freedom_degree
    if "tuning" in cfg.steps:
        out["tuning"] = _tune(federation, cfg)
        if out["tuning"]["freedom_degree"] is not None:
            fd = out["tuning"]["freedom_degree"]
    features = None
    described = None
    if "election" in cfg.steps:
        el = run_election(federation, fd, selector=cfg.selector, aggregation=cfg.aggregation,
                          normalization=cfg.normalization, compat=cfg.compat,
                          describe="train" if "training" in cfg.steps else None,
                          consensus=cfg.consensus, consensus_alpha=cfg.consensus_alpha)
        described = el.described
        res = el.result
        features = res.selected_names
        out["election"] = {
            "selected": features,
            "kept": len(features),
            "feature_names": list(res.feature_names),
            "mask": [bool(m) for m in res.mask],
            "freedom_degree": float(fd),
            "compat": cfg.compat,
            "stats": _jsonable(res.stats),
            "sites": el.site_summary(),
            "privacy": _jsonable(el.privacy),
        }
    if "score-test" in cfg.steps:
        out["score_test"] = _score_test(federation, cfg)
        features = out["score_test"]["selected"]
    if "training" in cfg.steps:
        tr = run_training(federation, features, model=cfg.model, rounds=cfg.rounds, local_epochs=cfg.local_epochs,
                          seed=cfg.seed, described=described)
        out["training"] = {
            "model": tr.model,
            "robust": tr.robust,
            "left_out": dict(tr.left_out),
            "weighted_f1": tr.pooled["weighted_f1"],
            "pooled": _jsonable(tr.pooled),
            "per_site": _jsonable(tr.per_site),
            "features": tr.features,
            "classes": tr.classes,
            "params": {k: np.asarray(v).tolist() for k, v in tr.params.items()},
            "privacy": _jsonable(tr.privacy),
        }
    out["participation"] = list(federation.participation)
    out["dropped"] = dict(federation.dropped)
    out["seconds"] = time.perf_counter() - t0
    return out
