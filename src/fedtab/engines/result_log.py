"""A run's JSON result carried in its log: how a remote analyst gets a Flower run's result.

Flower 1.42 gives the user who submitted a run two things back from its SuperLink: the
run's status (``flwr ls``) and the ServerApp's log (``flwr log RUN --show``). The
ServerApp's final ``Context`` is not returned (the SuperLink drops its state) and the
artifact store is not part of the open-source SuperLink. So when the run config asks
for it (``result-log = true``), fedtab's ServerApp prints its JSON result into its own
log as marked lines, and the analyst's side (:mod:`fedtab.engines.flower_remote`) reads
them back from ``flwr log``:

``fedtab-result <i>/<n> <sha256 of the whole payload> <chunk>``

where the payload is the result's JSON, zlib-compressed and base64-encoded, cut into
``n`` chunks of at most :data:`CHUNK` characters. Decoding is strict: exactly one result
in the log (a second one, e.g. forged through a site's error text that the ServerApp
logged, is refused, never chosen), every chunk present once, the hash matching, the
decompressed JSON at most :data:`MAX_BYTES` and a JSON object. Only the standard library
is used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import zlib
from typing import Any, Mapping

__all__ = ["CHUNK", "MARKER", "MAX_BYTES", "ResultLogError", "decode_result", "encode_result"]

MARKER = "fedtab-result"
#: characters of payload per log line
CHUNK = 4000
#: largest decompressed result accepted (bytes of JSON)
MAX_BYTES = 256 * 2**20

_LINE = re.compile(rf"^.*?{MARKER} (\d+)/(\d+) ([0-9a-f]{{64}}) ([A-Za-z0-9+/=]+)\s*$")


class ResultLogError(ValueError):
    """The run's log holds no result, more than one, or a damaged one."""


def encode_result(result: Mapping[str, Any]) -> list[str]:
    """The log lines carrying ``result`` (JSON-able), in order."""
    payload = base64.b64encode(zlib.compress(json.dumps(result).encode(), 6)).decode()
    digest = hashlib.sha256(payload.encode()).hexdigest()
    chunks = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)] or [""]
    return [f"{MARKER} {i + 1}/{len(chunks)} {digest} {c}" for i, c in enumerate(chunks)]


def decode_result(log_text: str) -> dict[str, Any]:
    """The result that :func:`encode_result` wrote into ``log_text`` (a run's whole log).

    Lines may carry a prefix (a logger's level and time) before the marker.

    Raises:
        ResultLogError: no result, two results, a missing or repeated chunk, a hash
            mismatch, a payload larger than :data:`MAX_BYTES`, or not a JSON object.
    """
    found: dict[str, dict[int, str]] = {}
    totals: dict[str, int] = {}
    for line in log_text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        i, n, digest, chunk = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        if totals.setdefault(digest, n) != n or not 1 <= i <= n:
            raise ResultLogError(f"the run log holds an inconsistent result chunk {i}/{n}")
        if i in found.setdefault(digest, {}):
            raise ResultLogError(f"the run log repeats result chunk {i}/{n}")
        found[digest][i] = chunk
    if not found:
        raise ResultLogError("the run log holds no fedtab result (did the ServerApp run with result-log = true?)")
    if len(found) > 1:
        raise ResultLogError(f"the run log holds {len(found)} fedtab results; refusing to choose one")
    (digest, chunks), = found.items()
    if sorted(chunks) != list(range(1, totals[digest] + 1)):
        raise ResultLogError(f"the run log holds {len(chunks)} of the result's {totals[digest]} chunks")
    payload = "".join(chunks[i] for i in sorted(chunks))
    if hashlib.sha256(payload.encode()).hexdigest() != digest:
        raise ResultLogError("the result in the run log does not match its hash")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(payload, validate=True), MAX_BYTES + 1)
    except (binascii.Error, zlib.error) as exc:
        raise ResultLogError(f"the result in the run log cannot be decoded: {exc}") from None
    if len(raw) > MAX_BYTES or inflater.unconsumed_tail:
        raise ResultLogError(f"the result in the run log is larger than {MAX_BYTES} bytes")
    try:
        out = json.loads(raw)
    except ValueError as exc:
        raise ResultLogError(f"the result in the run log is not JSON: {exc}") from None
    if not isinstance(out, dict):
        raise ResultLogError("the result in the run log is not a JSON object")
    return out
