"""The model file ``model.fedtab``: a zip of ``manifest.json`` and ``arrays/<name>.npy``. No pickle.

Writing: :func:`write_model` from the job workflow's ``"model"`` section plus provenance.
Reading: :func:`load_model` validates everything before any of it is used, because a model
file may come from someone else:

* the zip holds exactly ``manifest.json`` and the arrays the manifest lists (any other
  member, a path with ``..`` or ``/`` at its start, a duplicate name is rejected); a
  member that cannot be decompressed (bad CRC, broken deflate stream, encryption) is a
  corrupted member;
* sizes are checked from the zip directory *before* reading (manifest ≤ 16 MiB and nested
  at most :data:`MAX_DEPTH` levels, at most :data:`MAX_ARRAYS` arrays of at most
  :data:`MAX_NDIM` dimensions, each array ≤ 256 MiB uncompressed and no more elements than
  its declared shape, all of them ≤ :data:`MAX_TOTAL`);
* the manifest's structure is checked (schema, categories, features, classes, provenance);
* what the model spec (and the imputer's network) would allocate is estimated before it is
  built (:func:`fedtab.learn.models.model_cost`): a spec that needs far more numbers than
  the file's arrays hold (``mlp`` with ``hidden = [10**9]``) is refused unbuilt;
* arrays are read with ``numpy.load(allow_pickle=False)``; only bool/int/float dtypes;
  each array must have the shape and dtype the manifest declares, and those shapes must
  agree with the features, classes and the model (``make_model(spec).init`` shapes) and the
  imputer's network;
* a selection's per-site personalised models (``[election] tune = "cv"``): a known mode
  (:func:`fedtab.learn.personalise.check_mode`), unique site names, and for every site exactly
  the arrays ``personal/<i>/<name>`` its mode needs (``shift`` ``(k,)``; ``scale`` ``(1,)``;
  ``coef`` / ``intercept`` of the model's shapes), float, finite; none without a personalisation;
* the imputer's finishing (``imputer.levels``: the agreed value set of each integer-coded
  column; ``imputer.groups``: the indicator columns of each categorical column) names only
  imputer columns, with non-empty sets of finite numbers and disjoint groups of two or more;
* the model's predictions on probe rows (the mean row, each feature at ±1 and ±5 standard
  deviations, all of them together) are finite probabilities, for the pooled model and each
  site's personalised one (a coefficient of 1e308 overflows to NaN): checked on write too;
* every failure is a :class:`ModelFileError` naming the file and what is wrong, in one line.

:class:`FedtabModel` (what :func:`load_model` returns) predicts on a DataFrame with the
schema's columns: categories one-hot encoded with the agreed lists, the imputer (if any)
fills missing cells and absent columns exactly as the sites filled theirs (an integer code to
the nearest value of its agreed set, a missing category to exactly one category), then the
standardisation and the model; ``site=NAME`` applies that site's personalised model
(``fedtab predict --site NAME``), without it the pooled federated model.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .spec import nesting_depth

__all__ = ["FORMAT", "FedtabModel", "InputCheck", "ModelFileError", "PredictionError", "PredictionWarning", "load_model",
           "probe_rows", "write_model"]

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
#: :data:`_SPEC_SLACK`): an estimate, not an exact count, but ``hidden = [10**9]`` is far beyond it
_SPEC_FACTOR = 4
_SPEC_SLACK = 2**20
_KINDS = "biuf"
#: what reading a damaged zip member can raise (zipfile, zlib and the OS all report it differently)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError, ValueError)


class ModelFileError(ValueError):
    """A model file cannot be used (the message names the file and the problem)."""


class PredictionError(ValueError):
    """A table cannot be scored: missing columns, or a value that cannot be used (row and column named)."""


class PredictionWarning(UserWarning):
    """A table was scored, but not as given: columns ignored, cells filled, categories outside the model's lists."""


def _names(columns: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(c) for c in columns[:limit])
    return shown + (f" and {len(columns) - limit} more" if len(columns) > limit else "")


@dataclass(frozen=True)
class InputCheck:
    """What :meth:`FedtabModel.check` finds in a table before it is scored.

    Attributes:
        rows: the table's rows.
        missing: schema columns the model reads that the table lacks (schema order).
        unknown: ``{table column: closest model column or None}`` for columns the model does
            not know (the job's target is not reported).
        filled: ``{column the model reads: cells to fill}`` (an absent column: every row).
        uncoded: ``{categorical column: missing cells}``, encoded as no category, as in training
            (a model without an imputer; with one they are :attr:`filled` with one category).
        unseen: ``{categorical column: {category: rows}}`` for categories outside the model's list.
        other_level: ``{column of unseen: whether the model has an "(other)" level for it}``.
        fill_method: how cells are filled (the imputer, the federation's mean, trees' default branch).
    """

    rows: int
    missing: list[str]
    unknown: dict[str, str | None]
    filled: dict[str, int]
    uncoded: dict[str, int]
    unseen: dict[str, dict[str, int]]
    other_level: dict[str, bool]
    fill_method: str

    def _unknown_text(self) -> str:
        return ", ".join(f"{c!r}" + (f" (did you mean {m!r}?)" if m else "") for c, m in self.unknown.items())

    def missing_message(self, option: str) -> str:
        """The error for :attr:`missing`, naming ``option`` as the way to fill them."""
        text = f"the table lacks {len(self.missing)} column(s) the model reads: {_names(self.missing)}"
        renamed = {c: m for c, m in self.unknown.items() if m in self.missing}
        if renamed:
            text += "; the table has " + ", ".join(f"{c!r} (did you mean {m!r}?)" for c, m in renamed.items())
        how = self.fill_method if self.fill_method.startswith("with the model's") else (
            f"{self.fill_method}: the model has no imputer")
        return f"{text}. {option} fills them {how}"

    def warnings(self) -> list[str]:
        """One line per finding: unknown columns, filled cells, categories outside the lists."""
        out = []
        if self.unknown:
            out.append(f"{len(self.unknown)} column(s) the model does not know, ignored: {self._unknown_text()}")
        if self.filled:
            per = ", ".join(f"{c} {n}" + (" (absent)" if c in self.missing else "") for c, n in self.filled.items())
            out.append(f"filled {sum(self.filled.values())} missing cell(s) of {self.rows} row(s) "
                       f"{self.fill_method}: {per}")
        if self.uncoded:
            per = ", ".join(f"{c} {n}" for c, n in self.uncoded.items())
            out.append(f"{sum(self.uncoded.values())} missing cell(s) of categorical column(s) encoded as no "
                       f"category, as in training: {per}")
        for c, counts in self.unseen.items():
            level = "its '(other)' level" if self.other_level.get(c) else "no category (the model has no '(other)')"
            out.append(f"column {c!r}: {sum(counts.values())} row(s) with a category rare in training or new "
                       f"({_names(list(counts), 5)}) encoded as {level}")
        return out


