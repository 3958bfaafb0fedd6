"""Messages exchanged between a server-side workflow and the sites.

A :class:`Message` is a ``kind`` (the protocol step, e.g. ``"ballot"``), a dict of
numpy arrays and a dict of JSON-able metadata. That is all an engine ever moves.

Wire format (:meth:`Message.to_bytes`): a 4-byte big-endian header length, a UTF-8
JSON header (kind, meta, array names, dtypes, shapes, byte lengths), then the raw
array buffers. Decoding never unpickles and rejects object dtypes, so a server
never executes what a site sends. A header of :data:`COMPRESS_AT` bytes or more (a
schema declaration's column names, the bulk of a first reply at 10,000 columns) travels
compressed: xz (LZMA, ``preset 0``: 10,000 names ``f0000…`` in 3 kB where zlib needs 22 kB),
flagged by the length field's second bit (the top bit flags zlib, still decoded); it is
inflated no further than :attr:`Limits.max_header` bytes, within :data:`XZ_MEMLIMIT` of
decoder memory.

A message of a kind in :data:`PACKED_KINDS` (declared with ``packed=True`` in
:mod:`fedtab.federation.protocol.kinds`: the kinds whose replies are bytes-bound at scale, the
ballot's scores and the column sums; not a GBDT level, sent hundreds of times per run, where
packing cost a fifth of the run's CPU) packs its arrays: an array of :data:`PACK_AT` bytes or more whose bytes compress (a sample of its first
elements, and then the whole, must lose 5 % of its bytes) travels losslessly packed (:data:`ARRAY_CODEC`): its bytes
shuffled by byte position (the 8 bytes of a float64 become 8 planes, so exponents and
zero bits sit together, as Blosc's shuffle filter does) and deflated; its spec then holds
``codec`` and the ``packed`` length next to ``nbytes``. Decoding inflates to exactly
``nbytes`` (anything more, less or trailing is refused) and un-shuffles: the decoded array is
bit for bit the one encoded. Exact counts of a site's rows (``uint8``/``uint16``, mostly
equal), sums of few-digit values and float64 scores lose 99 %, ~30 % and ~10 % of their bytes.

Decoding is bounded (:class:`Limits`, module default :data:`LIMITS`): message and
header size, JSON nesting depth, integers beyond 64 bits, non-finite floats, the
number of arrays, their rank, element count and string width. Anything outside the
limits raises :class:`MessageError` -- never ``RecursionError``, ``OverflowError``,
``KeyError`` or ``MemoryError`` -- so an engine can turn it into an error naming the
sender. The same limits apply when a :class:`Message` is built in memory.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
try:
    import lzma
except ImportError:  # a Python built without liblzma: headers go as zlib (xz headers then cannot be read)
    lzma = None  # type: ignore[assignment]
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["Message", "MessageError", "ERROR_KIND", "REFUSED_KIND", "Limits", "LIMITS", "decode_meta"]

#: ``kind`` of the reply a site sends when its handler raised.
ERROR_KIND = "error"
#: ``kind`` of the reply a site sends when its disclosure policy refuses a request.
REFUSED_KIND = "refused"

_ALLOWED_DTYPE_KINDS = set("biufU")  # bool, int, uint, float, unicode strings


class MessageError(ValueError):
    """A message is malformed or outside :class:`Limits` (bad header, unknown dtype, truncated buffer...)."""


#: element types a meta list may hold without a per-element walk (a list of 10,000 feature
#: names is checked by one ``set(map(type, ...))`` instead of 10,000 pushes).
_FLAT_TYPES = frozenset({str, int, bool, type(None)})


@dataclass(frozen=True)
class Limits:
    """Bounds every decoded (and every constructed) message must respect.

    Attributes:
        max_bytes: whole serialised message. max_header: its JSON header.
        max_depth: nesting of lists/dicts in ``meta`` (a site-state snapshot nests ~10).
        max_int: largest ``|int|`` in ``meta`` (128 bits: a generator's state needs them;
            anything near 10**309 would overflow floats downstream).
        max_arrays: arrays per message. max_ndim: rank of one array.
        max_elements: elements of one array. max_str: characters of a string dtype.
        max_unpacked: bytes all of a message's packed arrays may unpack to (checked on their
            declared sizes before any is inflated: a few kB of deflated zeros cannot make the
            server allocate gigabytes; the encoder sends arrays beyond it unpacked).
    """

    max_bytes: int = 2**31
    max_header: int = 64 * 2**20
    max_depth: int = 64
    max_int: int = 2**128
    max_arrays: int = 4096
    max_ndim: int = 8
    max_elements: int = 2**28
    max_str: int = 4096
    max_unpacked: int = 256 * 2**20


#: The limits :meth:`Message.from_bytes` and :func:`decode_meta` apply by default.
LIMITS = Limits()

#: headers of at least this many bytes travel zlib-compressed (smaller ones gain too little)
COMPRESS_AT = 16 * 2**10
#: the header length field's top bit: the header is zlib-compressed
_ZLIB_FLAG = 0x8000_0000
#: the header length field's second bit: the header is xz-compressed
_XZ_FLAG = 0x4000_0000
#: most memory an xz header's decoder may use (``preset 0`` needs about 1 MB; a hostile
#: stream asking for a larger dictionary is refused)
XZ_MEMLIMIT = 16 * 2**20
#: arrays of at least this many bytes are tried for packing (:data:`ARRAY_CODEC`)
PACK_AT = 1024
#: the message kinds whose arrays :meth:`Message.to_bytes` packs by default (filled by
#: :func:`fedtab.federation.protocol.kinds.declare` from ``MessageKind.packed``)
PACKED_KINDS: set[str] = set()
#: the one array codec: bytes shuffled by position within an element, then deflated
ARRAY_CODEC = "shuffle+zlib"
#: bytes of an array's leading elements compressed first: packing goes on only if they shrink
_PACK_SAMPLE = 8192
#: the least share of its bytes an array must lose to travel packed (float64 scores lose ~11 %)
_PACK_GAIN = 0.05
#: deflate level of packed arrays (3: within 1 % of level 6's bytes on float64 scores, a GBDT run 4 % less CPU)
_PACK_LEVEL = 3


def _check_json(value: Any, path: str, limits: Limits = LIMITS) -> None:
    """Walk ``value`` iteratively (no recursion, so depth cannot crash the walker)."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, int):
            if abs(v) > limits.max_int:
                raise MessageError(f"meta value {where} is an integer beyond 128 bits")
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise MessageError(f"meta value {where} is not finite ({v})")
            continue
        if isinstance(v, (list, tuple, dict)):
            if depth >= limits.max_depth:
                raise MessageError(f"meta is nested deeper than {limits.max_depth} levels (at {where[:80]})")
            if isinstance(v, dict):
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise MessageError(f"meta key {k!r} in {where[:80]} is not a string")
                    stack.append((item, f"{where}.{k}", depth + 1))
            else:
                types = set(map(type, v))
                if types <= _FLAT_TYPES:  # lists of names are the bulk: one pass, no per-item push
                    if int in types and (
                            (max(v) > limits.max_int or min(v) < -limits.max_int) if types <= {int, bool}
                            else any(abs(x) > limits.max_int for x in v if type(x) is int)):
                        raise MessageError(f"meta value {where[:80]} holds an integer beyond 128 bits")
                else:
                    stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(v))
            continue
        raise MessageError(f"meta value {where[:80]} has type {type(v).__name__}; only JSON types are allowed")


