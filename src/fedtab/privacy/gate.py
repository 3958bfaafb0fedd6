"""The release gate: every reply a site sends leaves through it, default-deny.

Each handler declares what its reply releases (:class:`Releases`): the row part its
numbers are computed over, which arrays are counts of cells (and which sums were taken
over the same cells), which are per-class score histograms, aggregates over the part's
rows, model parameters or cryptographic material, and the kind of every meta value. The
gate enforces the site's policy on that declaration, after the handler and before any
masking or the wire (``Site.handle``):

* **rows behind every number** — the part must hold at least ``min_rows`` rows (and, for
  a ``per_class`` release, at least ``min_rows`` rows of every class present in it);
* **small-cell suppression** — in every declared count array, a cell counted from fewer
  than ``min_rows`` rows (but more than 0) is sent as 0 together with every sum the
  declaration ties to it (:func:`fedtab.privacy.policy.suppress_small`) — except for
  arrays the request's differential privacy noises (data-dependent suppression would
  void the guarantee);
* **histograms** — each class row of a score histogram is cut into runs of adjacent bins
  holding at least ``min_rows`` rows, and each run's count is spread evenly over its bins
  (:func:`smooth_histogram`): the server keeps its bin grid (sites still pool bin by bin)
  but learns no count of fewer than ``min_rows`` rows. A histogram that is secure-masked
  next (named in the masking request's fields, which the site checked cover every summable
  array of the reply) is left exact: the server learns only its sum over the site's verified
  peers. Whether a request *says* it is secure does not matter: only arrays actually masked
  are left exact;
* **default-deny** — an array or meta key the declaration does not name, a meta value of
  the wrong kind (a name that is not a column, a label that is not one of the site's, a
  category seen in fewer than ``min_rows`` rows), a non-finite model parameter, or a
  handler without a declaration: the reply is withheld and the server gets an error
  naming the rule;
* **error texts** — a :class:`fedtab.errors.SiteFault`, or an error fedtab's own code
  raised, sends its text with every quoted token that is not a public name and every
  decimal number replaced by ``'…'``; an exception raised inside a library (whose text
  may quote data) is reported by its type only (:func:`error_text`).

The gate has no numpy-free fast path to keep: its work is a few array comparisons per
reply. It imports nothing from the federation layer (a message is used through its
``kind``/``arrays``/``meta`` attributes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from ..errors import SiteFault

if TYPE_CHECKING:  # pragma: no cover
    from fedtab.federation.protocol.messages import Message

__all__ = ["Releases", "GateError", "COUNT", "NAMES", "LABELS", "FLAG", "NUMBER", "TEXT", "CATEGORIES", "STRUCT",
           "smooth_histogram", "error_text", "scrub", "release", "Vocabulary", "NO_ROWS", "SMOOTHED"]

# ----- kinds of meta values ------------------------------------------------------------
#: a non-negative integer (a row count, a width, a step count)
COUNT = "count"
#: a list of column names (each a column of the site or of the agreed schema)
NAMES = "names"
#: a list of class labels (each one of the site's label keys)
LABELS = "labels"
#: true / false
FLAG = "flag"
#: a finite number or null: an aggregate over the part's rows (a loss, a mean error)
NUMBER = "number"
#: a short text of fedtab's fixed vocabulary (a selector's name, an abstention reason)
TEXT = "text"
#: ``{column: [category, ...]}`` with every category seen in at least ``min_rows`` rows
CATEGORIES = "categories"
#: structured protocol data the handler vouches for (a schema declaration, masking info)
STRUCT = "struct"
_KINDS = (COUNT, NAMES, LABELS, FLAG, NUMBER, TEXT, CATEGORIES, STRUCT)
_MAX_TEXT = 300

#: ``Releases.part`` of a reply computed over no rows (an acknowledgement, key material)
NO_ROWS = None
#: reply meta flag the gate adds when it smoothed a histogram (counts spread over runs of bins)
SMOOTHED = "smoothed"


class GateError(SiteFault):
    """A reply the gate withholds (the text names the rule, never a value)."""


@dataclass(frozen=True)
class Releases:
    """What one handler's reply may release (see the module docstring).

    Attributes:
        part: the request meta key that names the row part the numbers are computed over
            (its value defaults to ``default_part``), ``"=<part>"`` for a fixed part, a
            function ``(site, request) -> part or None``, or ``None`` for a reply over no rows.
        default_part: the part when the request does not name one (``None``: no rows then).
        per_class: the release is per class (confusion matrices, class moments, score
            histograms): every class present in the part needs ``min_rows`` rows.
        cells: ``{count array: (arrays summed over the same cells, ...)}``.
        histograms: per-class score histograms ``(C, bins)`` (smoothed, see the module).
        aggregates: other arrays computed over the part's rows (sums, scores, statistics).
        model: prefix of model-parameter array names (finite values only).
        keys: cryptographic material (no data).
        meta: ``{meta key: kind}``; kinds are the module's constants, or a nested
            ``{key: kind}`` for a meta value that is itself an object.
        dp: arrays the request's differential privacy noises (``True`` = all), exempt from
            suppression under DP.
        dp_releases: Gaussian releases one reply makes under DP (an int, or a function of
            the request); the site charges them to its ledger before answering.
        dp_noise: ``{array: L2 sensitivity Δ}`` of a reply the site noises itself under the
            request's DP settings, after the handler and before this gate
            (:func:`fedtab.privacy.dp.noise_release`: an array not listed is refused); a Δ may
            be a function of the request (e.g. ``√features`` of a count release); ``None``:
            the handler noises its own release.
    """

    part: str | Callable[[Any, Any], str | None] | None = "part"
    default_part: str | None = "train"
    per_class: bool = False
    cells: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    histograms: tuple[str, ...] = ()
    aggregates: tuple[str, ...] = ()
    model: str | None = None
    keys: tuple[str, ...] = ()
    meta: Mapping[str, str] = field(default_factory=dict)
    dp: tuple[str, ...] | bool = ()
    dp_releases: int | Callable[[Any], int] = 0
    dp_noise: Mapping[str, float | Callable[[Any], float]] | None = None

    def __post_init__(self) -> None:
        def ok(kind: Any) -> bool:
            return all(map(ok, kind.values())) if isinstance(kind, Mapping) else kind in _KINDS

        bad = sorted(k for k, v in self.meta.items() if not ok(v))
        if bad:
            raise ValueError(f"release declaration: unknown meta kinds for {bad}")

    def part_of(self, request: "Message", site: Any = None) -> str | None:
        """The part the reply to ``request`` is computed over (``None``: no rows)."""
        if self.part is None:
            return None
        if callable(self.part):
            return self.part(site, request)
        if self.part.startswith("="):
            return self.part[1:]
        value = request.meta.get(self.part)
        return self.default_part if value is None else value

    def releases_under_dp(self, request: "Message") -> int:
        """How many Gaussian releases a reply to ``request`` makes under DP."""
        n = self.dp_releases(request) if callable(self.dp_releases) else self.dp_releases
        return int(n)

    def declared(self, name: str) -> bool:
        """Whether an array called ``name`` may leave."""
        if name in self.cells or name in self.histograms or name in self.aggregates or name in self.keys:
            return True
        if any(name in sums for sums in self.cells.values()):
            return True
        return self.model is not None and name.startswith(self.model)


@dataclass
class Vocabulary:
    """The public names a site's replies may carry: columns (its own and the agreed
    schema's), class labels, category counts (for :data:`CATEGORIES`), and ``extra``: the
    site's name, part and message names and every string the request itself carried."""

    columns: Callable[[], Iterable[str]]
    labels: Callable[[], Iterable[str]]
    category_count: Callable[[str, str], int] | None = None
    extra: frozenset[str] = frozenset()
    #: more words an error text may quote (the site's selector ...), computed only for an error
    more: Callable[[], Iterable[str]] | None = None
    _cache: dict[str, frozenset[str]] = field(default_factory=dict)

    def names(self) -> frozenset[str]:
        if "names" not in self._cache:
            self._cache["names"] = frozenset(map(str, self.columns()))
        return self._cache["names"]

    def label_keys(self) -> frozenset[str]:
        if "labels" not in self._cache:
            self._cache["labels"] = frozenset(map(str, self.labels()))
        return self._cache["labels"]

    def words(self) -> frozenset[str]:
        words = set(self.extra)
        for part in (self.names, self.label_keys, lambda: self.more() if self.more is not None else ()):
            try:
                words.update(map(str, part()))
            except Exception:  # noqa: BLE001 - an error text is scrubbed even when the table is unreadable
                pass
        return frozenset(words)