#: standard deviations from the mean the probe rows of :meth:`FedtabModel.check_predictions` sit at
PROBE_SD = (1.0, 5.0)
#: features probed one at a time (all of them together in every case)
PROBE_FEATURES = 64


def probe_rows(d: int) -> np.ndarray:
    """``(n, d)`` standardised probe rows: zeros (the mean row); for the first
    :data:`PROBE_FEATURES` features, each alone at ``±s``; all features at ``±s`` with the same
    sign and with alternating signs (both phases), for each ``s`` in :data:`PROBE_SD`."""
    rows = [np.zeros(d)]
    k = min(d, PROBE_FEATURES)
    alternating = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    for sd in PROBE_SD:
        for sign in (1.0, -1.0):
            unit = np.zeros((k, d))
            unit[np.arange(k), np.arange(k)] = sign * sd
            rows.extend([*unit, np.full(d, sign * sd), sign * sd * alternating])
    return np.vstack(rows) if d else np.zeros((1, 0))


# ----------------------------------------------------------------------------- writing
def _collect_arrays(model: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split the workflow's model section into named arrays and the JSON rest."""
    arrays = {"standardise/mean": np.asarray(model["mean"], np.float64),
              "standardise/std": np.asarray(model["std"], np.float64)}
    gbdt = model["model"]["name"] == "gbdt"
    for k, v in model["params"].items():
        dtype = _gbdt_dtype(k) if gbdt else np.float32 if model["model"]["name"] == "mlp" else np.float64
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


def _gbdt_dtype(name: str) -> Any:
    """The dtype of a boosted-trees array (its trees as int/bool/float arrays, no pickle)."""
    from ..learn.gbdt.model import NODE_ARRAYS

    return NODE_ARRAYS.get(name, {"tree_ptr": np.int64, "edge_ptr": np.int64}.get(name, np.float32))


def _gbdt_model(m: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """The :class:`~fedtab.learn.gbdt.GBDTModel` of a ``gbdt`` model file (raises ``ValueError``)."""
    from ..learn.gbdt import GBDTModel
    from ..learn.gbdt.model import FORMAT as GBDT_FORMAT, VERSION as GBDT_VERSION
    from ..learn.models import make_model

    params = make_model(m["model"]).gbdt_params(len(m["classes"])).to_dict()
    manifest = {"format": GBDT_FORMAT, "version": GBDT_VERSION, "params": params,
                "feature_names": list(m["features"]), "best_iteration": None}
    return GBDTModel.from_arrays(manifest, {k[len("model/"):]: a for k, a in arrays.items() if k.startswith("model/")})


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


# ----------------------------------------------------------------------------- reading
def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _check_declared(declared: Mapping[str, Any], fail) -> None:
    """Shapes and dtypes of the declared arrays, and their total size, before anything is read."""
    if len(declared) > MAX_ARRAYS:
        fail(f"the manifest declares {len(declared)} arrays (limit {MAX_ARRAYS})")
    total = 0.0
    for name, decl in declared.items():
        shape, dtype = decl.get("shape"), decl.get("dtype")
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n for n in shape)
                or not isinstance(dtype, str)):
            fail(f"array {name!r}: bad declared shape/dtype (at most {MAX_NDIM} non-negative integer dimensions)")
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            fail(f"array {name!r}: unknown dtype {dtype[:40]!r}")
        if dt.kind not in _KINDS:
            fail(f"array {name!r}: dtype {dtype[:40]!r} is not bool/int/float")
        total += float(np.prod(shape, dtype=np.float64)) * dt.itemsize
    if total > MAX_TOTAL:
        fail(f"the arrays declare {total:.3g} bytes together (limit {MAX_TOTAL})")


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, fail) -> bytes:
    """The bytes of one member (at most ``limit``); a damaged member is one clear error."""
    try:
        with zf.open(info) as fh:
            return fh.read(limit)
    except _ZIP_ERRORS as exc:
        fail(f"member {info.filename!r} is corrupted ({type(exc).__name__}: {str(exc)[:120]})")
    raise AssertionError  # pragma: no cover - fail() raised


def _read_arrays(zf: zipfile.ZipFile, declared: Mapping[str, Any], fail) -> dict[str, np.ndarray]:
    out = {}
    for name, decl in declared.items():
        info = zf.getinfo(f"arrays/{name}.npy")
        shape, dtype = decl["shape"], decl["dtype"]
        dt = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.float64)) * dt.itemsize
        if size > MAX_ARRAY or info.file_size > MAX_ARRAY or info.file_size > size + 4096:
            fail(f"array {name!r}: {info.file_size} bytes for a declared {shape} {dtype} array (limit {MAX_ARRAY})")
        data = _member(zf, info, MAX_ARRAY + 4097, fail)
        try:
            a = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as exc:
            fail(f"array {name!r} cannot be read without pickle ({exc})")
        except Exception as exc:  # noqa: BLE001 - any malformed .npy is one clear error
            fail(f"array {name!r} is not a valid .npy file ({type(exc).__name__}: {exc})")
        if not isinstance(a, np.ndarray) or a.dtype != dt or list(a.shape) != shape:
            fail(f"array {name!r} holds {getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}, "
                 f"the manifest declares {dtype} {tuple(shape)}")
        if a.dtype.kind == "f" and not np.isfinite(a).all() and not name.startswith("imputer/prior"):
            fail(f"array {name!r} holds non-finite values")
        out[name] = a
    return out


