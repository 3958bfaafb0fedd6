"""Shamir secret sharing of 32-byte secrets, by pycryptodome (``Crypto.Protocol.SecretSharing``).

pycryptodome shares 16-byte secrets over GF(2^128); a 32-byte secret (a self-mask seed of
:mod:`fedtab.privacy.secagg`) is cut into two 16-byte chunks, each shared with the same
``x`` coordinates, as Flower's SecAgg+ does. A share is ``(x, y)`` with ``x`` in ``1..n``
and ``y`` the two chunks' shares concatenated (:data:`SHARE_BYTES`). Every 16-byte string
is a field element, so a share can be wrong (forged) but never out of the field: callers
check a rebuilt secret against a commitment.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["SECRET_BYTES", "SHARE_BYTES", "split", "combine"]

_CHUNK = 16
#: bytes of a secret.
SECRET_BYTES = 32
#: bytes of one share value (one 16-byte share per chunk).
SHARE_BYTES = SECRET_BYTES


def split(secret: bytes, n: int, t: int) -> list[tuple[int, bytes]]:
    """``n`` shares ``(x, y)`` of ``secret`` (``x = 1..n``) such that any ``t`` recover it
    and ``t - 1`` reveal nothing.

    Raises:
        ValueError: ``not 2 <= t <= n``, or a secret that is not :data:`SECRET_BYTES` long.
    """
    if not 2 <= t <= n:
        raise ValueError(f"Shamir sharing needs 2 <= t <= n, got t={t}, n={n}")
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"Shamir secrets are {SECRET_BYTES} bytes, got {len(secret)}")
    from Crypto.Protocol.SecretSharing import Shamir  # imported by the first secure sum, not by every site process

    chunks = [Shamir.split(t, n, secret[i:i + _CHUNK]) for i in range(0, SECRET_BYTES, _CHUNK)]
    return [(x, b"".join(c[j][1] for c in chunks)) for j, (x, _) in enumerate(chunks[0])]


def combine(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret from exactly ``t`` shares ``(x, y)`` with distinct ``x`` in ``1..65535``.

    Gives a wrong secret (not an error) for fewer than ``t`` or forged shares -- callers
    check the result against a commitment.

    Raises:
        ValueError: no shares, repeated or out-of-range ``x``, a share of the wrong length.
    """
    xs = [int(x) for x, _ in shares]
    if not shares or len(set(xs)) != len(xs) or not all(1 <= x < 2**16 for x in xs):
        raise ValueError("Shamir shares need distinct x coordinates in 1..65535")
    if any(len(y) != SHARE_BYTES for _, y in shares):
        raise ValueError(f"a Shamir share is {SHARE_BYTES} bytes")
    from Crypto.Protocol.SecretSharing import Shamir

    return b"".join(Shamir.combine([(x, bytes(y[i:i + _CHUNK])) for x, (_, y) in zip(xs, shares)])
                    for i in range(0, SECRET_BYTES, _CHUNK))
