"""Output directories written all at once: check first, write to a temporary sibling, swap.

A command calls :func:`check_writable` before any work, so a typo in ``--out`` costs
nothing, and writes its files inside :func:`atomic_dir`: they go to a temporary
directory next to the target, which replaces the target only when every file is
written. A run that fails half-way leaves the previous results untouched and no
half-written set.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["OutputError", "check_writable", "atomic_dir"]


class OutputError(OSError):
    """The output directory cannot be written (message names it)."""


def check_writable(out: Path) -> None:
    """Raise :class:`OutputError` unless ``out`` can be (re)created with files in it.

    ``out`` may exist (it must then be a directory); its nearest existing ancestor must
    be a writable directory, probed by creating and removing a temporary file.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory")
    parent = out.parent.resolve()
    probe_dir = parent
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise OutputError(f"{out}: {probe_dir} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".fedtab-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise OutputError(f"cannot write to {out}: {exc.strerror or exc}") from None


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it becomes ``out`` (replacing the old one).

    On any exception the temporary directory is removed and ``out`` is left as it was.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
