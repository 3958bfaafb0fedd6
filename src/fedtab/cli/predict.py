"""``fedtab predict MODEL TABLE``: score a table with a model file; rows and order kept.

The table is checked against the model first (:meth:`fedtab.job.model_file.FedtabModel.check`):
columns the model reads that the table lacks end the command (exit 2, listed, with a
did-you-mean for the table's unknown columns) unless ``--allow-missing``; everything else the
model does not take as given -- unknown columns, filled cells per column, categories rare in
training or new (encoded as the model's ``(other)`` level) -- is a warning on stderr. Only what
the model needs is imported: never torch (a model file's imputer runs in numpy).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import console, err_console, fail

__all__ = ["predict_command"]


def _warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", markup=True, highlight=False, soft_wrap=True)


def predict_command(
    model: Annotated[Path, typer.Argument(help="A model file written by fedtab run (model.fedtab).")],
    table: Annotated[Path, typer.Argument(help="CSV or Parquet table with the model's columns (by name).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the predictions here (CSV; default: "
                                                "standard output).")] = None,
    na_value: Annotated[Optional[list[str]], typer.Option(help="Extra strings read as missing (repeatable; the "
                                                          "job's na_values are always used).")] = None,
    allow_missing: Annotated[bool, typer.Option("--allow-missing", help="Score a table that lacks columns the "
                                                "model reads: the model's imputer (or the federation's mean) "
                                                "fills them, with a warning per column.")] = False,
    site: Annotated[Optional[str], typer.Option(help="Use this site's personalised model (a tune = \"cv\" job's "
                                                "model file); default: the pooled model.")] = None,
) -> None:
    """Add 'prediction' and 'probability_<class>' columns to every row of TABLE."""
    from ..data.tables import TableError, read_table
    from ..job.model_file import ModelFileError, PredictionError, PredictionWarning, load_model

    try:
        m = load_model(model)
        job = m.provenance.get("job") or {}
        na = list(dict.fromkeys([*(job.get("na_values") or []), *(na_value or [])]))
        frame = read_table(table, na)
        found = m.check(frame)
        if found.missing and not allow_missing:
            fail(found.missing_message("--allow-missing"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PredictionWarning)
            proba = m.predict(frame, site, allow_missing=True) if m.regression \
                else m.predict_proba(frame, site, allow_missing=True)
    except (ModelFileError, PredictionError, TableError) as exc:
        fail(str(exc))
        return
    for w in caught:
        if issubclass(w.category, PredictionWarning):
            _warn(str(w.message))
    preds = frame.copy()
    if m.regression:  # numbers: the prediction, and RMSE / MAE / R² when the table holds the target
        preds["prediction"] = proba
        _regression_line(m, frame, proba)
    else:
        preds["prediction"] = m.labels(proba)
    for j, c in enumerate(m.classes):
        preds[f"probability_{c}"] = proba[:, j]
    if out is None:
        preds.to_csv(sys.stdout, index=False)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        preds.to_csv(out, index=False)
    except OSError as exc:
        fail(f"cannot write {out}: {exc}")
    console.print(f"wrote {len(preds)} predictions to {out}", highlight=False)


def _regression_line(m, frame, predicted) -> None:  # noqa: ANN001 - FedtabModel, DataFrame, ndarray
    """Print RMSE, MAE and R² of a regression model's predictions against the table's target
    column (named in the model's schema), over the rows whose target is a number."""
    import numpy as np
    import pandas as pd

    from ..learn.metrics import regression_scores, regression_sums

    target = (m.manifest.get("schema") or {}).get("target")
    if not target or target not in frame.columns:
        return
    y = pd.to_numeric(frame[target], errors="coerce").to_numpy(dtype=np.float64)
    keep = np.isfinite(y) & np.isfinite(predicted)
    s = regression_sums(y[keep], np.asarray(predicted)[keep])
    sc = regression_scores(s["sse"], s["sae"], s["sum_y"], s["sum_y2"], float(keep.sum()))
    if sc["rmse"] is None:
        return
    r2 = "n/a" if sc["r2"] is None else f"{sc['r2']:.4f}"
    console.print(f"{target}: RMSE {sc['rmse']:.4g}, MAE {sc['mae']:.4g}, R² {r2} on {sc['n']} rows", highlight=False)