def _reject_constant(name: str) -> Any:
    raise MessageError(f"JSON constant {name} is not allowed")


def decode_meta(text: str | bytes, limits: Limits = LIMITS) -> Any:
    """Parse JSON from the wire within ``limits``; raises only :class:`MessageError`."""
    if len(text) > limits.max_header:
        raise MessageError(f"JSON of {len(text)} bytes exceeds the {limits.max_header}-byte limit")
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except MessageError:
        raise
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        kind = "nested too deeply" if isinstance(exc, RecursionError) else "not valid JSON"
        raise MessageError(f"message header is {kind}: {str(exc)[:200]}") from None
    _check_json(value, "header", limits)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MessageError(f"JSON number {text[:40]} is not a finite float")
    return value


def _check_array(name: str, a: np.ndarray, limits: Limits) -> None:
    if a.dtype.kind not in _ALLOWED_DTYPE_KINDS:
        raise MessageError(f"array {name!r} has dtype {a.dtype}, which cannot be sent")
    if a.ndim > limits.max_ndim:
        raise MessageError(f"array {name!r} has {a.ndim} dimensions (limit {limits.max_ndim})")
    if a.size > limits.max_elements:
        raise MessageError(f"array {name!r} has {a.size} elements (limit {limits.max_elements})")
    if a.dtype.kind == "U" and a.dtype.itemsize // 4 > limits.max_str:
        raise MessageError(f"array {name!r} holds strings of {a.dtype.itemsize // 4} characters (limit {limits.max_str})")


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
        if len(self.arrays) > LIMITS.max_arrays:
            raise MessageError(f"message has {len(self.arrays)} arrays (limit {LIMITS.max_arrays})")
        arrays = {}
        for name, arr in self.arrays.items():
            a = np.asarray(arr)
            _check_array(str(name), a, LIMITS)
            arrays[str(name)] = a
        self.arrays = arrays
        if not isinstance(self.meta, Mapping):
            raise MessageError(f"meta must be a mapping, got {type(self.meta).__name__}")
        try:
            meta = {str(k): _to_builtin(v) for k, v in self.meta.items()}
        except RecursionError:
            raise MessageError(f"meta is nested deeper than {LIMITS.max_depth} levels") from None
        _check_json(meta, "meta")
        self.meta = meta

    @property
    def is_error(self) -> bool:
        return self.kind == ERROR_KIND

    @property
    def is_refusal(self) -> bool:
        return self.kind == REFUSED_KIND

    @classmethod
    def error(cls, text: str) -> "Message":
        """The reply of a site whose handler failed."""
        return cls(ERROR_KIND, meta={"error": str(text)})

    @classmethod
    def refusal(cls, reason: str) -> "Message":
        """The reply of a site whose disclosure policy refuses the request (nothing computed)."""
        return cls(REFUSED_KIND, meta={"reason": str(reason)})

    def to_bytes(self, pack: bool | None = None) -> bytes:
        """Serialise without pickle (see module docstring); ``pack``: try packing the arrays
        (default: when the kind is in :data:`PACKED_KINDS`). Decoding reads either form."""
        specs, buffers = [], []
        # what a decoder lets packed arrays unpack to (0: nothing is packed)
        budget = LIMITS.max_unpacked if (self.kind in PACKED_KINDS if pack is None else pack) else 0
        for name, arr in self.arrays.items():
            a = np.ascontiguousarray(arr)
            spec: dict[str, Any] = {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes}
            packed = _pack(a) if 0 < a.nbytes <= budget else None
            if packed is not None:
                budget -= a.nbytes
            if packed is None:
                buffers.append(a.tobytes())
            else:
                spec.update(codec=ARRAY_CODEC, packed=len(packed))
                buffers.append(packed)
            specs.append(spec)
        header = json.dumps({"kind": self.kind, "meta": self.meta, "arrays": specs}).encode()
        flag = 0
        if len(header) >= COMPRESS_AT:
            if lzma is not None:
                packed, how = lzma.compress(header, format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE, preset=0), _XZ_FLAG
            else:
                packed, how = zlib.compress(header, 6), _ZLIB_FLAG
            if len(packed) < len(header):
                header, flag = packed, how
        return struct.pack(">I", len(header) | flag) + header + b"".join(buffers)

    @classmethod
    def from_bytes(cls, data: bytes, limits: Limits = LIMITS) -> "Message":
        """Decode :meth:`to_bytes` output within ``limits``.

        Raises:
            MessageError: anything malformed or beyond ``limits`` (and nothing else).
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MessageError(f"a message must be bytes, got {type(data).__name__}")
        if len(data) > limits.max_bytes:
            raise MessageError(f"message of {len(data)} bytes exceeds the {limits.max_bytes}-byte limit")
        header, hlen = _read_header(data, limits)
        kind, meta, specs = header.get("kind"), header.get("meta"), header.get("arrays")
        if not isinstance(kind, str) or not isinstance(meta, dict) or not isinstance(specs, list):
            raise MessageError("message header lacks kind (string), meta (object) or arrays (list)")
        if len(specs) > limits.max_arrays:
            raise MessageError(f"message has {len(specs)} arrays (limit {limits.max_arrays})")
        offset = 4 + hlen
        arrays = {}
        unpacked = 0
        for spec in specs:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise MessageError("array spec is not an object with a string name")
            name = spec["name"]
            try:
                dtype = np.dtype(spec["dtype"]) if isinstance(spec.get("dtype"), str) else None
                shape = spec["shape"]
                nbytes = spec["nbytes"]
            except (KeyError, TypeError, ValueError) as exc:
                raise MessageError(f"array spec {name[:80]!r} is not valid: {exc}") from None
            if dtype is None or dtype.kind not in _ALLOWED_DTYPE_KINDS or dtype.hasobject:
                raise MessageError(f"array {name[:80]!r} has forbidden dtype {spec.get('dtype')!r}")
            if (not isinstance(shape, list) or len(shape) > limits.max_ndim
                    or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= limits.max_elements
                               for x in shape)):
                raise MessageError(f"array {name[:80]!r} has an invalid shape")
            size = math.prod(shape)
            if size > limits.max_elements:
                raise MessageError(f"array {name[:80]!r} has {size} elements (limit {limits.max_elements})")
            if not isinstance(nbytes, int) or nbytes != size * dtype.itemsize:
                raise MessageError(f"array {name[:80]!r}: shape and byte length disagree")
            codec, wire = spec.get("codec"), nbytes
            if codec is not None:
                wire = spec.get("packed")
                if codec != ARRAY_CODEC:
                    raise MessageError(f"array {name[:80]!r} has unknown codec {str(codec)[:40]!r}")
                if not isinstance(wire, int) or isinstance(wire, bool) or wire < 0:
                    raise MessageError(f"array {name[:80]!r} has an invalid packed length")
                unpacked += nbytes
                if unpacked > limits.max_unpacked:
                    raise MessageError(f"packed arrays unpack beyond the {limits.max_unpacked}-byte limit "
                                       f"(at {name[:80]!r})")
            if offset + wire > len(data):
                raise MessageError(f"array {name[:80]!r} is truncated")
            if name in arrays:
                raise MessageError(f"array {name[:80]!r} appears twice")
            if codec is None:
                arr = np.frombuffer(data, dtype=dtype, count=size, offset=offset).reshape(shape).copy()
            else:
                arr = _unpack(bytes(data[offset:offset + wire]), dtype, size, name).reshape(shape)
            _check_array(name, arr, limits)
            arrays[name] = arr
            offset += wire
        if offset != len(data):
            raise MessageError("message has trailing bytes")
        if not isinstance(kind, str) or not kind:
            raise MessageError("message kind must be a non-empty string")
        # the header (meta included) was checked by decode_meta and JSON decodes to builtins:
        # no second pass through __post_init__
        msg = cls.__new__(cls)
        msg.kind, msg.arrays, msg.meta = kind, arrays, meta
        return msg

    def nbytes(self) -> int:
        """Size of the serialised message in bytes (what crosses the wire)."""
        return len(self.to_bytes())


def _inflate(packed: bytes, limit: int) -> bytes:
    """A zlib-compressed header, inflated to at most ``limit`` bytes (a bomb stops there).

    Raises:
        MessageError: not one complete zlib stream, or more than ``limit`` bytes inflated.
    """
    z = zlib.decompressobj()
    try:
        out = z.decompress(packed, limit + 1)
    except zlib.error:
        raise MessageError("message header is not a valid zlib stream") from None
    if len(out) > limit or z.unconsumed_tail:
        raise MessageError(f"message header inflates beyond the {limit}-byte limit")
    if not z.eof or z.unused_data:
        raise MessageError("message header is a truncated zlib stream or has trailing bytes")
    return out


def _read_header(data: bytes | bytearray | memoryview, limits: Limits) -> tuple[dict[str, Any], int]:
    """The JSON header of an encoded message (inflated if compressed) and its length on the wire.

    Raises:
        MessageError: too short, a header length out of range, a bad compressed stream, not UTF-8
            or not a JSON object within ``limits``.
    """
    if len(data) < 4:
        raise MessageError("message shorter than its header length field")
    (word,) = struct.unpack(">I", data[:4])
    hlen = word & ~(_ZLIB_FLAG | _XZ_FLAG)
    if hlen > limits.max_header or 4 + hlen > len(data) or (word & _ZLIB_FLAG and word & _XZ_FLAG):
        raise MessageError("message header length is out of range")
    raw = bytes(data[4 : 4 + hlen])
    if word & _ZLIB_FLAG:
        raw = _inflate(raw, limits.max_header)
    elif word & _XZ_FLAG:
        raw = _unxz(raw, limits.max_header)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise MessageError("message header is not UTF-8") from None
    header = decode_meta(text, limits)
    if not isinstance(header, dict):
        raise MessageError("message header is not a JSON object")
    return header, hlen


def _unxz(packed: bytes, limit: int) -> bytes:
    """An xz-compressed header, decoded to at most ``limit`` bytes within :data:`XZ_MEMLIMIT`.

    Raises:
        MessageError: xz unavailable, not one complete xz stream, a decoder needing more memory,
            or more than ``limit`` bytes decoded.
    """
    if lzma is None:
        raise MessageError("message header is xz-compressed and this Python has no lzma module")
    z = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
    try:
        out = z.decompress(packed, limit + 1)
    except lzma.LZMAError as exc:
        raise MessageError(f"message header is not a valid xz stream: {str(exc)[:80]}") from None
    if len(out) > limit or (not z.eof and z.needs_input is False):
        raise MessageError(f"message header inflates beyond the {limit}-byte limit")
    if not z.eof or z.unused_data:
        raise MessageError("message header is a truncated xz stream or has trailing bytes")
    return out


def _shuffle(a: np.ndarray) -> bytes:
    """The bytes of contiguous ``a`` grouped by their position within an element (byte 0 of every
    element, then byte 1, ...)."""
    if a.dtype.itemsize == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.reshape(-1).view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()


def _pack(a: np.ndarray) -> bytes | None:
    """``a`` (contiguous) packed by :data:`ARRAY_CODEC`, or ``None`` when it is small or does not
    compress (its first :data:`_PACK_SAMPLE` bytes must shrink by :data:`_PACK_GAIN`, and the whole too)."""
    if a.nbytes < PACK_AT or a.dtype.itemsize == 0:
        return None
    flat = a.reshape(-1)
    head = flat[: max(1, _PACK_SAMPLE // a.dtype.itemsize)]
    if head.nbytes < a.nbytes and len(zlib.compress(_shuffle(head), 1)) > (1 - _PACK_GAIN) * head.nbytes:
        return None
    packed = zlib.compress(_shuffle(flat), _PACK_LEVEL)
    return packed if len(packed) <= (1 - _PACK_GAIN) * a.nbytes else None


def _unpack(packed: bytes, dtype: np.dtype, size: int, name: str) -> np.ndarray:
    """The ``(size,)`` array of ``dtype`` that :func:`_pack` packed into ``packed``.

    Raises:
        MessageError: not one complete zlib stream of exactly ``size * itemsize`` bytes.
    """
    nbytes = size * dtype.itemsize
    z = zlib.decompressobj()
    try:
        raw = z.decompress(packed, nbytes + 1)
    except zlib.error:
        raise MessageError(f"array {name[:80]!r} is not a valid packed stream") from None
    if len(raw) > nbytes or z.unconsumed_tail:
        raise MessageError(f"array {name[:80]!r} unpacks beyond its {nbytes} bytes")
    if len(raw) != nbytes or not z.eof or z.unused_data:
        raise MessageError(f"array {name[:80]!r} is a truncated packed stream or has trailing bytes")
    planes = np.frombuffer(raw, dtype=np.uint8)
    if dtype.itemsize > 1:
        planes = np.ascontiguousarray(planes.reshape(dtype.itemsize, size).T)
    return planes.view(dtype).copy() if dtype.itemsize == 1 else planes.reshape(-1).view(dtype)


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
