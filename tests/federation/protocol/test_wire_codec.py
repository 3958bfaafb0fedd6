"""Issue 31 item 4: arrays travel losslessly packed (byte shuffle + deflate) and large headers as xz;
a decoded message is bit for bit the one encoded, and a hostile packed array or header is refused
with one line naming only the sender."""

import json
import lzma
import struct
import zlib

import numpy as np
import pytest

from fedtab import LocalFederation, run_election
from fedtab.federation import Message, SiteError
from fedtab.federation.protocol.messages import ARRAY_CODEC, Limits, MessageError
from tests.builders import assert_hostile_ballot_refused, trio_sites


def _specs(raw: bytes) -> tuple[dict, int]:
    """(header, its length) of wire bytes (the header decompressed)."""
    (word,) = struct.unpack(">I", raw[:4])
    hlen = word & 0x3FFF_FFFF
    text = raw[4:4 + hlen]
    if word & 0x4000_0000:
        text = lzma.decompress(text)
    elif word & 0x8000_0000:
        text = zlib.decompress(text)
    return json.loads(text), hlen


def _rewrite(raw: bytes, name: str, spec_edit=None, payload=None) -> bytes:
    """``raw`` with array ``name``'s spec edited (``spec_edit(spec)``) and/or its wire bytes replaced,
    the header written uncompressed."""
    header, hlen = _specs(raw)
    offset, body = 4 + hlen, b""
    for spec in header["arrays"]:
        size = spec.get("packed", spec["nbytes"])
        chunk = raw[offset:offset + size]
        offset += size
        if spec["name"] == name:
            if payload is not None:
                chunk = payload
                spec["packed"] = len(payload)
            if spec_edit is not None:
                spec_edit(spec)
        body += chunk
    text = json.dumps(header).encode()
    return struct.pack(">I", len(text)) + text + body


def test_packed_arrays_decode_bit_for_bit_in_every_dtype_and_layout():
    rng = np.random.default_rng(0)
    arrays = {
        "scores": rng.gamma(1.0, 2.0, 10_000),  # float64, full mantissas: ~11 % smaller
        "counts": np.full(5_000, 24, np.uint8),  # a site's exact counts, mostly equal
        "sums": rng.integers(-50, 50, 4_000).astype(np.float64),  # sums of integer values
        "negzero": np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 5e-324] * 400),
        "mask": np.zeros(3_000, bool),
        "labels": np.array(["yes", "no"] * 300),
        "fortran": np.asfortranarray(rng.integers(0, 3, (40, 50)).astype(np.float32)),
        "bigendian": np.arange(2_000, dtype=">f8"),
        "noise": rng.integers(0, 256, 5_000).astype(np.uint8),  # incompressible: sent raw
        "small": np.arange(3.0),
        "empty": np.zeros((0, 4)),
    }
    raw = Message("x", arrays).to_bytes(pack=True)
    header, _ = _specs(raw)
    codec = {s["name"]: s.get("codec") for s in header["arrays"]}
    assert {n for n, c in codec.items() if c == ARRAY_CODEC} == {"scores", "counts", "sums", "negzero", "mask",
                                                                  "labels", "fortran", "bigendian"}
    back = Message.from_bytes(raw)
    for name, a in arrays.items():
        b = back.arrays[name]
        assert b.dtype == a.dtype and b.shape == a.shape and b.flags.writeable, name
        assert np.ascontiguousarray(b).tobytes() == np.ascontiguousarray(a).tobytes(), name  # bits, NaN and -0.0 too
    packed = {s["name"]: s.get("packed", s["nbytes"]) for s in header["arrays"]}
    assert packed["counts"] < 100 and packed["scores"] < 0.95 * 80_000 and packed["noise"] == 5_000
    assert len(raw) < 0.6 * sum(a.nbytes for a in arrays.values())


