"""``fedtab impute a.csv b.parquet ... --out DIR``: federated imputation of site CSV files.

Each CSV is one site (file stem = site name). Columns are matched by name; a column
missing from a file is structurally unavailable at that site. A thin command: its options
are a :class:`~fedtab.estimators.FederatedImputer`'s, whose ``fit`` builds the
:class:`~fedtab.job.spec.JobSpec` of the imputation and runs the job's step loop. Writes to ``DIR``:

* ``<site>.imputed.csv`` — the site's rows over the global schema, every gap filled (integer
  codes such as ``thal`` in {3, 6, 7} take a value of their agreed set), then the ``--target``
  and ``--ignore`` columns as given (never imputed, never an input of the imputer); every cell
  the site gave is written back exactly as read (a column of whole numbers whose filled
  values are whole too is written as integers);
* ``<site>.imputed_mask.csv`` — the same columns of the global schema, 1 where the cell was
  imputed (missing, or a column the site lacks), 0 where it is the site's own value;
* ``result.json`` + ``report.html`` — the sites, their columns and the imputation quality per
  column against mean fill, in the job's vocabulary (``docs/job.md``);
* ``report.json`` — settings, schema, validation RMSE (z-space) per site and per column,
  the training curve, the feature graph (edges with correlations), the linear prior's
  rank and per-column noise variance, traffic bytes, and the job's ``privacy``, ``trust``
  and ``participation``;
* ``training_curve.png`` and ``feature_graph.png``.

Bad input exits with code 2 and a one-line error, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from . import err_console, fail, finite_number
from .elect import max_site_share_option, option_text

if TYPE_CHECKING:  # pragma: no cover - numpy and pandas load inside the command (fast `fedtab --help`)
    import pandas as pd

    from ..estimators import FederatedImputer

__all__ = ["impute_command", "read_site_csv", "ImputeInputError"]


class ImputeInputError(ValueError):
    """A CSV given to ``fedtab impute`` cannot be used (message says why)."""


def read_site_csv(path: Path, sep: Optional[str] = None, na_values: Optional[list[str]] = None,
                  decimal: Optional[str] = None) -> pd.DataFrame:
    """Read one site's CSV (or Parquet: ``.parquet``/``.pq``); raise :class:`ImputeInputError`
    if unreadable, empty, mixing numbers and text in a column or holding an infinite or huge
    number. ``sep``/``decimal``: ``None`` = sniffed (:func:`fedtab.data.tables.sniff_csv`)."""
    import pandas as pd

    from ..data.tables import TableError, check_column_types, check_finite, csv_header, duplicate_names, sniff_csv

    if not path.is_file():
        raise ImputeInputError(f"{path}: file not found")
    if path.name.lower().endswith((".parquet", ".pq")):
        from ..data.tables import TableError, read_table

        try:
            return read_table(path, na_values)
        except TableError as exc:
            raise ImputeInputError(str(exc)) from None
    try:
        if sep is None or decimal is None:
            from ..data.tables import csv_sample

            sep, sniffed = sniff_csv(csv_sample(path), ",", sep)
            decimal = decimal or sniffed
        dups = duplicate_names(csv_header(path, sep))
        if dups:
            raise ImputeInputError(f"{path}: duplicate column names {dups[:5]}")
        df = pd.read_csv(path, sep=sep, decimal=decimal, na_values=na_values)
    except pd.errors.EmptyDataError:
        raise ImputeInputError(f"{path}: the file is empty") from None
    except ImputeInputError:
        raise
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise ImputeInputError(f"{path}: cannot be read as CSV ({str(exc).splitlines()[0]})") from None
    if df.shape[0] == 0:
        raise ImputeInputError(f"{path}: the table has no rows")
    try:
        check_column_types(df, str(path))
        check_finite(df, str(path))
    except TableError as exc:
        raise ImputeInputError(str(exc)) from None
    return df


def _kept_columns(tables: dict[str, pd.DataFrame], target: Optional[str], ignore: list[str],
                  categorical: list[str]) -> list[str]:
    """``--target`` and ``--ignore`` columns (kept out of the imputation), each held by some site.

    Raises:
        ImputeInputError: a named column no site holds, or one named twice over.
    """
    import difflib

    held = {c for t in tables.values() for c in t.columns}
    named = ([target] if target else []) + list(ignore) + list(categorical)
    for c in named:
        if c not in held:
            close = difflib.get_close_matches(c, sorted(held), n=1, cutoff=0.6)
            raise ImputeInputError(f"column {c!r} is in none of the site files {', '.join(tables)}"
                                   + (f" (did you mean {close[0]!r}?)" if close else ""))
    if len(set(named)) != len(named):
        raise ImputeInputError(f"a column is given twice among --target/--ignore/--categorical: {named}")
    return ([target] if target else []) + list(ignore)


def _plots(out: Path, history: list[dict], graph, pooled) -> None:
    import numpy as np

    from ..report.plots import plt, save_figure

    fig, ax = plt.subplots(figsize=(5, 3.5))
    r = [h["round"] for h in history]
    ax.plot(r, [np.nan if h["train_loss"] is None else h["train_loss"] for h in history], label="train loss (MSE)")
    ax.plot(r, [np.nan if h["val_rmse"] is None else h["val_rmse"] for h in history], label="validation RMSE")
    ax.set_xlabel("round")
    ax.set_ylabel("z-space")
    ax.legend()
    save_figure(fig, out / "training_curve.png")

    f = graph.n_nodes
    fig, ax = plt.subplots(figsize=(6, 6))
    ang = 2 * np.pi * np.arange(f) / max(f, 1)
    xy = np.c_[np.cos(ang), np.sin(ang)]
    for (s, t), w, sg in zip(graph.edge_index.T, graph.weight, graph.sign):
        if s < t:
            ax.plot(*xy[[s, t]].T, color="tab:blue" if sg > 0 else "tab:red", alpha=0.2 + 0.6 * w, lw=0.5 + 2 * w)
    ax.scatter(*xy.T, s=20, color="k", zorder=3)
    if f <= 60:
        for i, name in enumerate(graph.columns):
            ax.annotate(name, xy[i] * 1.08, ha="center", va="center", fontsize=7)
    ax.set_title(f"feature graph: {f} nodes, {graph.n_edges // 2} edges (blue +, red −); "
                 f"{pooled.unobserved_pairs()} pairs never co-observed", fontsize=8)
    ax.set_axis_off()
    ax.set_aspect("equal")
    save_figure(fig, out / "feature_graph.png")


@dataclass(frozen=True)
class CsvFormat:
    """How ``fedtab impute`` reads the site CSVs (:func:`read_site_csv`): field ``sep`` and
    ``decimal`` mark (``None``: sniffed) and the extra strings read as missing (``na_values``)."""

    sep: Optional[str] = None
    decimal: Optional[str] = None
    na_values: Optional[list[str]] = None


@dataclass(frozen=True)
class KeptColumns:
    """The columns named on the command line: the label ``target`` and the ``ignore`` columns are
    kept out of the imputation (copied as given); ``categorical`` ones are imputed to a code."""

    target: Optional[str] = None
    ignore: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)


def _read_sites(files: list[Path], fmt: CsvFormat, min_sites: Optional[int], named: KeptColumns
                ) -> tuple[dict[str, pd.DataFrame], list[str], dict[str, pd.DataFrame]]:
    """``(raw, kept, tables)``: each file's table by site name (the file's name up to its first
    dot), the columns kept out of the imputation (:func:`_kept_columns`), and the tables without
    them (what the imputer sees).

    Raises:
        typer.Exit: no file, two files of one site name, or a quorum above the number of files
            (:func:`~fedtab.cli.fail`, a one-line error).
        ImputeInputError: an unreadable file, or a named column no site holds.
    """
    if not files:
        fail("give at least one CSV file")
    names = [p.name.split(".")[0] for p in files]
    if len(set(names)) != len(names):
        fail(f"site names (file stems) must be unique, got {names}")
    if min_sites is not None and min_sites > len(files):
        fail(f"--min-sites {min_sites} is more than the {len(files)} site file(s)")
    raw = {n: read_site_csv(p, sep=fmt.sep, na_values=fmt.na_values, decimal=fmt.decimal)
           for n, p in zip(names, files)}
    kept = _kept_columns(raw, named.target, named.ignore, named.categorical)
    tables = {n: t.drop(columns=[c for c in kept if c in t.columns]) for n, t in raw.items()}
    return raw, kept, tables


def _fit_with_progress(imp: FederatedImputer, tables: dict[str, pd.DataFrame], rounds: int, quiet: bool) -> None:
    """``imp.fit(tables)`` under a progress bar of its ``rounds`` FedAvg rounds on stderr (none
    when ``quiet``), showing the latest validation RMSE."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]FedAvg"), BarColumn(), TextColumn("{task.completed}/{task.total} rounds"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                  disable=quiet) as bar:
        task = bar.add_task("train", total=rounds, info="")

        def progress(r: int, total: int, info: dict) -> None:
            v = info.get("val_rmse")
            bar.update(task, completed=r, info=f"val RMSE {v:.3f}" if v is not None else "")

        imp.fit(tables, progress=progress)