# ----- pure rules -----------------------------------------------------------------------
def smooth_histogram(hist: np.ndarray, min_rows: int) -> np.ndarray:
    """Each row of ``hist`` ``(C, bins)`` cut into runs of adjacent bins that hold at least
    ``min_rows`` rows (the last short run joins the one before), each run's count spread
    evenly over its bins; a row holding fewer than ``min_rows`` rows in all becomes zeros.

    Row totals are kept (up to rounding); with ``min_rows <= 1`` the histogram is unchanged.
    """
    h = np.asarray(hist, dtype=np.float64)
    if min_rows <= 1 or h.size == 0:
        return h.copy()
    out = np.zeros_like(h)
    for r in range(h.shape[0]):
        row = h[r]
        total = row.sum()
        if total < min_rows:
            continue
        runs: list[list[int]] = []
        start, acc = 0, 0.0
        for b in range(row.shape[0]):
            acc += row[b]
            if acc >= min_rows:
                runs.append([start, b + 1])
                start, acc = b + 1, 0.0
        if start < row.shape[0]:
            if runs:
                runs[-1][1] = row.shape[0]
            else:  # pragma: no cover - total >= min_rows guarantees a run
                runs.append([0, row.shape[0]])
        for a, b in runs:
            out[r, a:b] = row[a:b].sum() / (b - a)
    return out


