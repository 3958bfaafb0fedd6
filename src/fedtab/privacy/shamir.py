"""Shamir secret sharing over the prime field GF(2**521 - 1) — minimal, for secure aggregation.

``cryptography`` has no secret sharing, and Flower's (``flwr.common.secure_aggregation``)
cannot be imported without Flower, which :mod:`fedtab.privacy` must not need. This module
is the textbook scheme and nothing more: a random polynomial of degree ``t - 1`` with the
secret as constant term, evaluated at ``x = 1..n``; Lagrange interpolation at 0. The
randomness comes from :mod:`secrets`. Secrets are byte strings of at most 64 bytes
(the field holds 521 bits), shares are ``(x, y)`` with ``y`` serialised to
:data:`SHARE_BYTES` bytes.
"""

from __future__ import annotations

import secrets
from typing import Sequence

__all__ = ["PRIME", "SHARE_BYTES", "split", "combine", "share_to_bytes", "share_from_bytes"]

#: the Mersenne prime 2**521 - 1.
PRIME = (1 << 521) - 1
#: bytes of one serialised share value (521 bits).
SHARE_BYTES = 66


def split(secret: bytes, n: int, t: int) -> list[tuple[int, int]]:
    """``n`` shares of ``secret`` such that any ``t`` of them recover it and ``t - 1`` reveal nothing.

    Raises:
        ValueError: ``not 1 <= t <= n``, or a secret longer than 64 bytes.
    """
    if not 1 <= t <= n:
        raise ValueError(f"Shamir sharing needs 1 <= t <= n, got t={t}, n={n}")
    if len(secret) > 64:
        raise ValueError("Shamir secrets are at most 64 bytes")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def combine(shares: Sequence[tuple[int, int]], length: int = 32) -> bytes:
    """The secret (``length`` bytes) from shares ``(x, y)`` with distinct non-zero ``x``.

    Gives a wrong secret (not an error) if fewer than ``t`` or forged shares are used —
    callers check the result against a commitment.

    Raises:
        ValueError: no shares, repeated or zero ``x``.
    """
    xs = [int(x) for x, _ in shares]
    if not shares or len(set(xs)) != len(xs) or any(x % PRIME == 0 for x in xs):
        raise ValueError("Shamir shares need distinct, non-zero x coordinates")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        secret = (secret + int(yi) * num * pow(den, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * length):
        return b"\xff" * length  # not a secret of this length: cannot match any commitment
    return secret.to_bytes(length, "big")


def share_to_bytes(y: int) -> bytes:
    return int(y).to_bytes(SHARE_BYTES, "big")


def share_from_bytes(raw: bytes) -> int:
    """Raises ``ValueError`` for a value of the wrong length or outside the field."""
    if len(raw) != SHARE_BYTES:
        raise ValueError(f"a share is {SHARE_BYTES} bytes, got {len(raw)}")
    y = int.from_bytes(raw, "big")
    if y >= PRIME:
        raise ValueError("share value is outside the field")
    return y