def _write_site_files(tmp: Path, name: str, imp: FederatedImputer, table: pd.DataFrame, kept: pd.DataFrame) -> None:
    """``<name>.imputed.csv`` (``table`` filled by the fitted ``imp``, then the ``kept`` columns as
    the site gave them) and ``<name>.imputed_mask.csv`` (1 = imputed) in ``tmp``.

    A column whose given and filled values are all whole numbers (below 2**53) is written as
    integers ("50", not "50.0"); observed cells are the table's, bit for bit.
    """
    import numpy as np

    filled = imp.transform(table)  # observed cells copied from the table bit for bit
    for c in table.columns:  # integer input stays integer text ("50", not "50.0") when
        given = table[c].dropna().to_numpy(dtype=np.float64)  # every filled value is whole
        values = filled[c].to_numpy(dtype=np.float64)
        if given.size and np.all(given == np.round(given)) and np.all(values == np.round(values)) \
                and np.all(np.abs(values) < 2.0 ** 53):
            filled[c] = values.astype(np.int64)
    for c in kept.columns:  # the label and ignored columns, as the site gave them
        filled[c] = kept[c].to_numpy()
    filled.to_csv(tmp / f"{name}.imputed.csv", index=False)
    imp.imputed_mask(table).astype(int).to_csv(tmp / f"{name}.imputed_mask.csv", index=False)


