"""Messages exchanged between a server-side workflow and the sites.

A :class:`Message` is a ``kind`` (the protocol step, e.g. ``"ballot"``), a dict of
numpy arrays and a dict of JSON-able metadata. That is all an engine ever moves.

Wire format (:meth:`Message.to_bytes`): a 4-byte big-endian header length, a UTF-8
JSON header (kind, meta, array names, dtypes, shapes, byte lengths), then the raw
array buffers. Decoding never unpickles and rejects object dtypes, so a server
never executes what a site sends.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["Message", "MessageError", "ERROR_KIND"]

#: ``kind`` of the reply a site sends when its handler raised.
ERROR_KIND = "error"

_ALLOWED_DTYPE_KINDS = set("biufU")  # bool, int, uint, float, unicode strings
_MAX_HEADER = 64 * 1024 * 1024


class MessageError(ValueError):
    """A message is malformed (bad header, unknown dtype, truncated buffer...)."""


#: element types a meta list may hold without a per-element walk (a list of 10,000 feature
#: names is checked by one ``set(map(type, ...))`` instead of 10,000 recursive calls).
_FLAT_TYPES = frozenset({str, int, bool, type(None)})


def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if type(value) in (list, tuple) and set(map(type, value)) <= _FLAT_TYPES:
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MessageError(f"meta value {path} is not finite ({value})")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise MessageError(f"meta key {k!r} in {path} is not a string")
            _check_json(v, f"{path}.{k}")
        return
    raise MessageError(f"meta value {path} has type {type(value).__name__}; only JSON types are allowed")


@dataclass
class Message:
    """One request or reply.

    Attributes:
        kind: the protocol step this message belongs to (``"ballot"``, ``"fit"`` ...),
            or :data:`ERROR_KIND` for a site's error reply.
        arrays: named numpy arrays (numeric, bool or unicode; never object).
        meta: JSON-able scalars, lists and dicts (no NaN/inf floats).
    """

    kind: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise MessageError("message kind must be a non-empty string")
        arrays = {}
        for name, arr in self.arrays.items():
            a = np.asarray(arr)
            if a.dtype.kind not in _ALLOWED_DTYPE_KINDS:
                raise MessageError(f"array {name!r} has dtype {a.dtype}, which cannot be sent")
            arrays[str(name)] = a
        self.arrays = arrays
        meta = {str(k): _to_builtin(v) for k, v in self.meta.items()}
        _check_json(meta, "meta")
        self.meta = meta

    @property
    def is_error(self) -> bool:
        return self.kind == ERROR_KIND

    @classmethod
    def error(cls, text: str) -> "Message":
        """The reply of a site whose handler failed."""
        return cls(ERROR_KIND, meta={"error": str(text)})

    def to_bytes(self) -> bytes:
        """Serialise without pickle (see module docstring)."""
        specs, buffers = [], []
        for name, arr in self.arrays.items():
            a = np.ascontiguousarray(arr)
            raw = a.tobytes()
            specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": len(raw)})
            buffers.append(raw)
        header = json.dumps({"kind": self.kind, "meta": self.meta, "arrays": specs}).encode()
        return struct.pack(">I", len(header)) + header + b"".join(buffers)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Message":
        """Decode :meth:`to_bytes` output; raises :class:`MessageError` on anything malformed."""
        if len(data) < 4:
            raise MessageError("message shorter than its header length field")
        (hlen,) = struct.unpack(">I", data[:4])
        if hlen > _MAX_HEADER or 4 + hlen > len(data):
            raise MessageError("message header length is out of range")
        try:
            header = json.loads(data[4 : 4 + hlen].decode())
            kind, meta, specs = header["kind"], header["meta"], header["arrays"]
        except (ValueError, KeyError, TypeError) as exc:
            raise MessageError(f"message header is not valid: {exc}") from None
        offset = 4 + hlen
        arrays = {}
        for spec in specs:
            try:
                dtype = np.dtype(spec["dtype"])
                shape = tuple(int(s) for s in spec["shape"])
                nbytes = int(spec["nbytes"])
            except (KeyError, TypeError, ValueError) as exc:
                raise MessageError(f"array spec is not valid: {exc}") from None
            if dtype.kind not in _ALLOWED_DTYPE_KINDS:
                raise MessageError(f"array {spec.get('name')!r} has forbidden dtype {dtype}")
            if any(s < 0 for s in shape) or nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                raise MessageError(f"array {spec.get('name')!r}: shape and byte length disagree")
            if offset + nbytes > len(data):
                raise MessageError(f"array {spec.get('name')!r} is truncated")
            arrays[str(spec.get("name"))] = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)),
                                                 offset=offset).reshape(shape).copy()
            offset += nbytes
        if offset != len(data):
            raise MessageError("message has trailing bytes")
        if not isinstance(kind, str) or not kind:
            raise MessageError("message kind must be a non-empty string")
        if not isinstance(meta, dict):
            raise MessageError("message meta must be a JSON object")
        _check_json(meta, "meta")  # JSON decodes to builtins already: no _to_builtin pass
        msg = cls.__new__(cls)
        msg.kind, msg.arrays, msg.meta = kind, arrays, meta
        return msg

    def nbytes(self) -> int:
        """Size of the serialised message in bytes (what crosses the wire)."""
        return len(self.to_bytes())


def _to_builtin(value: Any) -> Any:
    """numpy scalars/arrays in meta become Python builtins so they stay JSON-able."""
    if type(value) in (list, tuple) and set(map(type, value)) <= _FLAT_TYPES:
        return list(value)  # the common case (names, labels): no per-element recursion
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _to_builtin(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_builtin(v) for v in value]
    return value
