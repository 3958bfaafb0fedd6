"""The report's HTML building blocks: escaping, numbers, tables that scroll, figures.

Every string that comes from the sites goes through :func:`esc`. Tables are wrapped in a
``<div class="scroll">`` (``overflow-x:auto``) so a wide table scrolls inside a 400 px
screen instead of widening the page. Figures are drawn once: :func:`figure` embeds the PNG
as a ``data:`` URI and, while :func:`collect_figures` is active, keeps its bytes so the
writer can also put it beside ``report.html`` as a file.
"""

from __future__ import annotations

import contextvars
import html
import math
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

__all__ = ["esc", "num", "bound", "nbytes", "table", "absent", "img", "figure", "collect_figures", "signed",
           "MINUS"]

#: the minus sign of a negative difference (U+2212, not a hyphen)
MINUS = "\u2212"

_FIGURES: contextvars.ContextVar[list[tuple[str, bytes]] | None] = contextvars.ContextVar("fedtab_figures",
                                                                                         default=None)


def esc(value: Any) -> str:
    """Escaped text of ``value`` (every site-derived string goes through here)."""
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 3) -> str:
    """A number as text: ints with thousands separators, floats with ``digits`` decimals,
    ``None`` / non-finite as "—", booleans as yes/no, anything else escaped."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return esc(value)
    if not math.isfinite(v):
        return "—"
    return f"{v:.{digits}f}"


def signed(value: float, digits: int = 3) -> str:
    """``+0.012`` / ``−0.034`` (a real minus sign), "±0.000" when it rounds to zero."""
    text = f"{abs(value):.{digits}f}"
    if float(text) == 0:
        return "±" + text
    return ("+" if value > 0 else MINUS) + text


def bound(value: Any) -> str:
    """An error bound: 0 as "0", tiny ones as "< 0.0001", else 4 decimals."""
    if value is None:
        return "—"
    v = float(value)
    return "0" if v == 0 else "< 0.0001" if v < 1e-4 else f"{v:.4f}"


def nbytes(n: Any) -> str:
    """A byte count as B / kB / MB / GB (powers of 1000)."""
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], row_classes: Iterable[str] | None = None,
          num_cols: Iterable[int] = (), table_id: str | None = None, text_cols: Iterable[int] = ()) -> str:
    """An HTML table in a horizontally scrolling wrapper; ``header`` is escaped, cells must
    already be HTML (escaped). ``num_cols`` are right-aligned numbers; ``text_cols`` hold
    sentences and keep a readable width on a narrow screen (the table scrolls instead)."""
    nums, texts = set(num_cols), set(text_cols)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    classes = list(row_classes) if row_classes is not None else None
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in nums else f'<td class="text">{c}</td>' if j in texts
                        else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    tid = f' id="{esc(table_id)}"' if table_id else ""
    return f'<div class="scroll"><table{tid}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def absent(what: str) -> str:
    """A one-line note that a section's data is absent."""
    return f'<p class="absent">{esc(what)}</p>'


def img(uri: str, alt: str) -> str:
    """An ``<img>`` of an inline PNG ``data:`` URI (anything else gives no image)."""
    return f'<img src="{uri}" alt="{esc(alt)}">' if uri.startswith("data:image/png;base64,") else ""


def figure(name: str, fig: Any, alt: str) -> str:
    """``fig`` as an inline ``<img>`` (closed after drawing); with :func:`collect_figures`
    active its PNG bytes are kept under ``name`` too (a file name stem: letters, digits, ``-``)."""
    import base64

    from .plots import figure_png

    png = figure_png(fig)
    found = _FIGURES.get()
    if found is not None:
        found.append((name, png))
    return img("data:image/png;base64," + base64.b64encode(png).decode("ascii"), alt)


@contextmanager
def collect_figures() -> Iterator[list[tuple[str, bytes]]]:
    """Within the block, every :func:`figure` appends ``(name, png bytes)`` to the yielded list."""
    found: list[tuple[str, bytes]] = []
    token = _FIGURES.set(found)
    try:
        yield found
    finally:
        _FIGURES.reset(token)
