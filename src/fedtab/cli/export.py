"""``fedtab export MODEL --format xgboost OUT.json``: a model file's trees in XGBoost's JSON format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import console, fail

__all__ = ["export_command", "FORMATS"]

#: export formats
FORMATS = ("xgboost",)


def export_command(
    model: Annotated[Path, typer.Argument(help="A model file written by fedtab run (model.fedtab) of a gbdt model.")],
    out: Annotated[Path, typer.Argument(help="Where to write the exported model (XGBoost: a .json file).")],
    format: Annotated[str, typer.Option("--format", "-f", help="Export format: xgboost (the JSON file "
                                        "xgboost.Booster.load_model reads).")] = "xgboost",
) -> None:
    """Write MODEL's boosted trees as OUT (xgboost: Booster.load_model(OUT) predicts as fedtab predict).

    The JSON is written by fedtab itself (xgboost is not needed to export); its feature names
    are the model's input columns after one-hot encoding, in order.
    """
    from ..job.model_file import ModelFileError, load_model
    from ..learn.gbdt import write_xgboost_json

    if format not in FORMATS:
        fail(f"unknown export format {format!r}; known: {', '.join(FORMATS)}")
    try:
        m = load_model(model)
    except ModelFileError as exc:
        fail(str(exc))
        return
    if m.trees is None:
        fail(f"{model}: model {m.manifest['model'].get('name')!r} is not boosted trees; --format xgboost needs a "
             "gbdt model")
    try:
        path = write_xgboost_json(m.trees, out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc}")
        return
    console.print(f"wrote {m.trees.n_trees} trees to {path} (XGBoost JSON)", highlight=False)
