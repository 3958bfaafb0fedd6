"""Hostile sites: an honest :class:`~fedtab.federation.site.core.Site` whose replies are rewritten.

A :class:`HostileSite` answers every request with the honest handler first, then, for
the protocol step it attacks, rewrites the reply. The rewritten reply still crosses the
wire like any other (an engine serialises it with :meth:`Message.to_bytes`), so the
server-side decoder, validators and reducers see exactly what a malicious site could
send. Attacks that a well-behaved :class:`Message` cannot even hold (meta nested
thousands deep) are produced at the byte level by a reply whose ``to_bytes`` writes
them.

Steps (:data:`STEPS`, each a set of message kinds): ``ballot`` (election ballots),
``describe`` (feature moments for standardisation), ``fit`` (FedAvg updates),
``evaluate`` (confusion matrices), ``impute_stats`` (imputation schema counts/sums and
sufficient statistics), ``impute_fit`` (GNN weights; the training rows it claims are
sent in ``impute_setup``), ``score_sums`` (the pooled score test's sums),
``class_moments`` (the pooled ANOVA's per-class moments); ``training`` and
``imputation`` attack every step of that workflow.

Attacks: *garbage* (:data:`GARBAGE`) — ``scaled`` (float arrays ×10⁶), ``negated``,
``nan`` (every number NaN), ``deep_meta`` (a meta value nested 5,000 deep),
``huge_shape`` (every array stretched to ~10⁶ entries), ``huge_count`` (every integer
in the meta becomes 10⁴⁰⁰), ``overflow`` (every float array of sums, not counts,
rescaled so its largest entry is 10²⁵⁰: sums whose squares overflow float64); *poison* (:data:`POISON`,
consistent-looking) — ``rows`` (claims 10⁶× its rows, every count and sum scaled
alike), ``reversed`` (scores and masks inverted, parameters negated, a perfect
confusion matrix, correlations of every other column mirrored), ``rows_reversed``
(both); *malformed class moments* (:data:`MALFORMED_CLASS_MOMENTS`, the pooled ANOVA's
reply only) — fractional or negative counts, counts beyond their class's rows, class
rows that do not sum to the declared rows, an undeclared class or feature, mis-shaped
arrays, a negative sum of squares, sums its counts cannot produce.

Careless users' files (:func:`hostile_model_files`, :func:`hostile_job_files`): a valid
``model.fedtab`` rewritten into corrupted, nested, oversized variants, and job files that
write outside their folder or nest too deep; each must give a one-line error.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.schema import DECLARED
from fedtab.federation.site.core import Site

__all__ = ["ATTACKS", "GARBAGE", "JOB_FILE_ATTACKS", "MALFORMED_CLASS_MOMENTS", "MODEL_FILE_ATTACKS", "OVERFLOW",
           "POISON", "STEPS", "HostileSite", "corrupt", "hostile_job_files", "hostile_model_files"]

STEPS: dict[str, frozenset[str]] = {
    "ballot": frozenset({"ballot"}),
    "describe": frozenset({"describe"}),
    "fit": frozenset({"fit", "newton"}),  # a logistic model trains by Newton–Raphson by default
    "evaluate": frozenset({"evaluate"}),
    "impute_stats": frozenset({"impute_schema", "impute_stats"}),
    "impute_fit": frozenset({"impute_fit", "impute_setup"}),
    "score_sums": frozenset({"score_sums"}),
    "class_moments": frozenset({"class_moments"}),
}
#: every step of a workflow at once (what a real attacker would do; used by the benchmark).
STEPS["training"] = STEPS["ballot"] | STEPS["describe"] | STEPS["fit"] | STEPS["evaluate"]
STEPS["imputation"] = STEPS["impute_stats"] | STEPS["impute_fit"]
GARBAGE = ("scaled", "negated", "nan", "deep_meta", "huge_shape", "huge_count", "overflow")
POISON = ("rows", "reversed", "rows_reversed")
MALFORMED_CLASS_MOMENTS = ("fractional_counts", "negative_counts", "counts_beyond_class_rows", "class_rows_mismatch",
                           "undeclared_class", "undeclared_feature", "wrong_shape", "negative_sumsq",
                           "impossible_moments")
ATTACKS = GARBAGE + POISON + MALFORMED_CLASS_MOMENTS
#: the broken variants :func:`hostile_model_files` and :func:`hostile_job_files` write
MODEL_FILE_ATTACKS = ("corrupted_array", "corrupted_manifest", "truncated", "deep_manifest", "nested_manifest",
                      "huge_mlp", "deep_mlp", "infinite_mlp", "huge_imputer", "unknown_imputer_setting",
                      "many_dimensions", "huge_total", "many_arrays", "provenance_list", "na_values_number",
                      "schema_columns_number", "categories_number", "imputer_weights_renamed",
                      "imputer_levels_text", "imputer_groups_overlap",
                      "imputer_weight_reshaped")
JOB_FILE_ATTACKS = ("out_parent", "out_absolute", "out_through_link", "deep_toml", "nested_toml", "not_toml",
                    "not_utf8")
#: the largest entry of every float array under the ``overflow`` attack (its square overflows float64)
OVERFLOW = 1e250

#: arrays that count rows (kept by the ``overflow`` attack, which forges sums)
_COUNTS = frozenset({"count", "pair_count", "n_class", "confusion", "score_hist", "val_count", "param:count"})
#: how many times the rows a poisoning site claims.
ROWS_FACTOR = 10**6
_DEPTH = 5000
_HUGE = 1_000_000

#: per message kind: (arrays, meta keys) that count or sum rows, scaled by a row-count lie.
_ROW_CLAIMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ballot": ((), ("n_samples",)),
    "describe": (("count", "sum", "sumsq"), ("n_train", "n_test")),
    "fit": (("param:count", "param:sum", "param:sumsq"), ("n_samples",)),
    "newton": (("grad", "hess"), ("n_samples",)),
    "evaluate": (("confusion", "score_hist", "brier_sum"), ("n",)),
    "impute_schema": (("count", "sum", "sumsq"), ("n_train", "n_valid")),
    "impute_stats": (("count", "sum", "sumsq", "pair_count", "pair_sx", "pair_sxx", "pair_sxy"), ()),
    "impute_setup": ((), ("n_train", "n_valid")),
    "impute_fit": ((), ("n_train",)),
    "class_moments": (("count", "sum", "sumsq", "n_class"), ("n",)),
    "score_sums": (("grad", "hess", "loglik", "score", "info_diag", "info_cross"), ("n",)),
}


class _RawReply(Message):
    """A reply whose wire bytes carry meta nested :data:`_DEPTH` deep (not holdable by a Message)."""

    def to_bytes(self) -> bytes:
        honest = Message(self.kind, self.arrays, self.meta).to_bytes()
        (hlen,) = struct.unpack(">I", honest[:4])
        header = json.loads(honest[4 : 4 + hlen])
        header["meta"]["nested"] = "@@DEEP@@"
        text = json.dumps(header).replace('"@@DEEP@@"', "[" * _DEPTH + "]" * _DEPTH).encode()
        return struct.pack(">I", len(text)) + text + honest[4 + hlen :]


def _floats(arrays: dict[str, np.ndarray], fn) -> dict[str, np.ndarray]:
    return {k: (fn(v) if v.dtype.kind == "f" else v) for k, v in arrays.items()}


def _scale_claims(kind: str, msg: Message) -> Message:
    names, keys = _ROW_CLAIMS.get(kind, ((), ()))
    arrays = {k: (v.astype(np.int64 if v.dtype.kind in "iu" else v.dtype) * ROWS_FACTOR if k in names else v)
              for k, v in msg.arrays.items()}
    meta = {k: (v * ROWS_FACTOR if k in keys and isinstance(v, int) else v) for k, v in msg.meta.items()}
    return Message(msg.kind, arrays, meta)


def _reverse(kind: str, msg: Message) -> Message:
    a, meta = dict(msg.arrays), dict(msg.meta)
    if kind == "ballot":
        s = np.abs(a["scores"])
        a["scores"] = s.max(initial=0.0) - s
        from fedtab.federation.workflows.election.site import pack_mask, unpack_mask

        a["mask"] = pack_mask(~unpack_mask(a["mask"], s.size))  # the mask travels as bits: flip the real ones
    elif kind == "describe":
        a["sum"] = -a["sum"]
    elif kind in ("fit", "impute_fit"):
        prefix = "param:" if kind == "fit" else "w/"
        a = {k: (-v if k.startswith(prefix) and v.dtype.kind == "f" else v) for k, v in a.items()}
    elif kind == "newton":  # the gradient reversed: its Newton step points uphill
        a["grad"] = -a["grad"]
    elif kind == "evaluate":
        cm = a["confusion"]
        a["confusion"] = np.diag(cm.sum(axis=1)).astype(cm.dtype)
    elif kind == "impute_stats":  # every other column mirrored around the shift: means and spreads unchanged
        sign = np.where(np.arange(a["sum"].size) % 2 == 0, -1.0, 1.0)
        a["sum"] = a["sum"] * sign
        a["pair_sx"] = a["pair_sx"] * sign[:, None]
        a["pair_sxy"] = a["pair_sxy"] * np.outer(sign, sign)
    return Message(msg.kind, a, meta)


def _huge(v: np.ndarray) -> np.ndarray:
    rest = int(np.prod(v.shape[1:], dtype=np.int64)) if v.ndim > 1 else 1
    first = max(v.shape[0] if v.ndim else 1, _HUGE // max(rest, 1))
    return np.resize(v, (first, *v.shape[1:]) if v.ndim else (first,))


def _overflow(v: np.ndarray) -> np.ndarray:
    """``v`` as float64 rescaled so its largest ``|entry|`` is :data:`OVERFLOW` (all-zero arrays kept)."""
    peak = float(np.max(np.abs(v))) if v.size else 0.0
    return v.astype(np.float64) * (OVERFLOW / peak) if peak > 0 and np.isfinite(peak) else v


def _malformed(msg: Message, attack: str) -> Message:
    """A ``"class_moments"`` reply broken in one way (see :data:`MALFORMED_CLASS_MOMENTS`)."""
    a = {k: np.array(v, dtype=np.float64 if k in ("sum", "sumsq") else v.dtype) for k, v in msg.arrays.items()}
    meta = dict(msg.meta)
    count = a["count"].astype(np.float64)
    if attack == "fractional_counts":
        count[0, 0] += 0.5
        a["count"] = count
    elif attack == "negative_counts":
        count[0, 0] = -1.0
        a["count"] = count
    elif attack == "counts_beyond_class_rows":
        a["count"] = count + 1  # one more observed value than the class has rows
    elif attack == "class_rows_mismatch":
        a["n_class"] = a["n_class"] + 1
    elif attack == "undeclared_class":
        meta["classes"] = [*meta["classes"][:-1], "never-declared"]
    elif attack == "undeclared_feature":
        meta["feature_names"] = [*meta["feature_names"][:-1], "never-declared"]
    elif attack == "wrong_shape":
        a["sum"] = a["sum"][:, :-1]
    elif attack == "negative_sumsq":
        a["sumsq"][0, 0] = -1.0
    elif attack == "impossible_moments":  # a sum no values its count and sum of squares allow could give
        a["sum"][0, 0] = 10.0 * (np.sqrt(a["count"][0, 0] * a["sumsq"][0, 0]) + 1.0)
    return Message(msg.kind, a, meta)


def corrupt(reply: Message, attack: str) -> Message:
    """``reply`` rewritten by ``attack`` (one of :data:`ATTACKS`).

    Raises:
        ValueError: unknown attack.
    """
    kind = reply.kind
    if attack == "scaled":
        return Message(kind, _floats(reply.arrays, lambda v: v * 1e6), reply.meta)
    if attack == "negated":
        return Message(kind, {k: (-v if v.dtype.kind in "fi" else v) for k, v in reply.arrays.items()}, reply.meta)
    if attack == "nan":
        return Message(kind, {k: (np.full(v.shape, np.nan) if v.dtype.kind in "fiu" else v)
                              for k, v in reply.arrays.items()}, reply.meta)
    if attack == "deep_meta":
        return _RawReply(kind, reply.arrays, reply.meta)
    if attack == "huge_shape":
        return Message(kind, {k: _huge(v) for k, v in reply.arrays.items()}, reply.meta)
    if attack == "huge_count":
        return Message(kind, reply.arrays, {k: (10**400 if isinstance(v, int) and not isinstance(v, bool) else v)
                                            for k, v in reply.meta.items()})
    if attack == "overflow":  # the sums, not the counts (a count of 1e250 is refused for its own sake)
        return Message(kind, {k: (_overflow(v) if v.dtype.kind == "f" and k not in _COUNTS else v)
                              for k, v in reply.arrays.items()}, reply.meta)
    if attack in MALFORMED_CLASS_MOMENTS:
        return _malformed(reply, attack) if kind == "class_moments" else reply
    if attack == "rows":
        return _scale_claims(kind, reply)
    if attack == "reversed":
        return _reverse(kind, reply)
    if attack == "rows_reversed":
        return _scale_claims(kind, _reverse(kind, reply))
    raise ValueError(f"unknown attack {attack!r}; known: {ATTACKS}")


class HostileSite(Site):
    """A site that answers honestly, then rewrites its replies to the ``step`` it attacks.

    Args:
        name, table, target, **kwargs: as :class:`~fedtab.federation.site.core.Site`.
        step: a key of :data:`STEPS`.
        attack: one of :data:`ATTACKS`. Row-count lies (``rows``, ``rows_reversed``) are
            told consistently at every step and in the site's schema declaration (only
            ``rows_reversed``'s reversal is limited to ``step``); the other attacks touch
            only the step's own replies.

    Raises:
        ValueError: unknown step or attack, or as ``Site``.
    """

    def __init__(self, name: str, table: pd.DataFrame, target: str | None = None, *, step: str, attack: str,
                 **kwargs: Any) -> None:
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r}; known: {sorted(STEPS)}")
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; known: {ATTACKS}")
        super().__init__(name, table, target, **kwargs)
        self.step = step
        self.attack = attack

    def handle(self, request: Message) -> Message:
        from fedtab.federation.protocol.piggyback import PARTS

        reply = super().handle(request)
        if reply.is_error or PARTS in request.meta:  # a fused request's parts were each answered (and lied about) here
            return reply
        lies_about_rows = self.attack in ("rows", "rows_reversed")
        if request.kind in STEPS[self.step] and request.kind != "impute_setup":
            reply = corrupt(reply, "reversed" if self.attack == "rows_reversed" else self.attack)
            if self.attack == "rows_reversed":
                reply = _scale_claims(reply.kind, reply)
        elif lies_about_rows:  # a consistent liar claims the same rows at every step
            reply = _scale_claims(reply.kind, reply)
        if lies_about_rows and isinstance(reply.meta.get(DECLARED), dict):  # and in its schema declaration
            declared = dict(reply.meta[DECLARED])
            declared["rows"] = {p: int(n) * ROWS_FACTOR for p, n in dict(declared.get("rows", {})).items()}
            reply = Message(reply.kind, reply.arrays, {**reply.meta, DECLARED: declared})
        return reply


# ----------------------------------------------------------------------------- careless users' files
def _zip_members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def _write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _with_manifest(members: dict[str, bytes], edit) -> dict[str, bytes]:
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    return {**members, "manifest.json": json.dumps(manifest).encode()}


def _damaged(path: Path, member: str, out: Path) -> Path:
    """``path`` with a few bytes of ``member``'s compressed data overwritten (its CRC no longer holds)."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    at = start + max(info.compress_size // 2 - 4, 0)
    raw[at:at + 8] = bytes(255 - b for b in raw[at:at + 8])
    out.write_bytes(bytes(raw))
    return out


