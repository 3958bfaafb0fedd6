"""``fedtab demo``: the seed experiment.

100 features from ``make_classification`` (12 informative + 8 redundant + 80 noise,
``shuffle=False``, so the signal is the first 20 columns), rows split 50/30/20
(stratified) over three sites that trust different selectors: Lasso, random forest,
mutual information. Every run is a :class:`~fedtab.job.spec.JobSpec` on the job's step loop
over one in-process federation: first the model on all features, then for each freedom
degree an election (the first one gathers the ballots, the others elect from them) and a
FedAvg logistic regression on the elected columns, scored by weighted F1 on the sites'
held-out test splits (pooled).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

import typer

from . import console, outcome

__all__ = ["DemoConfig", "demo_spec", "run_demo", "demo_command", "SIGNAL_FEATURES"]

#: signal columns of the demo table (informative + redundant, first 20 with shuffle=False)
SIGNAL_FEATURES = 20


@dataclass
class DemoConfig:
    """Settings of the seed experiment (defaults = the documented demo)."""

    n_samples: int = 2000
    seed: int = 0
    fractions: Sequence[float] = (0.5, 0.3, 0.2)
    selectors: Sequence[Any] = (
        {"name": "lasso", "params": {"C": 0.05}},
        "random_forest",
        "mutual_info",
    )
    freedom_degrees: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0)
    rounds: int = 10
    local_epochs: int = 5
    extra: dict[str, Any] = field(default_factory=dict)


def _selector_name(spec: Any) -> str:
    if isinstance(spec, dict):
        params = ", ".join(f"{k}={v}" for k, v in (spec.get("params") or {}).items())
        return f"{spec['name']}({params})" if params else spec["name"]
    return str(spec)


def demo_spec(cfg: DemoConfig, sites: list[str], *, freedom_degree: float | None = None, train: bool = True) -> Any:
    """The job of one demo run: an election at ``freedom_degree`` (none when ``None``) and/or the
    training, on numeric tables (no profile exchange, no baselines)."""
    from ..job.spec import (ElectionSpec, EvaluationSpec, JobSpec, RunSpec, SchemaSpec, SiteSpec, TrainingSpec,
                            check_spec)

    return check_spec(JobSpec(
        target="target", sites=[SiteSpec(n, None, selector=sel) for n, sel in zip(sites, cfg.selectors)],
        election=None if freedom_degree is None else ElectionSpec(selector=cfg.selectors[0],
                                                                  freedom_degree=freedom_degree),
        training=TrainingSpec("logistic", cfg.rounds, cfg.local_epochs) if train else None,
        run=RunSpec(seed=cfg.seed), schema=SchemaSpec(profile=False), evaluation=EvaluationSpec(baselines=False),
        source="fedtab demo"))


def run_demo(config: DemoConfig | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the experiment and return the ``result.json`` document (see the README)."""
    from ..data.synthetic import classification_table, split_rows
    from ..engines.local import LocalFederation
    from fedtab.federation.site.core import Site
    from ..job.outputs import Outputs
    from ..job.workflow import run_workflow

    cfg = config or DemoConfig()
    say = progress or (lambda _msg: None)
    table = classification_table(cfg.n_samples, 100, 12, 8, 0, shuffle=False, seed=cfg.seed)
    parts = split_rows(table, cfg.fractions, stratify="target", seed=cfg.seed)
    sites = [
        Site(f"site-{i + 1}", part, "target", seed=cfg.seed, selector=sel)
        for i, (part, sel) in enumerate(zip(parts, cfg.selectors))
    ]
    names = [s.name for s in sites]
    fed = LocalFederation(sites)
    features = [c for c in table.columns if c != "target"]
    signal = set(features[:SIGNAL_FEATURES])

    say("training on all features")
    full = run_workflow(fed, demo_spec(cfg, names)).outcomes["training"]
    sweep, ballots, site_rows = [], None, []
    stats: dict[str, int] = {}
    for fd in cfg.freedom_degrees:
        say(f"freedom degree {fd:g}: electing and training" if ballots else "gathering ballots")
        outcome = run_workflow(fed, demo_spec(cfg, names, freedom_degree=float(fd), train=False),
                               outputs=Outputs(ballots=ballots)).outcomes["election"]
        if ballots is None:
            ballots = outcome.ballots
            for b, sel in zip(ballots, cfg.selectors):
                chosen = {n for n, m in zip(b.feature_names or (), b.mask) if m}
                site_rows.append({"name": b.site, "selector": _selector_name(sel), "n_samples": b.n_samples,
                                  "selected": len(chosen), "signal_selected": len(chosen & signal)})
        stats = outcome.result.stats
        kept = set(outcome.result.selected_names)
        row: dict[str, Any] = {"freedom_degree": float(fd), "kept": len(kept), "signal": len(kept & signal),
                               "noise": len(kept - signal)}
        if kept:  # on the elected columns the sites were told
            trained = run_workflow(fed, demo_spec(cfg, names)).outcomes["training"]
            row.update(f1=trained.pooled["weighted_f1"], n_params=trained.n_params)
        else:
            row.update(f1=0.0, n_params=0)
        sweep.append(row)
    return {
        "sites": site_rows,
        "intersection": stats.get("intersection", 0),
        "union": stats.get("union", 0),
        "all_features_f1": full.pooled["weighted_f1"],
        "all_features_params": full.n_params,
        "signal_features": SIGNAL_FEATURES,
        "n_features": len(features),
        "sweep": sweep,
    }


