"""Writing a model file: :func:`write_model` from the job workflow's ``"model"`` section plus
provenance. The model's predictions on probe rows are checked before anything is written
(:meth:`~fedtab.job.model_file.FedtabModel.check_predictions`)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .format import FORMAT, MANIFEST, VERSION, ModelFileError, gbdt_dtype
from .model import FedtabModel

__all__ = ["write_model"]


def _collect_arrays(model: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split the workflow's model section into named arrays and the JSON rest."""
    arrays = {"standardise/mean": np.asarray(model["mean"], np.float64),
              "standardise/std": np.asarray(model["std"], np.float64)}
    gbdt = model["model"]["name"] == "gbdt"
    for k, v in model["params"].items():
        dtype = gbdt_dtype(k) if gbdt else np.float32 if model["model"]["name"] == "mlp" else np.float64
        arrays[f"model/{k}"] = np.asarray(v, dtype)
    imputer = None
    if model.get("imputer"):
        im = model["imputer"]
        arrays.update({
            "imputer/mean": np.asarray(im["mean"], np.float64), "imputer/std": np.asarray(im["std"], np.float64),
            "imputer/edge_index": np.asarray(im["edge_index"], np.int64).reshape(2, -1),
            "imputer/weight": np.asarray(im["weight"], np.float64), "imputer/sign": np.asarray(im["sign"], np.float64),
            "imputer/low": np.asarray(im["low"], np.float64), "imputer/high": np.asarray(im["high"], np.float64),
            "imputer/integer": np.asarray(im["integer"], bool),
        })
        if im.get("prior_W") is not None:
            arrays["imputer/prior_W"] = np.asarray(im["prior_W"], np.float64)
            arrays["imputer/prior_psi"] = np.asarray(im["prior_psi"], np.float64)
        for k, v in im["weights"].items():
            arrays[f"imputer/w/{k}"] = np.asarray(v, im["weight_dtypes"].get(k, "float32"))
        cols = list(im["columns"])
        imputer = {"columns": cols, "model_config": dict(im["model_config"]),
                   "weights": sorted(im["weights"]), "prior": im.get("prior_W") is not None,
                   # by name: the agreed value set of each integer-coded column, the indicators of each category
                   "levels": {cols[int(j)]: [float(x) for x in v] for j, v in (im.get("levels") or {}).items()},
                   "groups": [[cols[int(j)] for j in g] for g in im.get("groups") or ()]}
    rest = {"schema": model["schema"], "encoded_columns": list(model["encoded_columns"]),
            "features": list(model["features"]), "classes": list(model["classes"]), "model": model["model"],
            "imputer": imputer}
    pers = model.get("personalisation")
    if pers:
        sites = dict(pers["sites"])
        for i, params in enumerate(sites.values()):
            arrays.update({f"personal/{i}/{k}": np.asarray(v, np.float64) for k, v in params.items()})
        rest["personalisation"] = {"mode": str(pers["mode"]), "sites": [str(s) for s in sites]}
    return arrays, rest


def write_model(path: str | Path, model: Mapping[str, Any], provenance: Mapping[str, Any]) -> Path:
    """Write ``model`` (the job workflow's ``"model"`` section) and ``provenance`` to ``path``.

    Returns the path.

    Raises:
        ModelFileError: the model yields non-finite probabilities
            (:meth:`FedtabModel.check_predictions`; one line, nothing written).
        OSError: the file cannot be written.
    """
    arrays, rest = _collect_arrays(model)
    manifest = {"format": FORMAT, "version": VERSION, "provenance": dict(provenance), **rest,
                "arrays": {k: {"shape": list(a.shape), "dtype": a.dtype.str} for k, a in arrays.items()}}
    path = Path(path)
    try:
        FedtabModel(manifest, arrays, str(path)).check_predictions()
    except ValueError as exc:
        raise ModelFileError(f"{path}: not written: {' '.join(str(exc).split())}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, json.dumps(manifest, indent=1))
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, a, allow_pickle=False)
            zf.writestr(f"arrays/{name}.npy", buf.getvalue())
    return path

