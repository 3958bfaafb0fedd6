"""``fedtab elect``: Feature Election on real site tables (one file per site)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer
from rich.table import Table

from . import console, fail, finite_number

__all__ = ["elect_command", "max_site_share_option"]


def max_site_share_option(value: float) -> float:
    """Typer callback of ``--max-site-share``: a number in (0, 1], NaN refused at parse time."""
    from ..federation.reduce import check_max_site_share

    try:
        return check_max_site_share(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("max_site_share", "--max-site-share")) from None


def elect_command(
    tables: Annotated[list[Path], typer.Argument(help="One CSV/Parquet file per site (at least one).")],
    target: Annotated[str, typer.Option("--target", "-t", help="Label column, present at every site.")],
    selector: Annotated[
        Optional[list[str]],
        typer.Option("--selector", "-s", help="Selector name for all sites, or repeat once per site in file order. "
                     "Known: lasso, elastic_net, random_forest, mutual_info, anova, chi2 (and any registered)."),
    ] = None,
    freedom_degree: Annotated[float, typer.Option("--freedom-degree", "--fd", min=0.0, max=1.0, callback=finite_number,
                                                  help="Share of disputed features admitted by vote (0 = intersection, 1 = union).")] = 0.5,
    aggregation: Annotated[str, typer.Option(help="Site weights: 'weighted' (by rows) or 'uniform'.")] = "weighted",
    normalization: Annotated[str, typer.Option(help="'all' (fedtab) or 'selected' (NVIDIA FLARE's normalisation only).")] = "all",
    compat: Annotated[Optional[str], typer.Option(help="Elect with a peer's whole server rule, exactly: 'nvflare', "
                                                  "'flash' or 'flower' (default: fedtab's rule).")] = None,
    tune: Annotated[str, typer.Option(help="Choose fd on validation rows: 'none' (use --freedom-degree), 'grid' "
                                      "(smallest mask within --tolerance of the best) or 'hill-climb' (the peers' search).")] = "none",
    model: Annotated[str, typer.Option(help="Model trained by the federation: logistic, sgd, gnb (exact) or mlp.")] = "logistic",
    tolerance: Annotated[float, typer.Option(min=0.0, help="Grid tuning: F1 slack within which the smallest mask wins.")] = 0.01,
    train: Annotated[bool, typer.Option(help="Train the model on all and on the elected columns (always on with --tune).")] = True,
    rounds: Annotated[int, typer.Option(min=1, help="FedAvg rounds when training.")] = 10,
    local_epochs: Annotated[int, typer.Option(min=1, help="Local epochs per FedAvg round.")] = 5,
    test_size: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each site's rows held out for testing.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the train/test splits and selectors.")] = 0,
    min_rows: Annotated[int, typer.Option(min=1, help="Every site's disclosure floor: no number computed over fewer "
                                          "rows leaves a site (its policy's min_rows).")] = 10,
    robust: Annotated[bool, typer.Option("--robust", help="Robust reducers: median vote, screened and capped "
                                         "moments, coordinate-wise median FedAvg, median scores (docs/trust.md).")] = False,
    max_site_share: Annotated[float, typer.Option(callback=max_site_share_option,
                                                  help="With --robust: most of a pooled sum one site may carry.")] = 0.5,
    out: Annotated[Path, typer.Option(help="Output directory: result.json, report.html and elected_columns.txt.")] = Path("fedtab-elect"),
    na_value: Annotated[Optional[list[str]], typer.Option(help="Extra strings read as missing (repeatable), e.g. '?'.")] = None,
    min_holders: Annotated[Optional[int], typer.Option(min=1, help="Sites that must hold a feature for it to be "
                                                       "consensus (default 2 with two or more sites).")] = None,
    min_sites: Annotated[Optional[int], typer.Option(min=1, help="Quorum: a site that fails or sends a rejected reply "
                                                     "is dropped (named) while this many remain (default: all).")] = None,
    timeout: Annotated[Optional[float], typer.Option(min=0.001, callback=finite_number,
                                                     help="Seconds each site may take per exchange (default: no limit).")] = None,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Training sends only masked sums (descriptions, updates, evaluation "
                                     "counts); the server learns no single site's. Not with --tune.")] = False,
    consensus: Annotated[str, typer.Option(help="'intersection' (the rule) or 'stouffer': consensus = features whose "
                                           "combined p-value over the sites passes Benjamini-Hochberg (for label-"
                                           "skewed sites; needs a test-based selector such as anova or chi2).")
                         ] = "intersection",
    consensus_alpha: Annotated[float, typer.Option(min=0.0, max=1.0, callback=finite_number,
                                                   help="False discovery rate of --consensus stouffer.")] = 0.05,
    pooled_comparison: Annotated[bool, typer.Option(
        "--pooled-comparison", help="Simulation (all files on this machine): also run the selector on all sites' "
                                    "training rows stacked and report the Jaccard agreement per freedom degree.")] = False,
) -> None:
    """Feature Election on real tables: one file per site, each site votes with its own selector."""
    from ..data.tables import TableError, read_table
    from ..election.evidence import check_consensus, check_consensus_alpha
    from ..election.rule import check_aggregation, check_normalization, check_profile
    from ..election.selectors import make_selector
    from ..engines.local import LocalFederation
    from ..federation import FederationError, Site, run_election, run_training
    from ..federation.encoding_flow import federated_one_hot
    from ..federation.protocol import set_options
    from ..learn.models import make_model
    from ..report.output import OutputError, atomic_dir, check_writable

    try:
        check_writable(out)
        check_aggregation(aggregation)
        check_normalization(normalization)
        check_profile(compat, normalization)
        check_consensus(consensus)
        check_consensus_alpha(consensus_alpha)
        make_model(model)
        if tune not in ("none", "grid", "hill-climb"):
            fail(f"--tune must be 'none', 'grid' or 'hill-climb', got {tune!r}")
        if secure_aggregation and tune != "none":
            fail("--secure-aggregation cannot be combined with --tune (tuning scores each site's validation F1)")
        sel_names = selector or ["lasso"]
        if len(sel_names) not in (1, len(tables)):
            fail(f"give one --selector for all sites or one per site ({len(tables)}), got {len(sel_names)}")
        if len(sel_names) == 1:
            sel_names = sel_names * len(tables)
        if pooled_comparison and len(set(sel_names)) > 1:
            fail("--pooled-comparison needs one --selector shared by every site")
        for s in sel_names:
            make_selector(s)
        if min_sites is not None and min_sites > len(tables):
            fail(f"--min-sites {min_sites} is more than the {len(tables)} site file(s)")
        frames = [read_table(p, na_values=na_value) for p in tables]
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
        sites = [Site(n, f, target, test_size=test_size, seed=seed, selector=s, policy={"min_rows": min_rows})
                 for n, f, s in zip(names, frames, sel_names)]
        fed = LocalFederation(sites, min_sites=min_sites, timeout=timeout)
        set_options(fed, secure_aggregation=secure_aggregation, robust=robust, max_site_share=max_site_share,
                    min_holders=min_holders)
        categorical = sorted({str(c) for f in frames for c in f.columns
                              if c != target and not (pd.api.types.is_numeric_dtype(f[c]) or pd.api.types.is_bool_dtype(f[c]))})
        if categorical:
            with console.status(f"agreeing categories of {len(categorical)} columns (sites send category sets, no rows)"):
                federated_one_hot(fed, categorical)
        if tune != "none":
            from ..federation.tuning_flow import tune_flow

            with console.status(f"tuning the freedom degree ({tune}) on validation rows"):
                tuned = tune_flow(fed, model=model, tune_method=tune, rounds=rounds, local_epochs=local_epochs,
                                  tolerance=tolerance, aggregation=aggregation,
                                  normalization=normalization, compat=compat, seed=seed, apply=False)
            freedom_degree = float(tuned.tuning.freedom_degree)
        with console.status("sites are voting"):
            outcome = run_election(fed, freedom_degree, aggregation=aggregation, normalization=normalization,
                                   compat=compat, consensus=consensus, consensus_alpha=consensus_alpha)
        result = outcome.result
        doc = {"sites": [dict(s, selector=sel, file=str(p)) for s, sel, p in zip(outcome.site_summary(), sel_names, tables)],
               "categorical_columns": categorical, **result.to_dict(), "min_holders": result.min_holders}
        doc["election"] = {**result.to_dict(), "features": result.explain_records()}
        if pooled_comparison:
            from ..election.agreement import DEFAULT_FREEDOM_DEGREES, pooled_agreement, pooled_mask

            with console.status("running the selector on the pooled training rows (simulation)"):
                names_in = list(result.feature_names)
                ref = pooled_mask([s.rows("train") for s in sites], target, sel_names[0], names_in)
                doc["election"]["pooled_agreement"] = pooled_agreement(
                    outcome.ballots, ref, feature_names=names_in,
                    freedom_degrees=sorted({*DEFAULT_FREEDOM_DEGREES, float(freedom_degree)}), aggregation=aggregation,
                    normalization=normalization, compat=compat, consensus=consensus, consensus_alpha=consensus_alpha,
                    min_holders=result.min_holders)
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
                "robust": robust,
                "left_out": {**full.left_out, **(trained.left_out if trained is not None else {})},
                "rounds": rounds,
                **({} if trained is None else {"features": trained.features, "classes": trained.classes,
                                                "metrics": trained.metrics}),
                "all_features": {"f1": full.pooled["weighted_f1"], "n_params": full.n_params},
                "elected": None if trained is None else {"f1": trained.pooled["weighted_f1"], "n_params": trained.n_params,
                                                          "per_site_f1": {k: v["weighted_f1"] for k, v in trained.per_site.items()}},
            }
        doc["participation"] = fed.participation
        doc["dropped"] = fed.dropped
    except (TableError, FederationError, ValueError, OutputError) as exc:
        fail(str(exc))
        return

    rule = f"compat={compat}" if compat else f"normalization={normalization}"
    tab = Table(title=f"Feature Election (fd={freedom_degree:g}, {aggregation}, {rule})")
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
    try:
        with atomic_dir(out) as tmp:
            (tmp / "result.json").write_text(json.dumps(doc, indent=2))
            (tmp / "elected_columns.txt").write_text("\n".join(result.selected_names)
                                                     + ("\n" if result.selected_names else ""))
            from ..report import write_report

            held = {site.name: site.feature_names for site in sites}
            write_report({**doc, "sites": {s["name"]: {"n_train": s["n_samples"], "columns": held.get(s["name"], [])}
                                           for s in doc["sites"]}}, tmp / "report.html")
    except OSError as exc:
        fail(f"cannot write to {out}: {exc}")
    for name, why in doc["dropped"].items():
        console.print(f"[yellow]site {name!r} was left out: {why}[/]", highlight=False)
    console.print(f"wrote {out / 'result.json'}, {out / 'report.html'} and {out / 'elected_columns.txt'}")
