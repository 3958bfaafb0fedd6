"""Fuzzing (issue 10, item 7): the wire decoder and every reply validator, property-based.

The decoder may accept or refuse any input, but only ever by returning a message or
raising ``MessageError``; a validator only ever raises ``ValueError`` (or ``SiteError``),
and what it accepts really satisfies the property it stands for.
"""

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message, MessageError, decode_meta
from fedtab.federation.protocol import SiteError
from fedtab.federation.protocol.schema import Schema, SchemaLimits, parse_declaration
from fedtab.impute.stats import site_stats

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_message() -> bytes:
    return Message("fit", {"param:w": np.arange(6.0).reshape(2, 3), "mask": np.array([True, False]),
                           "names": np.array(["a", "b"])},
                   {"n_samples": 5, "features": ["a", "b"], "nested": {"x": [1, 2.5, None]}}).to_bytes()


VALID = _valid_message()


def _decode_or_refuse(data: bytes) -> None:
    try:
        msg = Message.from_bytes(data)
    except MessageError:
        return
    assert isinstance(msg, Message)  # whatever was accepted is a well-formed message
    Message.from_bytes(msg.to_bytes())


@FAST
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_message_error(data):
    _decode_or_refuse(data)


@FAST
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(VALID)))
def test_mutated_valid_messages_decode_or_raise_message_error(flips, cut):
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    _decode_or_refuse(bytes(data))
    _decode_or_refuse(bytes(data[:cut]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)


@FAST
@given(json_values)
def test_any_json_header_meta_decodes_or_raises_message_error(meta):
    header = json.dumps({"kind": "x", "meta": {"m": meta}, "arrays": []}).encode()
    _decode_or_refuse(struct.pack(">I", len(header)) + header)


def _with_header(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


@pytest.mark.parametrize("header, match", [
    (b'{"kind": "x", "meta": {"a": ' + b"[" * 5000 + b"]" * 5000 + b'}, "arrays": []}', "nested"),
    (b'{"kind": "x", "meta": {"n": 1' + b"0" * 400 + b'}, "arrays": []}', "128 bits"),
    (b'{"kind": "x", "meta": {"n": 1e400}, "arrays": []}', "finite"),
    (b'{"kind": "x", "meta": {"n": NaN}, "arrays": []}', "not allowed"),
    (b'{"kind": "x", "meta": {}, "arrays": [{"name": "a", "dtype": "<f8", "shape": [1000000000, 1000000000], '
     b'"nbytes": 8}]}', "shape|elements"),
    (b'{"kind": "x", "meta": {}, "arrays": [{"name": "a", "dtype": "<f8", "shape": [1,1,1,1,1,1,1,1,1], '
     b'"nbytes": 8}]}', "shape"),
    (b'{"kind": "x", "meta": {}, "arrays": [{"name": "a", "dtype": "<U100000", "shape": [0], "nbytes": 0}]}',
     "characters"),
    (b'[1, 2]', "not a JSON object"),
    (b'{"kind": 3, "meta": {}, "arrays": []}', "lacks kind"),
])
def test_hostile_headers_are_message_errors_not_crashes(header, match):
    with pytest.raises(MessageError, match=match):
        Message.from_bytes(_with_header(header) + b"\x00" * 8)


def test_deep_meta_built_in_memory_is_refused_too():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(MessageError, match="nested"):
        Message("x", meta={"deep": deep})
    with pytest.raises(MessageError, match="128 bits"):
        Message("x", meta={"n": 10**400})
    with pytest.raises(MessageError):
        decode_meta("[" * 100_000)


# ----------------------------------------------------------------------------- validators
finite = st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def tables(draw, max_rows=12, max_cols=4):
    n = draw(st.integers(1, max_rows))
    f = draw(st.integers(1, max_cols))
    x = draw(hnp.arrays(np.float64, (n, f), elements=st.floats(-1e3, 1e3, allow_nan=False)))
    holes = draw(hnp.arrays(bool, (n, f)))
    x[holes] = np.nan
    return x


@FAST
@given(tables())
def test_honest_statistics_always_pass(x):
    s = site_stats(x, [f"c{i}" for i in range(x.shape[1])])
    validate.moments(s.count, s.sum, s.sumsq)
    validate.pair_statistics(s.count, s.sum, s.sumsq, s.pair_count, s.pair_sx, s.pair_sxx, s.pair_sxy)


def _implied_corr_ok(pc, sx, sxx, sxy) -> bool:
    vx = pc * sxx - sx * sx
    vy = vx.T
    cov = pc * sxy - sx * sx.T
    ok = (pc >= 2) & (vx > 1e-6 * np.maximum(pc * sxx, 1)) & (vy > 1e-6 * np.maximum(pc * sxx.T, 1))
    corr = np.where(ok, cov / np.sqrt(np.where(ok, vx * vy, 1.0)), 0.0)
    return bool(np.all(np.abs(corr) <= 1 + 1e-3))


@FAST
@given(tables(), st.sampled_from(["count", "sum", "sumsq", "pair_count", "pair_sx", "pair_sxx", "pair_sxy"]),
       st.integers(0, 15), finite)
def test_forged_statistics_are_refused_or_harmless(x, name, pos, value):
    s = site_stats(x, [f"c{i}" for i in range(x.shape[1])])
    arr = getattr(s, name)
    arr.flat[pos % arr.size] = value
    try:
        validate.pair_statistics(s.count, s.sum, s.sumsq, s.pair_count, s.pair_sx, s.pair_sxx, s.pair_sxy)
    except ValueError:
        return
    # accepted: still counts no larger than their columns and a correlation inside [-1, 1]
    assert np.all(s.pair_count <= np.minimum.outer(s.count, s.count))
    assert np.all(s.count * s.sumsq - s.sum**2 >= -1e-6 * np.maximum(np.abs(s.count * s.sumsq), 1))
    assert _implied_corr_ok(s.pair_count, s.pair_sx, s.pair_sxx, s.pair_sxy)


def test_the_issue_forgeries_are_refused():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3))
    x[:, 1] = x[:, 0] * 0.01 + rng.normal(size=50)
    s = site_stats(x, ["a", "b", "c"])
    forged = site_stats(x, ["a", "b", "c"])
    forged.pair_sxy[0, 1] = forged.pair_sxy[1, 0] = 10 * np.sqrt(forged.pair_sxx[0, 1] * forged.pair_sxx[1, 0])
    with pytest.raises(ValueError, match="correlation outside"):
        validate.pair_statistics(forged.count, forged.sum, forged.sumsq, forged.pair_count, forged.pair_sx,
                                 forged.pair_sxx, forged.pair_sxy)
    with pytest.raises(ValueError, match="negative variance"):
        validate.moments(s.count, s.sum * 1000, s.sumsq)
    with pytest.raises(ValueError, match="exceeds"):
        pc = s.pair_count.copy()
        pc[0, 1] = pc[1, 0] = 51
        validate.pair_statistics(s.count, s.sum, s.sumsq, pc, s.pair_sx, s.pair_sxx, s.pair_sxy)
    with pytest.raises(ValueError, match="more than the 40 rows"):
        validate.counts(s.count, 40)


