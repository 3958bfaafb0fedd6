"""The ``fedtab`` command (typer + rich).

Commands: ``demo`` (the seed experiment), ``elect`` (Feature Election on real site
tables), and ``impute`` when the imputation extra is installed. Errors in the input
end with a one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Federated feature election, imputation and training for tabular data.")
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as an error and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


@app.callback()
def _main() -> None:
    """fedtab: prepare and train on tables that stay at their sites."""


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Directory for result.json and sweep.png.")] = Path("fedtab-demo"),
    seed: Annotated[int, typer.Option(help="Seed of the synthetic table, the split and the selectors.")] = 0,
    rows: Annotated[int, typer.Option(min=100, help="Rows of the synthetic table (split 50/30/20).")] = 2000,
) -> None:
    """Run the seed experiment: 3 sites, 3 selectors, a sweep over the freedom degree."""
    from .demo import DemoConfig, run_demo
    from .report.plots import plot_sweep

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
    console.print(f"wrote {out / 'result.json'} and {png} in {seconds:.1f} s")


@app.command()
def elect(
    tables: Annotated[list[Path], typer.Argument(help="One CSV/Parquet file per site (at least one).")],
    target: Annotated[str, typer.Option("--target", "-t", help="Label column, present at every site.")],
    selector: Annotated[
        Optional[list[str]],
        typer.Option("--selector", "-s", help="Selector name for all sites, or repeat once per site in file order. "
                     "Known: lasso, elastic_net, random_forest, mutual_info, anova, chi2 (and any registered)."),
    ] = None,
    freedom_degree: Annotated[float, typer.Option("--freedom-degree", "--fd", min=0.0, max=1.0,
                                                  help="Share of disputed features admitted by vote (0 = intersection, 1 = union).")] = 0.5,
    aggregation: Annotated[str, typer.Option(help="Site weights: 'weighted' (by rows) or 'uniform'.")] = "weighted",
    normalization: Annotated[str, typer.Option(help="'all' (fedtab) or 'selected' (NVIDIA FLARE's variant).")] = "all",
    tune: Annotated[str, typer.Option(help="Choose fd on validation rows: 'none' (use --freedom-degree), 'grid' "
                                      "(smallest mask within --tolerance of the best) or 'hill-climb' (the peers' search).")] = "none",
    model: Annotated[str, typer.Option(help="Model trained by the federation: logistic, sgd, gnb (exact) or mlp.")] = "logistic",
    tolerance: Annotated[float, typer.Option(min=0.0, help="Grid tuning: F1 slack within which the smallest mask wins.")] = 0.01,
    validation_size: Annotated[float, typer.Option(min=0.05, max=0.9, help="Tuning: share of each site's training rows used for validation.")] = 0.25,
    train: Annotated[bool, typer.Option(help="Train the model on all and on the elected columns (always on with --tune).")] = True,
    rounds: Annotated[int, typer.Option(min=1, help="FedAvg rounds when training.")] = 10,
    local_epochs: Annotated[int, typer.Option(min=1, help="Local epochs per FedAvg round.")] = 5,
    test_size: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each site's rows held out for testing.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the train/test splits and selectors.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory: result.json and elected_columns.txt.")] = Path("fedtab-elect"),
) -> None:
    """Feature Election on real tables: one file per site, each site votes with its own selector."""
    from .data.tables import TableError, read_table
    from .election.rule import check_aggregation, check_normalization
    from .election.selectors import make_selector
    from .engines.local import LocalFederation
    from .federation import FederationError, Site, run_election, run_training
    from .federation.encoding_flow import federated_one_hot
    from .learn.models import make_model

    try:
        check_aggregation(aggregation)
        check_normalization(normalization)
        make_model(model)
        if tune not in ("none", "grid", "hill-climb"):
            fail(f"--tune must be 'none', 'grid' or 'hill-climb', got {tune!r}")
        sel_names = selector or ["lasso"]
        if len(sel_names) not in (1, len(tables)):
            fail(f"give one --selector for all sites or one per site ({len(tables)}), got {len(sel_names)}")
        if len(sel_names) == 1:
            sel_names = sel_names * len(tables)
        for s in sel_names:
            make_selector(s)
        frames = [read_table(p) for p in tables]
        lacking = [str(p) for p, f in zip(tables, frames) if target not in f.columns]
        if lacking:
            fail(f"target column {target!r} is missing at: {', '.join(lacking)} (the sites need a common target)")
        names: list[str] = []
        for p in tables:
            stem = p.name.split(".")[0] or "site"
            name, k = stem, 2
            while name in names:
                name, k = f"{stem}-{k}", k + 1
            names.append(name)
        sites = [Site(n, f, target, test_size=test_size, seed=seed, selector=s)
                 for n, f, s in zip(names, frames, sel_names)]
        fed = LocalFederation(sites)
        categorical = sorted({str(c) for f in frames for c in f.columns
                              if c != target and not (pd.api.types.is_numeric_dtype(f[c]) or pd.api.types.is_bool_dtype(f[c]))})
        if categorical:
            with console.status(f"agreeing categories of {len(categorical)} columns (sites send category sets, no rows)"):
                federated_one_hot(fed, categorical)
        if tune != "none":
            from .federation.tuning_flow import tune_flow

            with console.status(f"tuning the freedom degree ({tune}) on validation rows"):
                tuned = tune_flow(fed, model=model, tune_method=tune, rounds=rounds, local_epochs=local_epochs,
                                  tolerance=tolerance, validation_size=validation_size, aggregation=aggregation,
                                  normalization=normalization, seed=seed, apply=False)
            freedom_degree = float(tuned.tuning.freedom_degree)
        with console.status("sites are voting"):
            outcome = run_election(fed, freedom_degree, aggregation=aggregation, normalization=normalization)
        result = outcome.result
        doc = {"sites": [dict(s, selector=sel, file=str(p)) for s, sel, p in zip(outcome.site_summary(), sel_names, tables)],
               "categorical_columns": categorical, **result.to_dict()}
        if tune != "none":
            doc["tuning"] = tuned.tuning.to_dict()
        if train or tune != "none":
            with console.status("training on all columns (FedAvg)"):
                all_cols = list(dict.fromkeys(c for s in sites for c in s.feature_names))
                full = run_training(fed, all_cols, model=model, rounds=rounds, local_epochs=local_epochs, seed=seed)
            trained = None
            if result.selected_names:
                with console.status("training on the elected columns (FedAvg)"):
                    trained = run_training(fed, model=model, rounds=rounds, local_epochs=local_epochs, seed=seed)
            doc["training"] = {
                "model": model,
                "rounds": rounds,
                "all_features": {"f1": full.pooled["weighted_f1"], "n_params": full.n_params},
                "elected": None if trained is None else {"f1": trained.pooled["weighted_f1"], "n_params": trained.n_params,
                                                          "per_site_f1": {k: v["weighted_f1"] for k, v in trained.per_site.items()}},
            }
    except (TableError, FederationError, ValueError) as exc:
        fail(str(exc))
        return

    tab = Table(title=f"Feature Election (fd={freedom_degree:g}, {aggregation}, normalization={normalization})")
    for col in ("site", "selector", "rows (train)", "selected"):
        tab.add_column(col)
    for s in doc["sites"]:
        tab.add_row(s["name"], s["selector"], str(s["n_samples"]), str(s["selected"]))
    console.print(tab)
    st = result.stats
    console.print(f"intersection {st['intersection']}, union {st['union']}, disputed {st['disputed']} → "
                  f"[bold]{st['kept']}[/] of {st['features']} columns elected")
    if "tuning" in doc:
        console.print(f"tuned freedom degree ({tune}): {freedom_degree:g}")
    if "training" in doc:
        t = doc["training"]
        line = f"{model} trained by the federation, weighted F1: all columns {t['all_features']['f1']:.3f} ({t['all_features']['n_params']} params)"
        if t["elected"]:
            line += f", elected {t['elected']['f1']:.3f} ({t['elected']['n_params']} params)"
        console.print(line)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(doc, indent=2))
    (out / "elected_columns.txt").write_text("\n".join(result.selected_names) + ("\n" if result.selected_names else ""))
    console.print(f"wrote {out / 'result.json'} and {out / 'elected_columns.txt'}")


def _register_optional_commands() -> None:
    try:
        from .impute_cli import impute_command
    except ImportError:
        return
    app.command("impute")(impute_command)


_register_optional_commands()

if __name__ == "__main__":  # pragma: no cover
    app()