_QUOTED = re.compile(r"'([^'\n]{0,200})'|\"([^\"\n]{0,200})\"")
_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][-+]?\d+)(?![\w.])")


def scrub(text: str, words: frozenset[str]) -> str:
    """``text`` with every quoted token outside ``words`` and every decimal number
    replaced by ``…`` (integers stay: counts, sizes and indices)."""

    def quoted(m: re.Match) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        return m.group(0) if inner in words else "'…'"

    return _FLOAT.sub("…", _QUOTED.sub(quoted, text))[:2000]


#: exception types whose text fedtab's own code composes (names, counts, the request's fields)
_OWN_TEXT = (ValueError, TypeError, KeyError, RuntimeError, LookupError)


def _raised_by_fedtab(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in a ``fedtab`` module."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("fedtab.")


def error_text(exc: BaseException, kind: str, words: frozenset[str] = frozenset()) -> str:
    """What a site sends for ``exc`` raised while answering ``kind``: the text of a
    :class:`~fedtab.errors.SiteFault`, or of a ``ValueError``-like error raised by fedtab's
    own code, scrubbed (:func:`scrub`); for anything else (a library's error, whose text may
    quote data) only the type."""
    if isinstance(exc, SiteFault) or (isinstance(exc, _OWN_TEXT) and _raised_by_fedtab(exc)):
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        return scrub(f"{type(exc).__name__}: {text}" if not isinstance(exc, SiteFault) else text, words | {kind})
    return f"{kind!r} failed at the site ({type(exc).__name__}); the site's log has the details"


def _finite(a: np.ndarray) -> bool:
    return a.dtype.kind not in "fc" or bool(np.isfinite(a).all())


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _count(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    return "is not a count" if isinstance(value, bool) or not isinstance(value, int) or value < 0 else None


def _flag(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    return None if isinstance(value, bool) else "is not true/false"


def _number(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    ok = value is None or (not isinstance(value, bool) and isinstance(value, (int, float))
                           and math.isfinite(float(value)))
    return None if ok else "is not a finite number"


def _text(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    ok = isinstance(value, str) and len(value) <= _MAX_TEXT
    return None if ok else f"is not a text of at most {_MAX_TEXT} characters"


def _names(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    if not _strings(value):
        return "is not a list of names"
    names = vocab.names()
    outside = sum(1 for v in value if v not in names and v not in vocab.extra)  # extra: what the server sent
    return f"holds {outside} name(s) that are not columns of this site or of the agreed schema" if outside else None


def _labels(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    if not _strings(value):
        return "is not a list of class labels"
    labels = vocab.label_keys()
    return "holds a value that is not one of the site's class labels" if any(v not in labels for v in value) else None


def _categories(value: Any, vocab: Vocabulary, min_rows: int) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        return "is not {column: [categories]}"
    from .policy import OTHER_CATEGORY

    names = vocab.names()
    for column, cats in value.items():
        if column not in names:
            return "names a column that is not one of the site's"
        for c in cats:
            if not isinstance(c, str):
                return "holds a category that is not a string"
            if c != OTHER_CATEGORY and vocab.category_count is not None and vocab.category_count(column, c) < min_rows:
                return f"lists a category of column {column!r} seen in fewer than min_rows={min_rows} rows"
    return None


#: a meta value's declared kind -> its check (``None``, or why the value may not leave the site);
#: ``STRUCT`` is protocol data the handler vouches for (checked by the message limits)
_META_CHECKS: dict[str, Callable[[Any, Vocabulary, int], str | None]] = {
    COUNT: _count, FLAG: _flag, NUMBER: _number, TEXT: _text, NAMES: _names, LABELS: _labels,
    CATEGORIES: _categories, STRUCT: lambda value, vocab, min_rows: None,
}


def _check_meta(key: str, kind: Any, value: Any, vocab: Vocabulary, min_rows: int) -> None:
    """Check one meta value against its declared kind (:data:`_META_CHECKS`; a mapping of kinds:
    an object of those keys, each checked in turn).

    Raises:
        GateError: ``release gate: meta 'key' <why>``.
    """
    if isinstance(kind, Mapping):
        if not isinstance(value, dict) or set(value) - set(kind):
            raise GateError(f"release gate: meta {key!r} is not an object of the declared keys")
        for k, v in value.items():
            _check_meta(f"{key}.{k}", kind[k], v, vocab, min_rows)
        return
    check = _META_CHECKS.get(kind) if isinstance(kind, str) else None
    why = check(value, vocab, min_rows) if check is not None else None
    if why is not None:
        raise GateError(f"release gate: meta {key!r} {why}")


def release(decl: Releases, reply: "Message", *, min_rows: int, under_dp: bool, vocab: Vocabulary,
            masked: frozenset[str] = frozenset()) -> "Message":
    """``reply`` as the gate lets it leave (suppressed, smoothed), or :class:`GateError`.

    Args:
        decl: the handler's declaration. reply: what the handler returned.
        min_rows: the site's floor. under_dp: the request asked for differential privacy
            (arrays in ``decl.dp`` are then not suppressed). vocab: the site's public names.
        masked: the arrays of the reply that are secure-masked next (the server learns only
            their sum over the site's verified peers): histograms among them are left exact;
            every other histogram is smoothed.

    Raises:
        GateError: an undeclared array or meta key, a value of the wrong kind, a
            non-finite model parameter.
    """
    undeclared = sorted(n for n in reply.arrays if not decl.declared(n))
    if undeclared:
        raise GateError(f"release gate: the {reply.kind!r} reply holds undeclared array(s) {undeclared[:3]}")
    extra = sorted(k for k in reply.meta if k not in decl.meta)
    if extra:
        raise GateError(f"release gate: the {reply.kind!r} reply holds undeclared meta {extra[:3]}")
    for key, value in reply.meta.items():
        _check_meta(key, decl.meta[key], value, vocab, min_rows)
    noised = set(reply.arrays) if decl.dp is True else set(decl.dp or ())
    arrays = dict(reply.arrays)
    for count_name, sums in decl.cells.items():
        if count_name not in arrays or (under_dp and count_name in noised):
            continue
        counts = np.asarray(arrays[count_name])
        small = (counts > 0) & (counts < min_rows)
        if not small.any():
            continue
        arrays[count_name] = np.where(small, 0, counts).astype(counts.dtype)
        for s in sums:
            if s in arrays and not (under_dp and s in noised):
                a = np.asarray(arrays[s])
                if a.shape != counts.shape:
                    raise GateError(f"release gate: {s!r} does not have the shape of its counts {count_name!r}")
                arrays[s] = np.where(small, 0, a).astype(a.dtype)
    meta = reply.meta
    for name in decl.histograms:
        if name in arrays and name not in masked and not (under_dp and name in noised):
            smoothed = smooth_histogram(arrays[name], min_rows)
            if not np.array_equal(smoothed, arrays[name]):
                meta = {**meta, SMOOTHED: True}  # the server's ranking error bounds no longer hold
            arrays[name] = smoothed
    if decl.model is not None:
        for name, a in arrays.items():
            if name.startswith(decl.model) and not _finite(np.asarray(a)):
                raise GateError(f"release gate: model parameter {name!r} is not finite")
    if meta is reply.meta and all(arrays[k] is reply.arrays[k] for k in arrays):
        return reply
    return type(reply)(reply.kind, arrays, meta)