def _imputation_report(imp: FederatedImputer, tables: dict[str, pd.DataFrame]) -> dict:
    """``report.json``'s content (module docstring) from the fitted ``imp`` and the sites' tables
    (without their kept columns)."""
    res = imp.result_
    g = res.graph
    corr = res.pooled.corr
    return {
        "sites": {s: {"rows": int(len(tables[s])), "training_rows": res.site_rows[s], "columns": res.site_columns[s],
                      "unavailable_columns": [c for c in res.columns if c not in res.site_columns[s]]}
                  for s in tables},
        "columns": res.columns,
        "settings": imp.get_params(),
        "validation_rmse_z": res.validation,
        "training_curve": res.history,
        "best_round": res.best_round,
        "left_out": res.left_out,
        "feature_graph": {
            "nodes": g.columns, "unobserved_pairs": res.unobserved_pairs,
            "edges": [{"source": g.columns[s], "target": g.columns[t], "r": float(corr[s, t])}
                      for s, t in g.edge_index.T if s < t],
        },
        "linear_prior": None if res.prior_W is None else {
            "rank": int(res.prior_W.shape[1]),
            "noise_variance": dict(zip(res.columns, map(float, res.prior_psi))),
        },
        "seconds": res.seconds,
        "bytes": {"down": res.bytes[0], "up": res.bytes[1]},
        **{k: imp.job_result_[k] for k in ("privacy", "trust", "participation")},
    }


def _write_job_outputs(tmp: Path, report: dict, res, rounds: int) -> None:
    """``result.json`` + ``report.html`` in the job's vocabulary (:func:`fedtab.job.run.write_outputs`)
    from ``report`` (:func:`_imputation_report`) and the imputation result ``res``."""
    from ..job.run import write_outputs

    write_outputs({**report, "sites": {s: {"n_rows": v["rows"], "n_train": v["training_rows"],
                                           "columns": v["columns"], "unavailable_columns": v["unavailable_columns"]}
                                       for s, v in report["sites"].items()},
                   "imputation": {"columns": res.columns, "validation": res.validation,
                                  "best_round": res.best_round, "rounds": rounds,
                                  "training_curve": res.history}}, tmp, command="impute")


