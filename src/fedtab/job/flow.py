"""The job as one engine-neutral server workflow: ``job_workflow(federation, config) -> dict``.

Steps, in this order on every engine (each a request built here, a site handler, a
validated reduction):

1. **schema** — ``job_profile``: every site sends its feature column names and kinds,
   per numeric column whether all observed values are integers and their min/max, its
   row counts (rows without a label were dropped when the site was built, and are
   counted) and its label keys. The server fixes the global schema (ordered union),
   rejects a site whose columns share nothing with the others, and agrees the category
   lists of non-numeric columns (sites send category *sets*), which every site one-hot
   encodes;
2. **imputation** (``plan["impute"]``) — FedHF-Impute over the feature columns, then
   every site fills its table (clipped to the pooled observed range, integers rounded);
3. **tuning** (``plan["election"]["tune"]``) — the freedom degree on validation rows;
4. **election** (``plan["election"]``) — Feature Election with abstention;
5. **training** — FedAvg (or exact aggregation) on the elected columns;
6. **evaluation** — metrics pooled and per site on the test rows (the training's final
   ``evaluate`` exchange, so it is timed within the ``training`` step), and the baselines:
   the majority class and each site's local-only model (``local_baseline``, one exchange).

``config["job"]`` is the job plan: :meth:`fedtab.job.spec.JobSpec.to_dict` (a dict, or the
same as JSON text for engines whose run config holds only strings). The return value is
JSON-able: the ``result.json`` content plus ``"model"``, everything the model file needs.
Nothing here imports an engine.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from ..federation.profile_flow import pooled_ranges, profile_sites
from ..federation.protocol import Federation, FederationError

__all__ = ["job_workflow", "JOB_STEPS"]

#: the timed steps of ``result["steps"]``, in run order (absent ones are skipped)
JOB_STEPS = ("schema", "imputation", "tuning", "election", "training", "baselines")


# ----------------------------------------------------------------------------- server side
class _Steps:
    """Wall time and traffic of each step, in run order."""

    def __init__(self, federation: Federation, progress: Callable[[str], None]) -> None:
        self.federation, self.progress, self.rows = federation, progress, []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.progress(name)
        d0, u0 = self.federation.traffic.total()
        t0 = time.perf_counter()
        out = fn()
        d1, u1 = self.federation.traffic.total()
        self.rows.append({"step": name, "seconds": time.perf_counter() - t0, "bytes_down": d1 - d0, "bytes_up": u1 - u0})
        return out


def _schema(profiles: Mapping[str, dict[str, Any]], target: str) -> dict[str, Any]:
    """Global columns, kinds, pooled ranges and integer flags; raises for disjoint or conflicting sites."""
    columns: dict[str, None] = {}
    kinds: dict[str, set[str]] = {}
    for p in profiles.values():
        for c, k in zip(p["columns"], p["kinds"]):
            columns.setdefault(c, None)
            kinds.setdefault(c, set()).add(k)
    if len(profiles) > 1:
        for s, p in profiles.items():
            others = {c for o, q in profiles.items() if o != s for c in q["columns"]}
            if not set(p["columns"]) & others:
                raise FederationError(f"site {s!r} shares no column with the other sites (its columns: "
                                      f"{p['columns'][:8]}); check its file and the target {target!r}")
    mixed = [c for c, k in kinds.items() if len(k) > 1]
    if mixed:
        raise FederationError(f"columns {mixed[:5]} are numeric at some sites and text at others")
    ranges = pooled_ranges(profiles)
    classes = sorted({c for p in profiles.values() for c in p["classes"]}, key=_label_order)
    return {
        "columns": list(columns),
        "target": target,
        "classes": classes,
        "categorical": [c for c in columns if kinds[c] == {"categorical"}],
        "integer_columns": [c for c in columns if c in ranges and ranges[c]["integer"]],
        "ranges": {c: [ranges[c]["low"], ranges[c]["high"]] for c in columns if c in ranges},
    }


def _label_order(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _encoded_columns(schema: dict[str, Any]) -> tuple[list[str], dict[str, list[float]], list[str]]:
    """The feature columns after one-hot encoding, with ranges and integer flags (indicators are 0/1)."""
    from ..data.categories import onehot_name

    cols, ranges, integer = [], dict(schema["ranges"]), list(schema["integer_columns"])
    for c in schema["columns"]:
        if c in schema["categories"]:
            names = [onehot_name(c, v) for v in schema["categories"][c]]
            cols += names
            ranges.update({n: [0.0, 1.0] for n in names})
            integer += names
        else:
            cols.append(c)
    return cols, ranges, integer


def _plan(config: Mapping[str, Any]) -> dict[str, Any]:
    plan = config.get("job", config)
    if isinstance(plan, str):
        plan = json.loads(plan)
    if not isinstance(plan, Mapping) or "target" not in plan:
        raise ValueError("job_workflow needs config['job']: the job plan (JobSpec.to_dict()) as a dict or JSON")
    return dict(plan)


def _arrays(params: Mapping[str, np.ndarray]) -> dict[str, list]:
    return {k: np.asarray(v).tolist() for k, v in params.items()}


def job_workflow(federation: Federation, config: Mapping[str, Any],
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the job's steps on ``federation`` (see the module docstring).

    Args:
        config: ``{"job": plan}`` (the plan may be JSON text), as engines pass run configs.
        progress: called with each step's name as it starts.

    Returns:
        JSON-able ``{"sites", "schema", "imputation", "tuning", "election", "training",
        "baselines", "steps", "model"}`` (``docs/job.md`` describes each key).

    Raises:
        FederationError: a site failed or replied something invalid (naming it), sites
            whose columns are disjoint, an election that keeps no column.
        ValueError: an invalid plan.
    """
    from ..federation.election_flow import run_election
    from ..federation.encoding_flow import agree_categories, encode_categories
    from ..federation.training_flow import run_training

    plan = _plan(config)
    steps = _Steps(federation, progress or (lambda _name: None))
    seed = int(plan.get("run", {}).get("seed", 0))
    target = str(plan["target"])
    out: dict[str, Any] = {"imputation": None, "tuning": None, "election": None}

    def schema_step() -> dict[str, Any]:
        profiles = profile_sites(federation)
        schema = _schema(profiles, target)
        cats = agree_categories(federation, schema["categorical"]) if schema["categorical"] else {}
        if cats:
            encode_categories(federation, cats, same_width=False)
        schema["categories"] = cats
        out["sites"] = {s: {"n_rows": p["rows"] + p["unlabelled"], "dropped_unlabelled": p["unlabelled"],
                            "n_train": p["train"], "n_test": p["test"], "columns": p["columns"],
                            "unavailable_columns": [c for c in schema["columns"] if c not in p["columns"]],
                            "selector": p["selector"]} for s, p in profiles.items()}
        return schema

    schema = steps.run("schema", schema_step)
    out["schema"] = schema
    features, ranges, integer = _encoded_columns(schema)
    imputer = None

    if plan.get("impute") is not None:
        def impute_step() -> Any:
            from ..federation.impute_flow import ImputeConfig, apply_imputation, run_imputation

            ip = plan["impute"]
            icfg = ImputeConfig(rounds=int(ip["rounds"]), local_epochs=int(ip["local_epochs"]),
                                hidden_dim=int(ip["hidden_dim"]), n_layers=int(ip["n_layers"]),
                                k_neighbors=int(ip["k_neighbors"]), lr=float(ip["lr"]),
                                mask_fraction=float(ip["mask_fraction"]), use_prior=bool(ip["prior"]),
                                prior_rank=ip.get("prior_rank"), seed=seed)
            im = run_imputation(federation, icfg)
            low = np.array([ranges[c][0] for c in im.columns])
            high = np.array([ranges[c][1] for c in im.columns])
            is_int = np.array([c in integer for c in im.columns])
            counts = apply_imputation(federation, im, low, high, is_int)
            return im, low, high, is_int, counts

        im, low, high, is_int, counts = steps.run("imputation", impute_step)
        out["imputation"] = {
            "columns": list(im.columns),
            "validation": im.validation,
            "rounds": len(im.history),
            "training_curve": im.history,
            "best_round": im.best_round,
            "imputed_cells": {s: c["imputed"] for s, c in counts.items()},
            "clipped_cells": {s: c["clipped"] for s, c in counts.items()},
            "linear_prior_rank": None if im.prior_W is None else int(im.prior_W.shape[1]),
        }
        imputer = {
            "columns": list(im.columns), "mean": im.mean.tolist(), "std": im.std.tolist(),
            "edge_index": im.graph.edge_index.tolist(), "weight": im.graph.weight.tolist(),
            "sign": im.graph.sign.tolist(), "model_config": dict(im.model_config),
            "weights": _arrays(im.weights), "weight_dtypes": {k: str(np.asarray(w).dtype) for k, w in im.weights.items()},
            "prior_W": None if im.prior_W is None else im.prior_W.tolist(),
            "prior_psi": None if im.prior_psi is None else im.prior_psi.tolist(),
            "low": low.tolist(), "high": high.tolist(), "integer": is_int.tolist(),
        }

    tr_cfg = plan.get("training", {})
    model, rounds, local_epochs = tr_cfg.get("model", "logistic"), int(tr_cfg.get("rounds", 10)), int(
        tr_cfg.get("local_epochs", 5))
    el_cfg = plan.get("election")
    described = None
    if el_cfg is not None:
        fd = el_cfg.get("freedom_degree")
        fd = 0.5 if fd is None else float(fd)
        if el_cfg.get("tune", "none") != "none":
            def tune_step() -> Any:
                from ..federation.tuning_flow import tune_flow

                return tune_flow(federation, model=model, tune_method=el_cfg["tune"], rounds=rounds,
                                 local_epochs=local_epochs, tolerance=float(el_cfg.get("tolerance", 0.01)),
                                 aggregation=el_cfg.get("aggregation", "weighted"),
                                 normalization=el_cfg.get("normalization", "all"),
                                 compat=el_cfg.get("compat"), seed=seed, apply=False)

            tuned = steps.run("tuning", tune_step)
            fd = float(tuned.tuning.freedom_degree)
            out["tuning"] = tuned.tuning.to_dict()

        def election_step() -> Any:
            return run_election(federation, fd, aggregation=el_cfg.get("aggregation", "weighted"),
                                normalization=el_cfg.get("normalization", "all"),
                                compat=el_cfg.get("compat"), describe="train",
                                consensus=el_cfg.get("consensus", "intersection"),
                                consensus_alpha=float(el_cfg.get("consensus_alpha", 0.05)))

        outcome = steps.run("election", election_step)
        res = outcome.result
        if not res.selected_names:
            raise FederationError(f"the election at freedom degree {fd:g} kept no column; lower the selectors' "
                                  "strictness or raise freedom_degree")
        chosen = {b.site: {n for n, m in zip(b.feature_names or (), b.mask) if m} for b in outcome.ballots}
        out["election"] = {
            "freedom_degree": fd, "selected": list(res.selected_names), "stats": dict(res.stats),
            "features": [{**f, "chosen_by": [s for s, c in chosen.items() if f["feature"] in c]}
                         for f in res.explain_records()],
            "sites": outcome.site_summary(),
        }
        features, described = list(res.selected_names), outcome.described

    tr = steps.run("training", lambda: run_training(federation, features, model=model, rounds=rounds,
                                                    local_epochs=local_epochs, seed=seed, described=described))
    from ..federation.baseline_flow import run_baselines
    from ..learn.models import make_model

    out["baselines"] = steps.run("baselines", lambda: run_baselines(federation, tr))
    fm = make_model(model)
    out["training"] = {"model": tr.model, "rounds": tr.rounds, "local_epochs": local_epochs, "features": tr.features,
                       "classes": tr.classes, "n_params": tr.n_params, "history": tr.history, "metrics": tr.metrics}
    out["steps"] = steps.rows
    out["model"] = {
        "schema": schema,
        "encoded_columns": _encoded_columns(schema)[0],
        "imputer": imputer,
        "features": tr.features,
        "classes": tr.classes,
        "mean": np.asarray(tr.mean).tolist(),
        "std": np.asarray(tr.std).tolist(),
        "model": {"name": fm.name, "params": fm.get_params()},
        "params": _arrays(tr.params),
    }
    return out