def _check_structure(m: dict[str, Any], fail) -> None:
    """The manifest's JSON parts: the types every later step relies on."""
    schema = m["schema"]
    if not isinstance(schema, dict) or not _strings(schema.get("columns")):
        fail("schema must hold the column list (a list of names)")
    cats = schema.get("categories", {})
    if not isinstance(cats, dict) or not all(isinstance(k, str) and _strings(v) for k, v in cats.items()):
        fail("schema categories must map column names to lists of category names")
    if not _strings(m["encoded_columns"]):
        fail("encoded_columns must be a list of names")
    prov = m.get("provenance", {})
    job = prov.get("job", {}) if isinstance(prov, dict) else None
    if not isinstance(prov, dict) or not isinstance(job, dict) or not (
            "na_values" not in job or job["na_values"] is None or _strings(job["na_values"])):
        fail("provenance must be an object (its job's na_values a list of strings)")
    if m.get("imputer") is not None and not isinstance(m["imputer"], dict):
        fail("imputer must be an object or null")


def _check_model_spec(spec: Any, d: int, c: int, arrays: Mapping[str, np.ndarray], fail) -> Any:
    """The model built from ``spec`` -- after its estimated size was checked against the file's arrays."""
    from ..learn.models import make_model, model_cost

    held = sum(a.size for k, a in arrays.items() if k.startswith("model/"))
    try:
        size = model_cost(spec, d, c).size
        if not size <= _SPEC_FACTOR * held + _SPEC_SLACK:
            fail(f"model: the spec needs ~{size:.2g} parameters, the file holds {held}")
        return make_model(spec)
    except (ValueError, TypeError, OverflowError) as exc:
        if isinstance(exc, ModelFileError):
            raise
        fail(f"model: {exc}")


def _regression_spec(spec: Any) -> bool:
    """Whether a model file's ``{"name", "params"}`` predicts a number (``linear``, or ``gbdt`` with
    ``objective = "regression"``): such a file holds no classes."""
    if not isinstance(spec, dict):
        return False
    return spec.get("name") == "linear" or (spec.get("name") == "gbdt"
                                            and (spec.get("params") or {}).get("objective") == "regression")


def _check_shapes(m: dict[str, Any], arrays: dict[str, np.ndarray], fail) -> None:
    feats, classes = m["features"], m["classes"]
    if (not isinstance(feats, list) or not feats or not all(isinstance(f, str) for f in feats)
            or len(set(feats)) != len(feats)):
        fail("features must be a non-empty list of unique names")
    if classes == [] and not _regression_spec(m["model"]):
        fail("classes must be a list of at least two labels (no classes: a regression model, linear or gbdt with "
             "objective = \"regression\")")
    if not isinstance(classes, list) or (classes and len(classes) < 2) or not all(isinstance(c, str) for c in classes):
        fail("classes must be a list of at least two labels")
    d, c = len(feats), len(classes)
    for k in ("standardise/mean", "standardise/std"):
        if arrays[k].shape != (d,):
            fail(f"{k} has shape {arrays[k].shape}, expected ({d},) for {d} features")
    if not (arrays["standardise/std"] > 0).all():
        fail("standardise/std must be positive")
    _check_structure(m, fail)
    if isinstance(m["model"], dict) and m["model"].get("name") == "gbdt":
        from ..learn.models import make_model

        try:
            fm = make_model(m["model"])
            _gbdt_model(m, arrays)  # trees: their arrays are validated as a whole (shapes, children, features)
        except (ValueError, TypeError, KeyError) as exc:
            fail(f"model: {exc}")
    else:
        fm = _check_model_spec(m["model"], d, c, arrays, fail)
    template = {k: tuple(v.shape) for k, v in fm.init(d, c).items()}
    got = {k[len("model/"):]: a.shape for k, a in arrays.items() if k.startswith("model/")}
    if fm.name != "gbdt" and got != template:
        fail(f"model parameters {got} do not match a {fm.name} model over {d} features and {c} classes {template}")
    unknown = [f for f in feats if f not in m["encoded_columns"]]
    if unknown:
        fail(f"features {unknown[:5]} are not in the schema")
    _check_personalisation(m, fm, template, arrays, fail)
    im = m.get("imputer")
    if im is not None:
        cols = im.get("columns")
        if not isinstance(cols, list) or not cols or not all(isinstance(x, str) for x in cols):
            fail("imputer columns must be a list of names")
        f = len(cols)
        for k in ("mean", "std", "low", "high", "integer", "weight", "sign"):
            a = arrays[f"imputer/{k}"]
            if k in ("weight", "sign"):
                continue
            if a.shape != (f,):
                fail(f"imputer/{k} has shape {a.shape}, expected ({f},)")
        e = arrays["imputer/edge_index"]
        if e.ndim != 2 or e.shape[0] != 2 or (e.size and (e.min() < 0 or e.max() >= f)):
            fail(f"imputer/edge_index must be (2, E) indices into {f} columns")
        if arrays["imputer/weight"].shape != (e.shape[1],) or arrays["imputer/sign"].shape != (e.shape[1],):
            fail("imputer edge weights/signs do not match its edge list")
        if (arrays["imputer/low"] > arrays["imputer/high"]).any():
            fail("imputer ranges have low > high")
        _check_imputer_network(im, f, arrays, fail)
        _check_finishing(im, fail)