@FAST
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                  elements=st.floats(allow_nan=True, allow_infinity=True)), st.integers(0, 50))
def test_counts_accepts_only_integers_within_the_declared_rows(values, upper):
    try:
        out = validate.counts(values, upper)
    except ValueError:
        return
    assert np.all(out >= 0) and np.all(out <= upper) and np.all(out == np.round(out))


@FAST
@given(hnp.arrays(np.int64, st.tuples(st.integers(0, 4), st.integers(0, 4)), elements=st.integers(-3, 20)),
       st.integers(0, 4), st.integers(0, 60))
def test_confusion_matrices_must_sum_to_the_declared_rows(cm, n_classes, n_rows):
    reply = Message("evaluate", {"confusion": cm})
    try:
        out = validate.confusion_matrix(reply, n_classes, n_rows)
    except ValueError:
        return
    assert out.shape == (n_classes, n_classes) and out.sum() == n_rows and (out >= 0).all()


@FAST
@given(st.dictionaries(st.sampled_from(["w", "b", "x"]),
                       hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=3),
                                  elements=st.floats(allow_nan=True, allow_infinity=True, width=64)),
                       max_size=3))
def test_parameters_match_the_template_and_are_plausible(arrays):
    template = {"w": (2, 3), "b": (3,)}
    try:
        out = validate.parameters(arrays, template, max_abs=1e6)
    except ValueError:
        return
    assert {k: v.shape for k, v in out.items()} == template
    assert all(np.isfinite(v).all() and np.abs(v).max(initial=0) <= 1e6 for v in out.values())


