"""The site's prepared table, kept in its state folder so only the first message of its life reads the file.

A Flower SuperNode answers every message in a fresh process, and every run starts with a
step that needs the site's table (the ballot). Without a cache each such process reads and
parses the CSV (separator sniffing, type inference, the finiteness checks) and draws the
site's parts again. :class:`TableCache` stores what :func:`fedtab.engines.site_config.build_site`
made of the file -- the parsed, typed table (and the held-out table of a ``test-path``) and
the site's parts (train, test, folds) -- in ``<state-dir>/table-cache/<key>/``, where the key
is a SHA-256 over

* the content of the data file(s) (a changed file gets another key: it is read again), and
* every setting that shapes the table or its parts: target, label map, missing-value
  strings, separator, decimal mark, seed, test share, folds, ``min_rows``, and
  :data:`FORMAT` (bumped whenever the layout or the way parts are drawn changes).

Storage is numpy ``.npy`` files read with ``allow_pickle=False`` and one JSON manifest:
the numeric and boolean columns of one dtype as one ``(columns, rows)`` array (a table of
numbers is one file per table to read, which is faster than parsing its CSV), each text
column as a fixed-width unicode array plus a missing-value mask. A table with a column of any other kind (mixed objects,
dates...) is not cached (it is read from its file every time). The manifest holds the
SHA-256 of every array file; an entry whose manifest or any array is missing, malformed or
does not match is refused (:meth:`TableCache.load` returns ``None``, the caller reads the
file and stores a fresh entry). Entries are written to a temporary folder and renamed into
place, so a reader never sees half an entry; older keys of the site are removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from fedtab.federation.site.parts import RowParts

__all__ = ["CACHE_DIR", "FORMAT", "CachedTables", "TableCache", "cache_key"]

log = logging.getLogger("fedtab.engines.table_cache")

#: folder of the cache inside the site's state folder
CACHE_DIR = "table-cache"
#: layout version, part of every key
FORMAT = "fedtab-table-cache-2"
#: the settings (normalised site-config keys) that shape the prepared table or its parts
SHAPING_KEYS = ("target", "label_map", "na_values", "sep", "decimal", "seed", "test_size", "folds", "min_rows",
                "policy", "task")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CachedTables:
    """What a cache entry holds: the site's table, its held-out table (``None`` without a
    ``test-path``) and its parts (``RowParts``)."""

    table: "pd.DataFrame"
    test: "pd.DataFrame | None"
    parts: "RowParts"


def _file_hash(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cache_key(cfg: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the data file(s)' content and the shaping settings of the normalised
    site config ``cfg`` (:func:`fedtab.engines.site_config.site_config`).

    Raises:
        OSError: a data file cannot be read.
    """
    files = [_file_hash(cfg["data_path"])]
    if cfg.get("test_path"):
        files.append(_file_hash(cfg["test_path"]))
    settings = {k: cfg.get(k) for k in SHAPING_KEYS}
    text = json.dumps({"format": FORMAT, "files": files, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- frames <-> arrays
def _frame_arrays(frame: "pd.DataFrame", prefix: str) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]] | None:
    """``(column specs, {file name: array})`` of ``frame``; ``None`` when a column has a kind
    the cache does not store.

    Numeric and boolean columns of one dtype share one file, ``<prefix>.<dtype>.npy`` of shape
    ``(columns, rows)`` (a spec names its ``block`` and ``row``): a site's table of a hundred
    numeric columns is one file to read, not a hundred. A text column is its own file
    ``<prefix><i>.npy`` (fixed-width unicode, as wide as its longest cell) with its missing-value
    mask ``<prefix><i>.na.npy``."""
    import pandas as pd

    specs: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    blocks: dict[str, list[np.ndarray]] = {}
    for i, name in enumerate(frame.columns):
        col = frame[name]
        dtype = col.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
            block = f"{prefix}.{dtype.str.lstrip('<>|=')}.npy"
            rows = blocks.setdefault(block, [])
            specs.append({"name": str(name), "kind": "numeric", "dtype": dtype.str, "block": block, "row": len(rows)})
            rows.append(col.to_numpy())
            continue
        if pd.api.types.is_string_dtype(dtype) or dtype == object:
            missing = col.isna().to_numpy()
            values = col.to_numpy(dtype=object)
            present = values[~missing]
            if not all(type(v) is str for v in present):
                return None
            text = np.where(missing, "", values).astype(str) if len(values) else np.zeros(0, dtype="<U1")
            arrays[f"{prefix}{i}.npy"] = text
            arrays[f"{prefix}{i}.na.npy"] = missing
            specs.append({"name": str(name), "kind": "text", "dtype": str(dtype)})
            continue
        return None
    for block, rows in blocks.items():
        arrays[block] = np.stack(rows)
    return specs, arrays