def test_a_large_header_travels_as_xz_and_a_hostile_xz_header_is_refused():
    names = [f"f{i:04d}" for i in range(10_000)]
    raw = Message("ballot", meta={"names": names}).to_bytes()
    assert struct.unpack(">I", raw[:4])[0] & 0x4000_0000 and len(raw) < 5_000  # 90 kB of names in ~3 kB
    assert Message.from_bytes(raw).meta["names"] == names
    limits = Limits(max_header=10**5)
    xz = dict(format=lzma.FORMAT_XZ, check=lzma.CHECK_NONE)
    bomb = lzma.compress(b" " * 10**7, preset=0, **xz)
    greedy = lzma.compress(b'{"kind": "x", "meta": {}, "arrays": []}', preset=9 | lzma.PRESET_EXTREME, **xz)
    good = lzma.compress(b'{"kind": "x", "meta": {}, "arrays": []}', preset=0, **xz)
    flag = 0x4000_0000
    cases = {
        "inflates beyond": struct.pack(">I", len(bomb) | flag) + bomb,
        "not a valid xz": struct.pack(">I", 16 | flag) + b"abcdefghijklmnop",
        "truncated xz": struct.pack(">I", 20 | flag) + good[:20],
        "trailing bytes": struct.pack(">I", (len(good) + 3) | flag) + good + b"abc",
        "Memory usage limit": struct.pack(">I", len(greedy) | flag) + greedy,  # a 64 MiB dictionary
        "out of range": struct.pack(">I", len(good) | flag | 0x8000_0000) + good,  # both flags
    }
    for match, data in cases.items():
        with pytest.raises(MessageError, match=match):
            Message.from_bytes(data, limits)
    assert Message.from_bytes(struct.pack(">I", len(good) | flag) + good).kind == "x"


def test_a_zlib_header_from_before_still_decodes():
    header = json.dumps({"kind": "x", "meta": {"names": ["a"] * 5_000}, "arrays": []}).encode()
    packed = zlib.compress(header)
    assert Message.from_bytes(struct.pack(">I", len(packed) | 0x8000_0000) + packed).meta["names"] == ["a"] * 5_000


def _packed_scores_message() -> bytes:
    raw = Message("x", {"scores": np.zeros(1_000), "n": np.arange(3)}).to_bytes(pack=True)
    assert _specs(raw)[0]["arrays"][0]["codec"] == ARRAY_CODEC
    return raw


@pytest.mark.parametrize("edit, payload, match", [
    (lambda s: s.update(codec="lz4"), None, "unknown codec 'lz4'"),
    (lambda s: s.update(packed=-1), None, "invalid packed length"),
    (lambda s: s.update(packed=True), None, "invalid packed length"),
    (lambda s: s.update(packed="9"), None, "invalid packed length"),
    (lambda s: s.update(packed=10**9), None, "truncated"),
    (None, zlib.compress(b"\0" * 10**6), "unpacks beyond its 8000 bytes"),  # a bomb stops at the declared size
    (None, zlib.compress(b"\0" * 7_999), "truncated packed stream"),  # one byte short
    (None, zlib.compress(b"\0" * 8_000) + b"xx", "trailing bytes"),
    (None, zlib.compress(b"\0" * 8_000)[:-4], "truncated packed stream"),
    (None, b"not zlib at all", "not a valid packed stream"),
    (lambda s: s.update(nbytes=16_000), None, "shape and byte length disagree"),
    (lambda s: s.pop("packed"), None, "invalid packed length"),
])
def test_a_hostile_packed_array_is_refused(edit, payload, match):
    data = _rewrite(_packed_scores_message(), "scores", edit, payload)
    with pytest.raises(MessageError, match=match):
        Message.from_bytes(data)


class _Wire(Message):
    """A reply whose wire bytes are ``rewrite(honest wire bytes)``."""

    rewrite = staticmethod(lambda raw: raw)

    def to_bytes(self) -> bytes:
        return self.rewrite(Message(self.kind, self.arrays, self.meta).to_bytes())


def _on_wire(rewrite):
    def tamper(reply: Message) -> Message:
        out = _Wire(reply.kind, reply.arrays, reply.meta)
        out.rewrite = rewrite
        return out
    return tamper


@pytest.mark.parametrize("tamper, match", [
    # NaN scores pack well (a constant byte pattern): decoded first, then refused by the ballot check
    (lambda r: Message(r.kind, {**r.arrays, "scores": np.full(r.arrays["scores"].size, np.nan)}, r.meta),
     "not finite"),
    # a mask of the wrong size, packed (zeros compress): the ballot's mask check still sees its size
    (lambda r: Message(r.kind, {**r.arrays, "mask": np.zeros(4_096, np.uint8)}, r.meta), "2 packed bytes"),
    # one byte short of the stream its spec announces: an undecodable reply, refused naming the sender
    # (the ballot's 12 scores travel as float32: 48 bytes)
    (_on_wire(lambda raw: _rewrite(raw, "scores", lambda s: s.update(codec=ARRAY_CODEC),
                                   payload=zlib.compress(b"\0" * 48)[:-4])), "undecodable reply: .*truncated"),
    (_on_wire(lambda raw: _rewrite(raw, "scores", lambda s: s.update(codec=ARRAY_CODEC),
                                   payload=zlib.compress(b"\0" * 10**6))), "unpacks beyond its 48 bytes"),
    (_on_wire(lambda raw: _rewrite(raw, "scores", lambda s: s.update(codec="lz4"),
                                   payload=zlib.compress(b"\0" * 48))), "unknown codec"),
])
def test_a_hostile_packed_ballot_is_refused_in_one_line_naming_only_the_sender(tamper, match):
    assert_hostile_ballot_refused(tamper, match)