@FAST
@given(st.dictionaries(st.sampled_from(["columns", "kinds", "target", "classes", "rows"]), json_values, max_size=5),
       st.one_of(st.none(), st.fixed_dictionaries({"train": st.integers(-2, 9), "test": st.integers(-2, 9),
                                                    "all": st.integers(-2, 18)})))
def test_any_declaration_parses_or_raises_value_error(meta, rows):
    if rows is not None:
        meta = {**meta, "columns": ["a", "b"], "rows": rows}
    try:
        d = parse_declaration(meta, SchemaLimits(max_columns=10))
    except ValueError:
        return
    assert len(set(d.columns)) == len(d.columns) <= 10
    assert d.rows["train"] + d.rows["test"] == d.rows["all"] > 0


@FAST
@given(json_values)
def test_check_features_accepts_only_declared_unique_names(names):
    d = parse_declaration({"columns": ["a", "b", "c"], "rows": {"train": 4, "test": 1, "all": 5}})
    schema = Schema.from_declarations({"s": d})
    try:
        out = schema.check_features("s", names)
    except SiteError as exc:
        assert set(exc.sites) == {"s"}
        return
    assert set(out) <= {"a", "b", "c"} and len(set(out)) == len(out)


# ----------------------------------------------------------------------------- whole workflows
def _small_sites():
    from tests.builders import classification_parts, make_sites

    _, parts = classification_parts(150, 5, 3, 1, [0.4, 0.3, 0.3], seed=4, split_seed=0, class_sep=1.5)
    # small on purpose (fast fuzzing): 8-12 test rows per site answer only under an explicit policy
    return make_sites(parts, selector="anova", policy={"min_rows": 5})


SMALL = _small_sites()


def _mutate(reply, data):
    arrays, meta = dict(reply.arrays), dict(reply.meta)
    if arrays and data.draw(st.booleans()):
        name = data.draw(st.sampled_from(sorted(arrays)))
        a = arrays[name]
        how = data.draw(st.sampled_from(["scale", "nan", "shape", "text", "negate"]))
        if how == "scale":
            arrays[name] = a * data.draw(st.sampled_from([1e6, 1e300, -3.0, 0.0]))
        elif how == "nan" and a.dtype.kind == "f" and a.size:
            a = a.copy()
            a.flat[0] = np.nan
            arrays[name] = a
        elif how == "shape":
            arrays[name] = a.reshape(-1)[:-1] if a.size else np.zeros(3)
        elif how == "text":
            arrays[name] = a.astype(str)
        else:
            arrays[name] = -a if a.dtype != bool else ~a
    else:
        keys = sorted(k for k in meta if not k.startswith("schema:")) or ["x"]
        meta[data.draw(st.sampled_from(keys))] = data.draw(json_values)
    return Message(reply.kind, arrays, meta)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["ballot", "set_mask", "fit", "evaluate"]), st.data())
def test_a_mutated_reply_anywhere_in_a_run_is_refused_naming_only_its_sender(kind, data):
    """Election + training with one site's reply of ``kind`` mutated: either the run completes or
    it stops with a ``SiteError`` naming that site and no other; never another exception."""
    from fedtab import LocalFederation, Site, run_election, run_training

    class Mutating(Site):
        def handle(self, request):
            reply = super().handle(request)
            return _mutate(reply, data) if request.kind == kind and not reply.is_error else reply

    base = SMALL[2]
    evil = Mutating("evil", base.table, "target", selector="anova")
    fed = LocalFederation([SMALL[0], SMALL[1], evil])
    for s in SMALL[:2]:
        s.state.clear()
    try:
        el = run_election(fed, 0.5, describe="train")
        run_training(fed, el.result.selected_names, rounds=1, local_epochs=1, described=el.described)
    except SiteError as exc:
        assert set(exc.sites) == {"evil"}, exc
        assert "'s0'" not in str(exc) and "'s1'" not in str(exc)
