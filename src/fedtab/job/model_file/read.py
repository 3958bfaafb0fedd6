"""Reading a model file: :func:`load_model` validates everything before any of it is used, because a
model file may come from someone else (what is checked: :mod:`fedtab.job.model_file`).

The archive is checked from its zip directory before anything is read (members, sizes), then the
manifest's header (:data:`HEADER`, a table of rules), then each array as it is read, then the
manifest's shapes (:data:`fedtab.job.model_file.checks.CHECKS`) and the model's predictions on
probe rows. Every failure is one :class:`ModelFileError` line naming the file.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

import numpy as np

from ..spec import nesting_depth
from .checks import check_manifest
from .format import (FORMAT, IMPUTER_ARRAYS, KINDS, MANIFEST, MAX_ARRAY, MAX_ARRAYS, MAX_DEPTH, MAX_MANIFEST,
                     MAX_NDIM, MAX_TOTAL, STANDARDISE, VERSION, ZIP_ERRORS, ModelFileError)
from .model import FedtabModel

__all__ = ["HEADER", "load_model"]

Fail = Callable[[str], NoReturn]


@dataclass(frozen=True)
class _Archive:
    """The parsed manifest ``m`` and the archive's member names."""

    m: Any
    names: list[str]

    @property
    def declared(self) -> dict[str, Any]:
        return self.m["arrays"]

    def expected(self) -> set[str]:
        return {MANIFEST} | {f"arrays/{k}.npy" for k in self.declared}

    def needed(self) -> set[str]:
        return set(STANDARDISE) | (set(IMPUTER_ARRAYS) if self.m.get("imputer") else set())


def _declared_map(a: _Archive) -> bool:
    d = a.m.get("arrays")
    return isinstance(d, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in d.items())


#: the manifest's header, in order: ``(holds, message)``; ``_check_declared`` runs after the
#: ``arrays`` entry, before the members are compared with it
HEADER: tuple[tuple[Callable[[_Archive], bool], Callable[[_Archive], str]], ...] = (
    (lambda a: nesting_depth(a.m, MAX_DEPTH) <= MAX_DEPTH,
     lambda a: f"manifest.json is nested deeper than {MAX_DEPTH} levels"),
    (lambda a: isinstance(a.m, dict) and a.m.get("format") == FORMAT,
     lambda a: f"manifest.json is not a {FORMAT} manifest"),
    (lambda a: a.m.get("version") == VERSION,
     lambda a: f"model file version {str(a.m.get('version'))[:20]!r} is not supported (this fedtab reads version "
               f"{VERSION})"),
    (_declared_map, lambda a: "manifest 'arrays' must map names to {shape, dtype}"),
)
#: after the declared arrays are checked: the archive's members and the manifest's keys
MEMBERS: tuple[tuple[Callable[[_Archive], bool], Callable[[_Archive], str]], ...] = (
    (lambda a: set(a.names) <= a.expected(),
     lambda a: f"unexpected members {sorted(set(a.names) - a.expected())[:5]} (a model file holds only "
               "manifest.json and its arrays)"),
    (lambda a: a.expected() <= set(a.names), lambda a: f"members {sorted(a.expected() - set(a.names))[:5]} are missing"),
    (lambda a: a.needed() <= set(a.declared), lambda a: f"arrays {sorted(a.needed() - set(a.declared))} are missing"),
    *((lambda a, k=k: k in a.m, lambda a, k=k: f"manifest.json lacks {k!r}")
      for k in ("schema", "encoded_columns", "features", "classes", "model")),
)


def _check_declared(declared: Mapping[str, Any], fail: Fail) -> None:
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
        if dt.kind not in KINDS:
            fail(f"array {name!r}: dtype {dtype[:40]!r} is not bool/int/float")
        total += float(np.prod(shape, dtype=np.float64)) * dt.itemsize
    if total > MAX_TOTAL:
        fail(f"the arrays declare {total:.3g} bytes together (limit {MAX_TOTAL})")


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, fail: Fail) -> bytes:
    """The bytes of one member (at most ``limit``); a damaged member is one clear error."""
    try:
        with zf.open(info) as fh:
            return fh.read(limit)
    except ZIP_ERRORS as exc:
        fail(f"member {info.filename!r} is corrupted ({type(exc).__name__}: {str(exc)[:120]})")
    raise AssertionError  # pragma: no cover - fail() raised


def _read_array(zf: zipfile.ZipFile, name: str, decl: Mapping[str, Any], fail: Fail) -> np.ndarray:
    """One declared array, read without pickle and held to its declared size, shape and dtype."""
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
    return a


def _manifest(zf: zipfile.ZipFile, names: list[str], fail: Fail) -> Any:
    """The parsed ``manifest.json`` (size-checked before it is read)."""
    if len(set(names)) != len(names):
        fail("the archive has duplicate member names")
    if MANIFEST not in names:
        fail("the archive has no manifest.json")
    info = zf.getinfo(MANIFEST)
    if info.file_size > MAX_MANIFEST:
        fail(f"manifest.json is {info.file_size} bytes (limit {MAX_MANIFEST})")
    raw = _member(zf, info, MAX_MANIFEST + 1, fail)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        fail(f"manifest.json is not valid JSON ({exc})")
    except RecursionError:
        fail(f"manifest.json is nested deeper than {MAX_DEPTH} levels")


def _rules(rules: tuple, archive: _Archive, fail: Fail) -> None:
    for holds, message in rules:
        if not holds(archive):
            fail(message(archive))


def load_model(path: str | Path) -> FedtabModel:
    """Read and validate a model file (see :mod:`fedtab.job.model_file` for what is checked).

    Raises:
        ModelFileError: missing, not a zip, a corrupted member, unexpected members, a manifest
            nested too deep or of the wrong structure, oversized or malformed arrays, pickled
            content, a model spec that would allocate far more than the file holds, shapes
            that do not fit together. Always one line naming the file.
    """
    p = Path(path)

    def fail(msg: str) -> NoReturn:
        raise ModelFileError(f"{p}: {' '.join(str(msg).split())}")

    if not p.is_file():
        fail("no such model file")
    try:
        zf = zipfile.ZipFile(p)
    except ZIP_ERRORS as exc:
        fail(f"not a fedtab model file (not a zip archive: {exc})")
    with zf:
        names = [i.filename for i in zf.infolist()]
        archive = _Archive(_manifest(zf, names, fail), names)
        _rules(HEADER, archive, fail)
        _check_declared(archive.declared, fail)
        _rules(MEMBERS, archive, fail)
        arrays = {name: _read_array(zf, name, decl, fail) for name, decl in archive.declared.items()}
    check_manifest(archive.m, arrays, fail)
    model = FedtabModel(archive.m, arrays, str(p))
    try:
        model.check_predictions()
    except ValueError as exc:
        fail(str(exc))
    return model
