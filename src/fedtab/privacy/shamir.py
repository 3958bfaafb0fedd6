"""Shamir secret sharing by pycryptodome (``Crypto.Protocol.SecretSharing``), in 16-byte chunks.

pycryptodome shares 16-byte secrets over GF(2^128); a longer secret (a multiple of 16
bytes) is cut into 16-byte chunks, each shared with the same ``x`` coordinates, as
Flower's SecAgg+ does. A share is ``(x, y)`` with ``x`` in ``1..n`` and ``y`` the chunks'
shares concatenated (as long as the secret). Every 16-byte string is a field element, so
a share can be wrong (forged) but never out of the field: callers check a rebuilt secret
against a commitment.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["CHUNK", "split", "combine"]

#: bytes of one chunk (pycryptodome's secret size).
CHUNK = 16


def _chunks(data: bytes) -> list[bytes]:
    if not data or len(data) % CHUNK:
        raise ValueError(f"Shamir secrets and shares are a positive multiple of {CHUNK} bytes, got {len(data)}")
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


def split(secret: bytes, n: int, t: int) -> list[tuple[int, bytes]]:
    """``n`` shares ``(x, y)`` of ``secret`` (``x = 1..n``) such that any ``t`` recover it
    and ``t - 1`` reveal nothing.

    Raises:
        ValueError: ``not 2 <= t <= n``, or a secret that is not a positive multiple of
            :data:`CHUNK` bytes.
    """
    from Crypto.Protocol.SecretSharing import Shamir  # imported by the first secure sum, not by every site process

    if not 2 <= t <= n:
        raise ValueError(f"Shamir sharing needs 2 <= t <= n, got t={t}, n={n}")
    per_chunk = [Shamir.split(t, n, c) for c in _chunks(bytes(secret))]
    return [(x, b"".join(c[j][1] for c in per_chunk)) for j, (x, _) in enumerate(per_chunk[0])]


def combine(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret from exactly ``t`` shares ``(x, y)`` with distinct ``x`` in ``1..65535``.

    Gives a wrong secret (not an error) for fewer than ``t`` or forged shares -- callers
    check the result against a commitment.

    Raises:
        ValueError: no shares, repeated or out-of-range ``x``, shares of unequal or
            invalid lengths.
    """
    from Crypto.Protocol.SecretSharing import Shamir

    xs = [int(x) for x, _ in shares]
    if not shares or len(set(xs)) != len(xs) or not all(1 <= x < 2**16 for x in xs):
        raise ValueError("Shamir shares need distinct x coordinates in 1..65535")
    ys = [_chunks(bytes(y)) for _, y in shares]
    if len({len(y) for y in ys}) != 1:
        raise ValueError("Shamir shares of one secret have equal lengths")
    return b"".join(Shamir.combine([(x, y[i]) for x, y in zip(xs, ys)]) for i in range(len(ys[0])))
