"""``fedtab predict MODEL TABLE``: score a table with a model file; rows and order kept."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import console, fail

__all__ = ["predict_command"]


def predict_command(
    model: Annotated[Path, typer.Argument(help="A model file written by fedtab run (model.fedtab).")],
    table: Annotated[Path, typer.Argument(help="CSV or Parquet table with the schema's columns (some may be absent "
                                          "when the model has an imputer).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the predictions here (CSV; default: "
                                                "standard output).")] = None,
    na_value: Annotated[Optional[list[str]], typer.Option(help="Extra strings read as missing (repeatable; the "
                                                          "job's na_values are always used).")] = None,
    site: Annotated[Optional[str], typer.Option(help="Use this site's personalised model (a tune = \"cv\" job's "
                                                "model file); default: the pooled model.")] = None,
) -> None:
    """Add 'prediction' and 'probability_<class>' columns to every row of TABLE."""
    from ..data.tables import TableError, read_table
    from ..job.model_file import ModelFileError, PredictionError, load_model

    try:
        m = load_model(model)
        job = m.provenance.get("job") or {}
        na = list(dict.fromkeys([*(job.get("na_values") or []), *(na_value or [])]))
        frame = read_table(table, na)
        proba = m.predict_proba(frame, site)
        labels = m.predict(frame, site)
    except (ModelFileError, PredictionError, TableError) as exc:
        fail(str(exc))
        return
    preds = frame.copy()
    preds["prediction"] = labels
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