def _personal_shapes(mode: str, template: Mapping[str, tuple]) -> dict[str, tuple]:
    """The arrays (name -> shape) one site's personalisation of ``mode`` holds."""
    k = template["intercept"]
    if mode == "none":
        return {}
    if mode == "intercept":
        return {"shift": k}
    if mode == "calibration":
        return {"scale": (1,), "shift": k}
    return {"coef": template["coef"], "intercept": k}  # finetune:<mu>, local


def _check_personalisation(m: Mapping[str, Any], fm: Any, template: Mapping[str, tuple],
                           arrays: Mapping[str, np.ndarray], fail) -> None:
    """The per-site models of a selection: mode, site names and each site's arrays (see the module)."""
    from ..learn.personalise import check_mode

    got = {k for k in arrays if k.startswith("personal/")}
    pers = m.get("personalisation")
    if pers is None:
        if got:
            fail(f"arrays {sorted(got)[:3]} without a personalisation")
        return
    if not isinstance(pers, dict) or set(pers) != {"mode", "sites"} or not _strings(pers["sites"]) \
            or len(set(pers["sites"])) != len(pers["sites"]):
        fail("personalisation must be {mode, sites} with a list of unique site names")
    try:
        mode = check_mode(pers["mode"])
    except ValueError as exc:
        fail(f"personalisation: {exc}")
    if mode != "none" and fm.name != "logistic":
        fail(f"personalisation {mode!r} needs a logistic model, not {fm.name!r}")
    shapes = _personal_shapes(mode, template)
    expected = {f"personal/{i}/{k}": shape for i in range(len(pers["sites"])) for k, shape in shapes.items()}
    if got != set(expected):
        fail(f"personalisation {mode!r} of {len(pers['sites'])} sites needs arrays {sorted(expected)[:4]}, "
             f"the file holds {sorted(got)[:4]}")
    for k, shape in expected.items():
        if arrays[k].shape != shape or arrays[k].dtype.kind != "f":
            fail(f"{k} holds {arrays[k].dtype} {arrays[k].shape}, expected float {shape}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _check_finishing(im: Mapping[str, Any], fail) -> None:
    """The imputer's value sets (``levels``: column -> a non-empty list of finite numbers) and
    one-category groups (``groups``: lists of at least two distinct columns, no column in two
    groups), all over its columns. Absent in files written before they were stored: none."""
    cols = set(im["columns"])
    levels, groups = im.get("levels", {}), im.get("groups", [])
    if not isinstance(levels, dict) or not all(k in cols and isinstance(v, list) and v and all(map(_number, v))
                                               for k, v in levels.items()):
        fail("imputer levels must map imputer columns to non-empty lists of finite numbers")
    if not isinstance(groups, list) or not all(_strings(g) and len(g) > 1 and len(set(g)) == len(g)
                                               and set(g) <= cols for g in groups):
        fail("imputer groups must be lists of at least two distinct imputer columns")
    flat = [c for g in groups for c in g]
    if len(set(flat)) != len(flat):
        fail("imputer groups overlap (a column in two categorical groups)")


def _check_imputer_network(im: Mapping[str, Any], f: int, arrays: Mapping[str, np.ndarray], fail) -> None:
    """The imputer's network config within what its weights can hold, then its weights' names and
    shapes against the network it builds (so predicting cannot fail on them later)."""
    cfg = im.get("model_config")
    names = {k[len("imputer/w/"):]: a for k, a in arrays.items() if k.startswith("imputer/w/")}
    if not isinstance(cfg, dict) or cfg.get("n_features") != f:
        fail(f"imputer model_config must be an object with n_features = {f}")
    hidden, layers, rank = cfg.get("hidden_dim", 64), cfg.get("n_layers", 3), cfg.get("prior_rank", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (hidden, layers, rank)) \
            or hidden < 1 or rank > f:
        fail("imputer model_config: hidden_dim, n_layers and prior_rank must be integers in range")
    held = sum(a.size for a in names.values())
    need = f * hidden + layers * 4.0 * hidden * (hidden + 1)  # the embedding and each layer's four linear maps
    if not need <= _SPEC_FACTOR * held + _SPEC_SLACK:
        fail(f"imputer: its network needs ~{need:.2g} weights, the file holds {held}")
    if rank > 0 and not ({"imputer/prior_W", "imputer/prior_psi"} <= set(arrays)
                         and arrays["imputer/prior_W"].shape == (f, rank) and arrays["imputer/prior_psi"].shape == (f,)):
        fail(f"imputer: a prior of rank {rank} needs imputer/prior_W ({f}, {rank}) and imputer/prior_psi ({f},)")
    # the weights' names and shapes against the network are checked when the imputer is first
    # needed (:func:`_check_imputer_weights`): building the network imports torch, which a table
    # without missing cells never needs


def _check_imputer_weights(im: Mapping[str, Any], arrays: Mapping[str, np.ndarray], fail) -> None:
    """The imputer's weights' names and shapes against the network its config builds (imports torch)."""
    from ..impute.model import GNNConfig, GNNImputer

    names = {k[len("imputer/w/"):]: a for k, a in arrays.items() if k.startswith("imputer/w/")}
    try:
        state = GNNImputer(GNNConfig(**im["model_config"])).state_dict()
    except (TypeError, ValueError, RuntimeError) as exc:
        fail(f"imputer model_config: {type(exc).__name__}: {str(exc)[:160]}")
    expected = {k: tuple(v.shape) for k, v in state.items()}
    got = {k: tuple(a.shape) for k, a in names.items()}
    if got != expected or not _strings(im.get("weights")) or sorted(im["weights"]) != sorted(got):
        fail(f"imputer weights {sorted(got)[:4]}... do not match its network ({len(expected)} tensors)")


def load_model(path: str | Path) -> "FedtabModel":
    """Read and validate a model file (see the module docstring for what is checked).

    Raises:
        ModelFileError: missing, not a zip, a corrupted member, unexpected members, a manifest
            nested too deep or of the wrong structure, oversized or malformed arrays, pickled
            content, a model spec that would allocate far more than the file holds, shapes
            that do not fit together. Always one line naming the file.
    """
    p = Path(path)

    def fail(msg: str) -> None:
        raise ModelFileError(f"{p}: {' '.join(str(msg).split())}")

    if not p.is_file():
        fail("no such model file")
    try:
        zf = zipfile.ZipFile(p)
    except _ZIP_ERRORS as exc:
        fail(f"not a fedtab model file (not a zip archive: {exc})")
    with zf:
        names = [i.filename for i in zf.infolist()]
        if len(set(names)) != len(names):
            fail("the archive has duplicate member names")
        if MANIFEST not in names:
            fail("the archive has no manifest.json")
        info = zf.getinfo(MANIFEST)
        if info.file_size > MAX_MANIFEST:
            fail(f"manifest.json is {info.file_size} bytes (limit {MAX_MANIFEST})")
        raw = _member(zf, info, MAX_MANIFEST + 1, fail)
        try:
            m = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            fail(f"manifest.json is not valid JSON ({exc})")
        except RecursionError:
            fail(f"manifest.json is nested deeper than {MAX_DEPTH} levels")
        if nesting_depth(m, MAX_DEPTH) > MAX_DEPTH:
            fail(f"manifest.json is nested deeper than {MAX_DEPTH} levels")
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            fail(f"manifest.json is not a {FORMAT} manifest")
        if m.get("version") != VERSION:
            fail(f"model file version {str(m.get('version'))[:20]!r} is not supported (this fedtab reads version "
                 f"{VERSION})")
        declared = m.get("arrays")
        if not isinstance(declared, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                      for k, v in declared.items()):
            fail("manifest 'arrays' must map names to {shape, dtype}")
        _check_declared(declared, fail)
        expected = {MANIFEST} | {f"arrays/{k}.npy" for k in declared}
        extra = sorted(set(names) - expected)
        if extra:
            fail(f"unexpected members {extra[:5]} (a model file holds only manifest.json and its arrays)")
        missing = sorted(expected - set(names))
        if missing:
            fail(f"members {missing[:5]} are missing")
        needed = {"standardise/mean", "standardise/std"}
        if m.get("imputer"):
            needed |= {f"imputer/{k}" for k in ("mean", "std", "edge_index", "weight", "sign", "low", "high", "integer")}
        if needed - set(declared):
            fail(f"arrays {sorted(needed - set(declared))} are missing")
        for key in ("schema", "encoded_columns", "features", "classes", "model"):
            if key not in m:
                fail(f"manifest.json lacks {key!r}")
        arrays = _read_arrays(zf, declared, fail)
    _check_shapes(m, arrays, fail)
    model = FedtabModel(m, arrays, str(p))
    try:
        model.check_predictions()
    except ValueError as exc:
        fail(str(exc))
    return model


def _label(value: str) -> Any:
    try:
        f = float(value)
    except ValueError:
        return value
    return int(f) if f.is_integer() else f


@dataclass
class _Imputer:
    columns: list[str]
    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    integer: np.ndarray
    model: Any
    adj: Any
    #: by column index, as :func:`fedtab.impute.fill.fill_from_predictions` takes them
    levels: dict[int, list[float]]
    groups: list[list[int]]


class FedtabModel:
    """A trained job's model, read from a model file by :func:`load_model`.

    Attributes:
        features: the columns the model reads (elected, after one-hot encoding).
        classes: the class labels, in the order of ``predict_proba``'s columns.
        input_columns: the schema's columns (before encoding) a table may hold.
        reads: those of them behind :attr:`features` (a table must hold them, or be filled).
        provenance: fedtab version, job, sites, engine, date.
    """

    def __init__(self, manifest: dict[str, Any], arrays: dict[str, np.ndarray], source: str = "<memory>") -> None:
        from ..learn.models import make_model

        self.manifest, self.arrays, self.source = manifest, arrays, source
        self.features: list[str] = list(manifest["features"])
        self.classes: list[Any] = [_label(c) for c in manifest["classes"]]
        #: a regression model (no classes): :meth:`predict` returns numbers, :meth:`predict_proba` refuses
        self.regression: bool = not self.classes
        self.schema: dict[str, Any] = manifest["schema"]
        self.input_columns: list[str] = list(self.schema["columns"])
        self.provenance: dict[str, Any] = dict(manifest.get("provenance", {}))
        self._model = make_model(manifest["model"])
        self._params = {k[len("model/"):]: a for k, a in arrays.items() if k.startswith("model/")}
        self._imputer: _Imputer | None = None
        self._trees = _gbdt_model(manifest, arrays) if self._model.name == "gbdt" else None
        from ..data.categories import onehot_name

        cats = self.schema.get("categories", {})
        behind = {onehot_name(c, v): c for c, vs in cats.items() for v in vs}
        wanted = {behind.get(f, f) for f in self.features}
        self.reads: list[str] = [c for c in self.input_columns if c in wanted]
        pers = manifest.get("personalisation") or {}
        self.personalisation: str | None = pers.get("mode")
        #: the sites with a personalised model (``predict_proba(..., site=NAME)``); empty without one
        self.sites: list[str] = list(pers.get("sites") or [])

    @property
    def has_imputer(self) -> bool:
        return self.manifest.get("imputer") is not None

    def _imputer_live(self) -> _Imputer:
        if self._imputer is None:
            try:
                from ..impute.graph import FeatureGraph
                from ..impute.model import GNNConfig, GNNImputer, graph_tensors, numpy_to_state
            except ImportError as exc:
                raise PredictionError(f"the model's imputer needs torch to fill the table's missing cells ({exc}): "
                                      "pip install 'fedtab[torch]', or give complete rows") from None

            im, a = self.manifest["imputer"], self.arrays

            def fail(msg: str) -> None:
                raise ModelFileError(f"{self.source}: {' '.join(str(msg).split())}")

            _check_imputer_weights(im, a, fail)
            model = GNNImputer(GNNConfig(**im["model_config"]))
            if model.config.prior_rank > 0:
                model.set_prior(a["imputer/prior_W"], a["imputer/prior_psi"])
            numpy_to_state(model, {k[len("imputer/w/"):]: v for k, v in a.items() if k.startswith("imputer/w/")})
            model.eval()
            graph = FeatureGraph(im["columns"], a["imputer/edge_index"], a["imputer/weight"], a["imputer/sign"])
            pos = {c: j for j, c in enumerate(im["columns"])}
            self._imputer = _Imputer(im["columns"], a["imputer/mean"], a["imputer/std"], a["imputer/low"],
                                     a["imputer/high"], a["imputer/integer"], model, graph_tensors(graph),
                                     {pos[c]: list(v) for c, v in (im.get("levels") or {}).items()},
                                     [[pos[c] for c in g] for g in im.get("groups") or ()])
        return self._imputer

    # ----- the table -> model input -------------------------------------------------
    def _encoded(self, table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, dict[str, int]]]:
        """``(encoded, unseen)``: numeric columns checked, categorical columns one-hot encoded
        (absent columns left out); ``unseen[column][value]`` counts the rows whose category is
        not in the model's list, encoded as its ``(other)`` level (all zeros without one). A
        missing categorical cell is, as in the job: NaN in each indicator when the model has an
        imputer (which gives the row one category), all zeros (no category) without one."""
        from ..data.categories import category_key, onehot_name
        from ..privacy.policy import OTHER_CATEGORY

        if not isinstance(table, pd.DataFrame):
            raise PredictionError(f"expected a pandas DataFrame, got {type(table).__name__}")
        cats = self.schema.get("categories", {})
        parts, unseen = {}, {}
        for c in self.input_columns:
            if c not in table.columns:
                continue
            col = table[c]
            if c in cats:
                observed = col.notna().to_numpy()
                strings = col[observed].map(category_key)  # 7.0 read from a file is the code "7"
                new = ~strings.isin(cats[c])
                if new.any():  # rare in training (merged into "(other)" there) or never seen
                    unseen[c] = {str(k): int(v) for k, v in strings[new].value_counts().items()}
                    strings = strings.where(~new, OTHER_CATEGORY)
                index = {v: i for i, v in enumerate(cats[c])}
                block = np.zeros((len(table), len(cats[c]) + 1))  # the last column: no level
                if self.has_imputer:
                    block[~observed] = np.nan
                block[np.flatnonzero(observed), [index.get(v, len(cats[c])) for v in strings]] = 1.0
                for i, v in enumerate(cats[c]):
                    parts[onehot_name(c, v)] = block[:, i]
                continue
            values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero((np.isnan(values) & col.notna().to_numpy()) | np.isinf(values))
            if len(bad):
                pos = int(bad[0])
                raise PredictionError(f"row {pos + 1}, column {c!r}: value {col.iloc[pos]!r} is not a finite number")
            parts[c] = values
        return pd.DataFrame(parts, index=range(len(table))), unseen

    def _fill_method(self) -> str:
        if self.has_imputer:
            return "with the model's imputer"
        if self._trees is not None:
            return "as missing (each tree's default branch)"
        return "with the federation's mean"

    def _check(self, table: pd.DataFrame, unseen: dict[str, dict[str, int]]) -> "InputCheck":
        import difflib

        from ..privacy.policy import OTHER_CATEGORY

        known = set(self.input_columns)
        target = (self.provenance.get("job") or {}).get("target")
        lower = {c.lower(): c for c in self.input_columns}
        unknown = {}
        for c in map(str, table.columns):
            if c in known or c == target:
                continue
            close = difflib.get_close_matches(c, self.input_columns, n=1, cutoff=0.6)
            unknown[c] = lower.get(c.lower()) or (close[0] if close else None)
        missing = [c for c in self.reads if c not in table.columns]
        cats = self.schema.get("categories", {})
        gaps = {c: len(table) if c not in table.columns else int(table[c].isna().sum()) for c in self.reads}
        # as in training: a missing categorical cell is filled by the imputer, without one encoded as no category
        coded = {c for c in cats if c not in missing and not self.has_imputer}
        return InputCheck(rows=len(table), missing=missing, unknown=unknown,
                          filled={c: n for c, n in gaps.items() if n and c not in coded},
                          uncoded={c: n for c, n in gaps.items() if n and c in coded},
                          unseen=unseen, other_level={c: OTHER_CATEGORY in cats.get(c, []) for c in unseen},
                          fill_method=self._fill_method())

    def check(self, table: pd.DataFrame) -> "InputCheck":
        """What :meth:`predict_proba` would find in ``table``: the model's columns it lacks,
        columns the model does not know (with the closest model column), cells to be filled and
        categories outside the model's lists. Reads the table only; nothing is imputed.

        Raises:
            PredictionError: not a DataFrame, or a value that cannot be used (row and column named).
        """
        return self._check(table, self._encoded(table)[1])

    def _impute(self, enc: pd.DataFrame, index: pd.Index) -> pd.DataFrame:
        from ..impute.fill import fill_from_predictions
        from ..impute.train import predict

        im = self._imputer_live()
        raw = np.full((len(enc), len(im.columns)), np.nan)
        available = np.zeros(len(im.columns), dtype=bool)
        for j, c in enumerate(im.columns):
            if c in enc.columns:
                raw[:, j] = enc[c].to_numpy()
                available[j] = True
        pred = predict(im.model, (raw - im.mean) / im.std, available, im.adj) if len(enc) else raw
        values, _, _ = fill_from_predictions(raw, pred, im.mean, im.std, im.low, im.high, im.integer, im.levels,
                                             im.groups)
        return pd.DataFrame(values, columns=im.columns, index=index)

    def transform(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` as the model sees it before standardisation: categories one-hot encoded and,
        with an imputer, every missing cell and absent column filled (original units, clipped
        to the pooled observed range, integer columns rounded, integer-coded columns to their
        agreed value set, a missing category to one category); rows and order kept.

        Raises:
            PredictionError: as :meth:`predict_proba`.
        """
        enc, _ = self._encoded(table)
        if self.has_imputer:
            return self._impute(enc, table.index)
        enc.index = table.index
        return enc

    def model_inputs(self, table: pd.DataFrame) -> pd.DataFrame:
        """The :attr:`features` columns of ``table``, encoded, before standardisation; rows kept.

        A missing cell or absent column is filled by the imputer (only when one is needed, so a
        complete table never imports torch), else left NaN (the federation's mean after
        standardisation; each tree's default branch for boosted trees). Warns nothing, checks
        nothing beyond the values: see :meth:`check`.
        """
        return self._features(self._encoded(table)[0], table.index)

    def _features(self, enc: pd.DataFrame, index: pd.Index) -> pd.DataFrame:
        present = [f for f in self.features if f in enc.columns]
        if self.has_imputer and (len(present) < len(self.features) or enc[present].isna().to_numpy().any()):
            enc = self._impute(enc, index)
        X = np.column_stack([enc[f].to_numpy(dtype=np.float64) if f in enc.columns else np.full(len(enc), np.nan)
                             for f in self.features])
        return pd.DataFrame(X, columns=self.features, index=index)

    def _standardised(self, X: np.ndarray) -> np.ndarray:
        if self._trees is not None:  # trees: raw values, a missing cell follows each split's default direction
            return X
        Z = (X - self.arrays["standardise/mean"]) / self.arrays["standardise/std"]
        Z[np.isnan(Z)] = 0.0  # as in training: a missing cell is the federation's mean
        return Z

    # ----- public API ---------------------------------------------------------------
    def site_params(self, site: str) -> dict[str, np.ndarray]:
        """Site ``site``'s personalised parameters (``{}`` in mode ``"none"``).

        Raises:
            PredictionError: the model has no per-site models, or none for ``site`` (naming the known ones).
        """
        if self.personalisation is None:
            raise PredictionError(f"this model has no per-site models (only a job with [election] tune = \"cv\" "
                                  f"stores them); predict without a site for the pooled model")
        if site not in self.sites:
            raise PredictionError(f"unknown site {site!r}; the model has per-site models for: {', '.join(self.sites)}")
        i = self.sites.index(site)
        prefix = f"personal/{i}/"
        return {k[len(prefix):]: a for k, a in self.arrays.items() if k.startswith(prefix)}

    def predict_proba(self, table: pd.DataFrame, site: str | None = None, *,
                      allow_missing: bool | None = None) -> np.ndarray:
        """``(n, len(classes))`` class probabilities for the rows of ``table``, in order; with
        ``site``, of that site's personalised model (:attr:`sites`), else the pooled model.

        Columns are matched by name. A category outside the model's list (rare in training or
        new) is encoded as the model's ``(other)`` level (all zeros when the model has none), as
        scikit-learn's ``handle_unknown="infrequent_if_exist"``. Each finding of :meth:`check`
        (unknown columns with a did-you-mean, cells filled per column, unseen categories) is a
        :class:`PredictionWarning`.

        Args:
            allow_missing: whether columns the model reads may be absent (filled as
                :meth:`model_inputs` says). ``None``: only when the model has an imputer.

        Raises:
            PredictionError: the table lacks columns the model reads (listed, with did-you-mean)
                and ``allow_missing`` does not allow it, or a value cannot be used (naming the row
                and column); a site the model has no personalised model for (naming the known ones).
        """
        if self.regression:
            raise PredictionError("a regression model predicts numbers, not class probabilities: use predict")
        return self._proba(*self._inputs(table, site, allow_missing))

    def _inputs(self, table: pd.DataFrame, site: str | None, allow_missing: bool | None
                ) -> tuple[np.ndarray, Mapping[str, np.ndarray] | None]:
        """``(Z, own)``: the model's inputs for ``table`` and ``site``'s own parameters (as :meth:`predict_proba`)."""
        import warnings

        own = self.site_params(site) if site is not None else None

        enc, unseen = self._encoded(table)
        found = self._check(table, unseen)
        allowed = self.has_imputer if allow_missing is None else allow_missing
        if found.missing and not allowed:
            raise PredictionError(found.missing_message("allow_missing=True"))
        for message in found.warnings():
            warnings.warn(message, PredictionWarning, stacklevel=2)
        Z = self._standardised(self._features(enc, table.index).to_numpy(dtype=np.float64))
        return Z, own

    def _values(self, Z: np.ndarray) -> np.ndarray:
        """``(n,)`` predicted numbers of a regression model's inputs ``Z``."""
        if self._trees is not None:
            return np.asarray(self._trees.predict(Z), dtype=np.float64)
        return np.asarray(self._model.predict(self._params, Z), dtype=np.float64)

    def _proba(self, Z: np.ndarray, own: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """``(n, classes)`` probabilities of the model's inputs ``Z`` (standardised; raw for
        trees), of the personalised model with ``own`` (a site's parameters)."""
        from ..learn.personalise import personalised_proba

        if self._trees is not None:
            return np.asarray(self._trees.predict_proba(Z), dtype=np.float64)
        if own is not None and self.personalisation not in (None, "none"):
            return personalised_proba(str(self.personalisation), self._params, own, Z)
        return np.asarray(self._model.predict_proba(self._params, Z), dtype=np.float64)

    def check_predictions(self) -> None:
        """Refuse a model whose predictions are not finite probabilities on the probe rows
        (:func:`probe_rows`: the mean row, each feature at ±1 and ±5 standard deviations, all
        features together at ±1 and ±5 with the same and with alternating signs) -- e.g. a
        coefficient of 1e308, whose logits overflow to ``inf - inf``; for the pooled model and
        every site's personalised one.

        Raises:
            ValueError: one line naming the model (pooled or site) and the largest parameter.
        """
        import warnings

        mean, std = self.arrays["standardise/mean"], self.arrays["standardise/std"]
        X = probe_rows(len(self.features)) * std + mean
        Z = self._standardised(X)
        for site in [None, *self.sites]:
            own = None if site is None else self.site_params(site)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    if self.regression:
                        values = self._values(Z)
                        ok = bool(np.isfinite(values).all())
                        proba = None
                    else:
                        proba = self._proba(Z, own)
                    ok = ok if proba is None else bool(np.isfinite(proba).all() and np.all(proba >= 0)
                              and np.allclose(proba.sum(axis=1), 1.0, atol=1e-6))
                except (ValueError, FloatingPointError, OverflowError):
                    ok = False
            if not ok:
                params = {**self._params, **(own or {})}
                big = max(((float(np.abs(a).max()), k) for k, a in params.items()
                           if a.size and np.asarray(a).dtype.kind == "f"), default=(float("nan"), "?"))
                raise ValueError(f"the {'pooled model' if site is None else f'model of site {site!r}'} yields "
                                 f"non-finite probabilities (largest parameter |{big[1]}| = {big[0]:.3g})")

    def labels(self, proba: np.ndarray) -> np.ndarray:
        """The class label of each row of ``proba`` (its largest probability)."""
        return np.asarray(self.classes, dtype=object)[np.argmax(proba, axis=1)] if len(proba) else np.zeros(0)

    def to_xgboost(self):
        """An ``xgboost.Booster`` with the model's trees (``gbdt`` models; needs the xgboost extra).

        Its ``predict`` on :attr:`features` (``xgboost.DMatrix`` of the encoded columns, NaN for
        missing) equals :meth:`predict_proba`'s positive-class column (binary) or its rows
        (multiclass) within 1e-5.

        Raises:
            NotImplementedError: the model is not boosted trees.
        """
        if self._trees is None:
            raise NotImplementedError(f"model {self._model.name!r} is not boosted trees; to_xgboost needs 'gbdt'")
        return self._trees.to_xgboost()

    @property
    def trees(self) -> Any:
        """The :class:`~fedtab.learn.gbdt.GBDTModel` of a ``gbdt`` model (``None`` otherwise)."""
        return self._trees

    def predict(self, table: pd.DataFrame, site: str | None = None, *,
                allow_missing: bool | None = None) -> np.ndarray:
        """``(n,)`` predicted class labels for the rows of ``table``, in order (``site``,
        ``allow_missing``: as :meth:`predict_proba`). A regression model: ``(n,)`` predicted numbers."""
        if self.regression:
            return self._values(self._inputs(table, site, allow_missing)[0])
        return self.labels(self.predict_proba(table, site, allow_missing=allow_missing))

    def to_sklearn(self):
        """A fitted scikit-learn pipeline that predicts as :meth:`predict_proba` on the same tables.

        Steps: ``prepare`` (:class:`~fedtab.job.sklearn_inputs.ModelInputs`: the table's schema
        columns encoded with the agreed categories and, for a model with an imputer, its missing
        cells filled by that imputer -- which needs torch when a cell is missing; cells it
        leaves missing become the federation's mean), ``standardise`` (the federation's
        mean/std) and ``model``: a ``LogisticRegression`` (models ``logistic``, ``sgd``) or
        ``GaussianNB`` (``gnb``) holding the federated parameters. Unlike :meth:`predict_proba`
        it fills absent columns without asking and warns nothing; run :meth:`check` first.

        Raises:
            NotImplementedError: for models without a scikit-learn equivalent (``mlp``, ``gbdt``:
                use :meth:`to_xgboost`), saying why.
        """
        from sklearn.linear_model import LogisticRegression
        from sklearn.naive_bayes import GaussianNB
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        from .sklearn_inputs import ModelInputs

        name = self._model.name
        d = len(self.features)
        scaler = StandardScaler()
        scaler.mean_ = self.arrays["standardise/mean"].copy()
        scaler.scale_ = self.arrays["standardise/std"].copy()
        scaler.var_ = scaler.scale_**2
        scaler.n_features_in_ = d
        scaler.feature_names_in_ = np.asarray(self.features, dtype=object)
        scaler.n_samples_seen_ = 1
        classes = np.asarray(self.classes)
        if name in ("logistic", "sgd"):
            est = LogisticRegression()
            est.coef_ = np.asarray(self._params["coef"], np.float64).copy()
            est.intercept_ = np.asarray(self._params["intercept"], np.float64).copy()
        elif name == "gnb":
            est = GaussianNB()
            est.theta_ = np.asarray(self._params["theta"], np.float64).copy()
            est.var_ = np.asarray(self._params["var"], np.float64).copy()
            est.class_prior_ = np.exp(np.asarray(self._params["log_prior"], np.float64))
            est.class_count_ = est.class_prior_.copy()
            est.epsilon_ = 0.0
        elif name == "gbdt":
            raise NotImplementedError("model 'gbdt' is boosted trees, which scikit-learn cannot hold with the "
                                      "federation's splits; use to_xgboost(), or predict/predict_proba")
        else:
            raise NotImplementedError(f"model {name!r} is a neural network with no scikit-learn equivalent; use "
                                      "predict/predict_proba")
        est.classes_ = classes
        est.n_features_in_ = d
        return Pipeline([("prepare", ModelInputs(self)), ("standardise", scaler), ("model", est)])