def demo_command(
    out: Annotated[Path, typer.Option(help="Directory for result.json and sweep.png.")] = Path("fedtab-demo"),
    seed: Annotated[int, typer.Option(help="Seed of the synthetic table, the split and the selectors.")] = 0,
    rows: Annotated[int, typer.Option(min=100, help="Rows of the synthetic table (split 50/30/20).")] = 2000,
) -> None:
    """Run the seed experiment: 3 sites, 3 selectors, a sweep over the freedom degree."""
    from rich.table import Table

    from ..report.plots import plot_sweep

    t0 = time.perf_counter()
    with console.status("starting") as status:
        result = run_demo(DemoConfig(n_samples=rows, seed=seed), progress=lambda m: status.update(m))
    seconds = time.perf_counter() - t0

    console.rule("[bold]Feature Election demo[/]: 100 features, 20 signal (12 informative + 8 redundant), 80 noise")
    sites = Table(title="Each site's own selection")
    for col in ("site", "selector", "rows (train)", "selected", "of which signal"):
        sites.add_column(col, justify="right" if col not in ("site", "selector") else "left")
    for s in result["sites"]:
        sites.add_row(s["name"], s["selector"], str(s["n_samples"]), str(s["selected"]), str(s["signal_selected"]))
    console.print(sites)
    console.print(f"intersection: {result['intersection']} features, union: {result['union']} features")

    sweep = Table(title="Freedom-degree sweep (FedAvg logistic regression, weighted F1 on the sites' test splits)")
    for col in ("freedom degree", "kept", "signal", "noise", "parameters", "F1"):
        sweep.add_column(col, justify="right")
    for r in result["sweep"]:
        sweep.add_row(f"{r['freedom_degree']:g}", str(r["kept"]), f"{r['signal']}/{result['signal_features']}",
                      str(r["noise"]), str(r["n_params"]), f"{r['f1']:.3f}")
    sweep.add_row("all features", str(result["n_features"]), f"{result['signal_features']}/{result['signal_features']}",
                  str(result["n_features"] - result["signal_features"]), str(result["all_features_params"]),
                  f"{result['all_features_f1']:.3f}", style="dim")
    console.print(sweep)

    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    png = plot_sweep(result["sweep"], out / "sweep.png", title="Feature Election demo: features kept vs freedom degree")
    outcome(f"wrote {out / 'result.json'} and {png} in {seconds:.1f} s")
