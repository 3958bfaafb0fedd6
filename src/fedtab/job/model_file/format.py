"""The model file's format: its names and limits, its errors, and how a boosted-trees model maps to
arrays (shared by :mod:`.write`, :mod:`.read` and :mod:`.model`)."""

from __future__ import annotations

import zipfile
import zlib
from typing import Any, Mapping

import numpy as np

FORMAT = "fedtab-model"
VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST = 16 * 2**20
MAX_ARRAY = 256 * 2**20
#: all arrays of a model file together, uncompressed
MAX_TOTAL = 2**30
#: most arrays a manifest may declare, and most dimensions of one
MAX_ARRAYS = 4096
MAX_NDIM = 8
#: deepest nesting of lists/objects in manifest.json (a written one needs 5)
MAX_DEPTH = 32
#: a model spec may need at most this many times the numbers the file's model arrays hold (plus
#: :data:`SPEC_SLACK`): an estimate, not an exact count, but ``hidden = [10**9]`` is far beyond it
SPEC_FACTOR = 4
SPEC_SLACK = 2**20
#: dtype kinds an array may have: bool, int, unsigned, float
KINDS = "biuf"
#: what reading a damaged zip member can raise (zipfile, zlib and the OS all report it differently)
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError, ValueError)
#: arrays every model file holds, and those a model with an imputer adds
STANDARDISE = ("standardise/mean", "standardise/std")
IMPUTER_ARRAYS = tuple(f"imputer/{k}" for k in ("mean", "std", "edge_index", "weight", "sign", "low", "high", "integer"))


class ModelFileError(ValueError):
    """A model file cannot be used (the message names the file and the problem)."""


class PredictionError(ValueError):
    """A table cannot be scored: missing columns, or a value that cannot be used (row and column named)."""


class PredictionWarning(UserWarning):
    """A table was scored, but not as given: columns ignored, cells filled, categories outside the model's lists."""


def strings(value: Any) -> bool:
    """Whether ``value`` is a list of strings."""
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def number(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def gbdt_dtype(name: str) -> Any:
    """The dtype of a boosted-trees array (its trees as int/bool/float arrays, no pickle)."""
    from ...learn.gbdt.model import NODE_ARRAYS

    return NODE_ARRAYS.get(name, {"tree_ptr": np.int64, "edge_ptr": np.int64}.get(name, np.float32))


def gbdt_model(m: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """The :class:`~fedtab.learn.gbdt.GBDTModel` of a ``gbdt`` model file (raises ``ValueError``)."""
    from ...learn.gbdt import GBDTModel
    from ...learn.gbdt.model import FORMAT as GBDT_FORMAT, VERSION as GBDT_VERSION
    from ...learn.models import make_model

    params = make_model(m["model"]).gbdt_params(len(m["classes"])).to_dict()
    manifest = {"format": GBDT_FORMAT, "version": GBDT_VERSION, "params": params,
                "feature_names": list(m["features"]), "best_iteration": None}
    return GBDTModel.from_arrays(manifest, {k[len("model/"):]: a for k, a in arrays.items() if k.startswith("model/")})