def _set_in(manifest: dict, keys: tuple[str, ...], value: Any) -> None:
    target = manifest
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value


def hostile_model_files(good: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Broken variants of the valid model file ``good`` (an ``mlp`` model with an imputer), by name.

    Each must be refused by :func:`fedtab.job.load_model` with one ``ModelFileError`` line and
    by ``fedtab predict`` with exit code 2: corrupted members, nesting past the limit (and past
    Python's recursion limit), model and imputer specs that would allocate absurd memory,
    declarations beyond the array limits, a manifest of the wrong structure, the imputer's value
    sets or one-category groups of the wrong kind.
    """
    good, out = Path(good), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    members = _zip_members(good)
    weight = next(k for k in members if k.startswith("arrays/model/"))
    files = {"corrupted_array": _damaged(good, weight, out / "corrupted_array.fedtab"),
             "corrupted_manifest": _damaged(good, "manifest.json", out / "corrupted_manifest.fedtab")}
    (out / "truncated.fedtab").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["truncated"] = out / "truncated.fedtab"
    text = members["manifest.json"].decode()
    for name, depth in (("deep_manifest", 100_000), ("nested_manifest", 100)):
        deep = text.rstrip().rstrip("}") + ', "nested": ' + "[" * depth + "]" * depth + "}"
        files[name] = _write_zip(out / f"{name}.fedtab", {**members, "manifest.json": deep.encode()})
    edits: dict[str, Any] = {
        "huge_mlp": lambda m: _set_in(m, ("model", "params", "hidden"), [10**9]),
        "deep_mlp": lambda m: _set_in(m, ("model", "params", "hidden"), [8] * 100_000),
        "infinite_mlp": lambda m: _set_in(m, ("model", "params", "hidden"), ["@@INF@@"]),
        "huge_imputer": lambda m: _set_in(m, ("imputer", "model_config", "hidden_dim"), 10**9),
        "unknown_imputer_setting": lambda m: _set_in(m, ("imputer", "model_config", "width"), 3),
        "many_dimensions": lambda m: _set_in(m, ("arrays", "standardise/mean", "shape"), [1] * 100),
        "huge_total": lambda m: m["arrays"].update({f"x{i}": {"shape": [2**26], "dtype": "<f4"} for i in range(5)}),
        "many_arrays": lambda m: m["arrays"].update({f"x{i}": {"shape": [1], "dtype": "<f4"} for i in range(5000)}),
        "provenance_list": lambda m: m.update(provenance=[1, 2]),
        "na_values_number": lambda m: _set_in(m, ("provenance", "job"), {"na_values": 5}),
        "schema_columns_number": lambda m: _set_in(m, ("schema", "columns"), 5),
        "categories_number": lambda m: _set_in(m, ("schema", "categories"), {"a": 5}),
        "imputer_weights_renamed": lambda m: _set_in(m, ("imputer", "weights"), ["nothing"]),
        "imputer_levels_text": lambda m: _set_in(m, ("imputer", "levels"), {"a": ["3", "7"]}),
        "imputer_groups_overlap": lambda m: _set_in(m, ("imputer", "groups"), [["a", "b"], ["b", "c"]]),
    }
    for name, edit in edits.items():
        broken = _with_manifest(members, edit)
        if name == "infinite_mlp":  # JSON 1e400 reads back as inf
            broken["manifest.json"] = broken["manifest.json"].replace(b'"@@INF@@"', b"1e400")
        files[name] = _write_zip(out / f"{name}.fedtab", broken)
    w = next(k for k in members if k.startswith("arrays/imputer/w/"))  # a weight of another shape, declared so
    arr = np.zeros(3, np.float32)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    key = w[len("arrays/"):-len(".npy")]
    broken = _with_manifest({**members, w: buf.getvalue()},
                            lambda m: m["arrays"].update({key: {"shape": [3], "dtype": arr.dtype.str}}))
    files["imputer_weight_reshaped"] = _write_zip(out / "imputer_weight_reshaped.fedtab", broken)
    return files


def hostile_job_files(folder: str | Path) -> dict[str, Path]:
    """Job files in ``folder`` that a careless (or hostile) author could write, by name: an ``out``
    outside the job's folder (``..``, absolute, through a symbolic link), TOML nested past the
    limit and past Python's recursion limit, bytes that are not UTF-8, text that is not TOML.
    Each must make ``fedtab run`` exit 2 with one line and write nothing."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    head = 'target = "y"\n[sites.a]\npath = "a.csv"\n'
    outside = d.parent / f"{d.name}-outside"
    try:
        (d / "link").symlink_to(outside, target_is_directory=True)
    except FileExistsError:
        pass
    texts = {
        "out_parent": head + '[run]\nout = "../escaped"\n',
        "out_absolute": head + f'[run]\nout = {json.dumps(str(outside))}\n',
        "out_through_link": head + '[run]\nout = "link/run-out"\n',
        "deep_toml": head + "selector = " + "[" * 20_000 + "]" * 20_000 + "\n",
        "nested_toml": head + "selector = " + "[" * 60 + "]" * 60 + "\n",
        "not_toml": head + "[run\n",
    }
    files = {}
    for name, text in texts.items():
        files[name] = d / f"{name}.toml"
        files[name].write_text(text)
    files["not_utf8"] = d / "not_utf8.toml"
    files["not_utf8"].write_bytes(b'target = "\xff\xfe"\n')
    return files