def _frame(specs: Sequence[Mapping[str, Any]], arrays: Mapping[str, np.ndarray], prefix: str, n_rows: int) -> "pd.DataFrame":
    """The table :func:`_frame_arrays` stored, its columns in their order.

    Raises:
        ValueError: a block or column of the wrong shape or dtype, a spec that names a file of
            another table or a row outside its block, an unknown kind, repeated names.
    """
    import pandas as pd

    names = [str(spec["name"]) for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError("column names repeat")
    by_block: dict[str, list[tuple[int, int]]] = {}  # block file -> [(row in block, column position)]
    text: list[pd.Series] = []
    for i, spec in enumerate(specs):
        if spec["kind"] == "numeric":
            block = spec.get("block")
            if not isinstance(block, str) or not block.startswith(f"{prefix}.") or block not in arrays:
                raise ValueError(f"column {i} names no block of this table")
            by_block.setdefault(block, []).append((int(spec["row"]), i))
            if arrays[block].dtype.str != spec["dtype"]:
                raise ValueError(f"column {i} has dtype {arrays[block].dtype.str}, expected {spec['dtype']}")
        elif spec["kind"] == "text":
            values, missing = arrays[f"{prefix}{i}.npy"], arrays[f"{prefix}{i}.na.npy"]
            if values.shape != (n_rows,) or missing.dtype != np.bool_ or missing.shape != (n_rows,) \
                    or values.dtype.kind != "U":
                raise ValueError(f"text column {i} is malformed")
            obj = values.astype(object)
            obj[missing] = None
            series = pd.Series(obj, dtype=spec["dtype"] if spec["dtype"] != "object" else object)
            if spec["dtype"] == "object":
                series = series.where(~missing, np.nan)
            text.append(series.rename(names[i]))
        else:
            raise ValueError(f"column {i} has an unknown kind {spec['kind']!r}")
    pieces = []
    for block, members in by_block.items():
        values = arrays[block]
        if values.ndim != 2 or values.shape[1] != n_rows:
            raise ValueError(f"{block} has shape {values.shape}, expected (columns, {n_rows})")
        rows = [r for r, _ in members]
        if sorted(rows) != list(range(values.shape[0])):
            raise ValueError(f"{block}: its columns do not name each of its {values.shape[0]} rows once")
        # (rows, columns) as a transposed view: pandas keeps the block as it is, one array for all its columns
        ordered = values if rows == list(range(len(rows))) else values[rows]
        pieces.append(pd.DataFrame(ordered.T, columns=[names[i] for _, i in members], copy=False))
    pieces.extend(series.to_frame() for series in text)
    if not pieces:
        return pd.DataFrame(index=pd.RangeIndex(n_rows))
    frame = pieces[0] if len(pieces) == 1 else pd.concat(pieces, axis=1)
    return frame if list(frame.columns) == names else frame[names]


# ----------------------------------------------------------------------------- the cache
class TableCache:
    """The prepared-table cache of one site, in ``<state_dir>/table-cache``.

    Args:
        state_dir: the site's state folder (``state-dir`` of its config).
    """

    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(str(state_dir)) / CACHE_DIR

    def _entry(self, key: str) -> Path:
        if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
            raise ValueError(f"not a cache key: {key!r}")
        return self.root / key

    def load(self, key: str) -> CachedTables | None:
        """The entry stored under ``key``, or ``None`` when there is none or it is damaged (any
        file missing, a hash or shape that does not match, a malformed manifest: logged)."""
        entry = self._entry(key)
        if not (entry / "manifest.json").is_file():
            return None
        try:
            return self._read(entry)
        except Exception as exc:  # noqa: BLE001 - any damage: read the file again
            log.warning("table cache %s is damaged (%s: %s); the site's file is read again",
                        entry, type(exc).__name__, exc)
            shutil.rmtree(entry, ignore_errors=True)
            return None

    def _read(self, entry: Path) -> CachedTables:
        from fedtab.federation.site.parts import RowParts

        manifest = json.loads((entry / "manifest.json").read_text())
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
            raise ValueError("unknown manifest format")
        arrays: dict[str, np.ndarray] = {}
        for file, digest in manifest["files"].items():
            if not isinstance(file, str) or "/" in file or os.sep in file or file.startswith(".") \
                    or not file.endswith(".npy"):
                raise ValueError(f"bad file name {file!r}")
            path = entry / file
            if _file_hash(path) != digest:
                raise ValueError(f"{file}: content does not match its hash")
            arrays[file] = np.load(path, allow_pickle=False)
        table = _frame(manifest["table"]["columns"], arrays, "t", int(manifest["table"]["rows"]))
        test = None
        if manifest.get("test") is not None:
            test = _frame(manifest["test"]["columns"], arrays, "h", int(manifest["test"]["rows"]))
        n_folds = int(manifest["parts"]["folds"])
        parts = RowParts(n_rows=int(manifest["parts"]["n_rows"]), train=arrays["p.train.npy"],
                         test=arrays["p.test.npy"], folds=tuple(arrays[f"p.fold{k}.npy"] for k in range(n_folds)))
        _check_parts(parts)
        return CachedTables(table, test, parts)

    def store(self, key: str, tables: CachedTables) -> bool:
        """Store ``tables`` under ``key`` (replacing the site's other entries). Returns whether
        it stored (``False``: a column of a kind the cache does not keep, or the folder is not
        writable -- logged; the site then reads its file every time)."""
        entry = self._entry(key)
        table = _frame_arrays(tables.table, "t")
        test = _frame_arrays(tables.test, "h") if tables.test is not None else None
        if table is None or (tables.test is not None and test is None):
            log.info("table cache: a column of the site's table has a kind the cache does not keep; not cached")
            return False
        arrays = {**table[1], **(test[1] if test else {}), "p.train.npy": tables.parts.train,
                  "p.test.npy": tables.parts.test}
        arrays.update({f"p.fold{k}.npy": f for k, f in enumerate(tables.parts.folds)})
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.mkdir(parents=True)
            digests = {}
            for file, value in arrays.items():
                np.save(tmp / file, np.ascontiguousarray(value), allow_pickle=False)
                digests[file] = _file_hash(tmp / file)
            manifest = {"format": FORMAT, "files": digests,
                        "table": {"rows": len(tables.table), "columns": table[0]},
                        "test": None if test is None else {"rows": len(tables.test), "columns": test[0]},
                        "parts": {"n_rows": tables.parts.n_rows, "folds": len(tables.parts.folds)}}
            (tmp / "manifest.json").write_text(json.dumps(manifest))
            shutil.rmtree(entry, ignore_errors=True)
            os.rename(tmp, entry)
        except OSError as exc:
            log.warning("table cache: cannot write %s (%s); the site's file is read every time", entry, exc)
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        for other in self.root.iterdir():  # one entry per site: the file it reads now
            if other.name != key and not other.name.startswith(".tmp-"):
                shutil.rmtree(other, ignore_errors=True)
        return True


def _check_parts(parts: "RowParts") -> None:
    n = parts.n_rows
    for name, idx in (("train", parts.train), ("test", parts.test), *((f"fold{k}", f) for k, f in enumerate(parts.folds))):
        if idx.dtype.kind not in "iu" or idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n)):
            raise ValueError(f"part {name} has indices outside the table")
    if np.intersect1d(parts.train, parts.test).size:
        raise ValueError("train and test parts overlap")