def impute_command(
    files: Annotated[list[Path], typer.Argument(help="One CSV or Parquet file per site (numeric columns; empty cell "
                                                "= missing).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (created if needed).")] = Path("fedtab-impute"),
    rounds: Annotated[int, typer.Option(help="FedAvg rounds.")] = 3,
    local_epochs: Annotated[int, typer.Option(help="Local epochs per round.")] = 8,
    k_neighbors: Annotated[int, typer.Option(help="Neighbours per feature in the graph.")] = 10,
    min_abs_corr: Annotated[float, typer.Option(help="Minimum |r| for a graph edge.")] = 0.05,
    hidden_dim: Annotated[int, typer.Option(help="GNN hidden size.")] = 32,
    n_layers: Annotated[int, typer.Option(help="Message-passing layers.")] = 3,
    lr: Annotated[float, typer.Option(help="Learning rate (AdamW).")] = 6e-3,
    mask_fraction: Annotated[float, typer.Option(help="Mean share of observed cells hidden per training row.")] = 0.4,
    prior: Annotated[bool, typer.Option("--prior/--no-prior",
                                        help="GNN corrects a linear factor model fitted from the pooled "
                                             "correlations (--no-prior: plain GNN).")] = True,
    prior_rank: Annotated[Optional[int], typer.Option(min=0, help="Factors of the linear prior (default: "
                                                                  "from the correlation spectrum, at most 20).")] = None,
    validation_fraction: Annotated[float, typer.Option(help="Share of each site's rows held out for validation.")] = 0.1,
    sep: Annotated[Optional[str], typer.Option(help="CSV field separator (default: sniffed).")] = None,
    decimal: Annotated[Optional[str], typer.Option(help="CSV decimal mark (default: sniffed).")] = None,
    target: Annotated[Optional[str], typer.Option(
        "--target", "-t", help="Label column: kept out of the imputation, copied as is.")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option(
        "--ignore", help="Column kept out of the imputation, copied as is (repeatable).")] = None,
    categorical: Annotated[Optional[list[str]], typer.Option(
        "--categorical", help="Integer-coded column imputed to one of its codes (repeatable).")] = None,
    na_value: Annotated[Optional[list[str]], typer.Option(help="Extra strings read as missing (repeatable).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    robust: Annotated[bool, typer.Option("--robust", help="Robust reducers: screened and capped statistics, "
                                         "coordinate-wise median FedAvg (docs/trust.md).")] = False,
    max_site_share: Annotated[float, typer.Option(callback=max_site_share_option,
                                                  help="With --robust: most of the pooled statistics one site may carry.")] = 0.5,
    min_sites: Annotated[Optional[int], typer.Option(min=1, help="Quorum: a site that fails, times out or sends a "
                                                     "rejected reply is dropped (named) while this many remain "
                                                     "(default: every site must answer).")] = None,
    timeout: Annotated[Optional[float], typer.Option(min=0.001, callback=finite_number,
                                                     help="Seconds each site may take per exchange (default: no limit).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Sites send only masked sums (statistics, weights, errors); the server "
                                     "learns no single site's.")] = False,
) -> None:
    """Impute missing cells and unavailable columns across site CSVs, federatedly."""
    from ..report.output import OutputError  # here: the report package imports matplotlib

    try:
        from ..federation.protocol import FederationError
        from ..estimators import FederatedImputer
        from ..report.output import atomic_dir, check_writable

        check_writable(out)
        raw, kept, tables = _read_sites(files, CsvFormat(sep, decimal, na_value), min_sites,
                                        KeptColumns(target, ignore or [], categorical or []))
        imp = FederatedImputer(rounds=rounds, local_epochs=local_epochs, k_neighbors=k_neighbors,
                               min_abs_corr=min_abs_corr, hidden_dim=hidden_dim, n_layers=n_layers, lr=lr,
                               mask_fraction=mask_fraction, validation_fraction=validation_fraction,
                               use_prior=prior, prior_rank=prior_rank, seed=seed, robust=robust,
                               max_site_share=max_site_share, secure_aggregation=secure_aggregation,
                               min_sites=min_sites, timeout=timeout, categorical=categorical or None)
        _fit_with_progress(imp, tables, rounds, quiet)
        with atomic_dir(out) as tmp:  # all files appear at once, or none (previous results kept)
            for name, table in tables.items():
                _write_site_files(tmp, name, imp, table, raw[name][[c for c in kept if c in raw[name].columns]])
            report = _imputation_report(imp, tables)
            (tmp / "report.json").write_text(json.dumps(report, indent=1))
            _write_job_outputs(tmp, report, imp.result_, rounds)
            _plots(tmp, imp.result_.history, imp.result_.graph, imp.result_.pooled)
    except typer.Exit:
        raise
    except (ImputeInputError, ValueError, FederationError) as exc:
        fail(option_text(str(exc)))
    except OutputError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write to {out}: {exc}")
    res = imp.result_
    v = res.validation.get("overall")
    err_console.print(f"imputed {len(tables)} site(s) over {len(res.columns)} columns in {res.seconds:.1f}s"
                      + (f"; validation RMSE (z) {v:.3f}" if v is not None else "") + f" -> {out}", highlight=False)