def test_a_packed_description_with_nan_sums_is_refused_naming_the_site():
    def nan_sums(reply: Message) -> Message:
        return Message(reply.kind, {**reply.arrays, "sum": np.full(reply.arrays["sum"].shape, np.nan)}, reply.meta)

    fed = LocalFederation(trio_sites(hostile=nan_sums, kind="set_mask", n_features=300))
    with pytest.raises(SiteError, match="site 'evil'") as exc:
        run_election(fed, 0.5, describe="train")
    assert set(exc.value.sites) == {"evil"}


def test_the_election_and_description_are_the_same_with_arrays_packed_or_raw(monkeypatch):
    from fedtab.federation.protocol import messages

    def elect():
        fed = LocalFederation(trio_sites(n_features=400))
        out = run_election(fed, 0.5, describe="train")
        return out, sum(r.bytes_up for r in fed.traffic.records)

    packed, up_packed = elect()
    monkeypatch.setattr(messages, "PACK_AT", 2**62)  # nothing packed
    raw, up_raw = elect()
    assert up_packed < up_raw
    assert packed.result.selected_names == raw.result.selected_names
    assert packed.result.votes.tobytes() == raw.result.votes.tobytes()
    assert packed.result.rank.tobytes() == raw.result.rank.tobytes()
    for key in ("count", "total", "sumsq"):
        assert getattr(packed.described, key).tobytes() == getattr(raw.described, key).tobytes()


def test_packed_arrays_cannot_unpack_beyond_the_message_limit():
    """A few kB of deflated zeros declaring gigabytes is refused on the declared sizes, before any
    inflating; the encoder itself sends what is beyond the limit unpacked."""
    from fedtab.federation.protocol import messages

    zeros = zlib.compress(b"\0" * 8_000)
    raw = _rewrite(_packed_scores_message(), "scores",
                   lambda s: s.update(shape=[2**27], nbytes=2**30), zeros)  # 1 GiB declared in 24 bytes
    with pytest.raises(MessageError, match="unpack beyond the 268435456-byte limit"):
        Message.from_bytes(raw)
    small = Limits(max_unpacked=10_000)
    two = Message("x", {"a": np.zeros(1_000), "b": np.zeros(1_000)}).to_bytes(pack=True)
    with pytest.raises(MessageError, match="unpack beyond the 10000-byte limit .*'b'"):
        Message.from_bytes(two, small)
    import dataclasses

    old = messages.LIMITS
    messages.LIMITS = dataclasses.replace(old, max_unpacked=10_000)
    try:
        raw = Message("x", {"a": np.zeros(1_000), "b": np.zeros(1_000)}).to_bytes(pack=True)
    finally:
        messages.LIMITS = old
    codecs = [s.get("codec") for s in _specs(raw)[0]["arrays"]]
    assert codecs == [ARRAY_CODEC, None]  # the second would pass the budget: sent raw
    assert Message.from_bytes(raw, small).arrays["b"].size == 1_000


def test_only_kinds_declared_packed_pack_their_arrays_by_default():
    """The ballot's scores and the column sums travel packed; a kind not declared ``packed`` (a GBDT
    level, sent hundreds of times a run) goes raw unless the caller asks, and both decode the same."""
    from fedtab.federation.protocol import kinds
    from fedtab.federation.protocol.messages import PACKED_KINDS

    assert {"ballot", "set_mask", "describe"} <= PACKED_KINDS
    assert PACKED_KINDS == {k.name for k in kinds.KINDS.values() if k.packed}
    assert not any(name.startswith("gbdt") for name in PACKED_KINDS)
    counts = {"n": np.full(4_000, 7, dtype=np.int64)}  # compresses ~99 % when packed
    for kind, packed in (("ballot", True), ("gbdt_level", False)):
        raw = Message(kind, counts).to_bytes()
        assert (len(raw) < 4_000) is packed
        np.testing.assert_array_equal(Message.from_bytes(raw).arrays["n"], counts["n"])
    assert len(Message("gbdt_level", counts).to_bytes(pack=True)) < 4_000
    assert len(Message("ballot", counts).to_bytes(pack=False)) > 32_000
