import struct

import numpy as np
import pytest

from fedtab.federation.protocol.messages import Message, MessageError


def test_round_trip_keeps_arrays_and_meta():
    msg = Message("ballot", {"mask": np.array([True, False]), "scores": np.arange(6.0).reshape(2, 3),
                             "names": np.array(["a", "bé"])}, {"n": np.int64(5), "names": ["a", "b"], "x": 0.5})
    back = Message.from_bytes(msg.to_bytes())
    assert back.kind == "ballot" and back.meta == {"n": 5, "names": ["a", "b"], "x": 0.5}
    np.testing.assert_array_equal(back.arrays["scores"], msg.arrays["scores"])
    assert back.arrays["mask"].dtype == bool and back.arrays["names"].tolist() == ["a", "bé"]


def test_object_arrays_and_non_json_meta_rejected():
    with pytest.raises(MessageError, match="cannot be sent"):
        Message("x", {"o": np.array([object()], dtype=object)})
    with pytest.raises(MessageError, match="only JSON"):
        Message("x", meta={"f": object()})
    with pytest.raises(MessageError, match="not finite"):
        Message("x", meta={"f": float("nan")})


def test_decoder_rejects_pickled_or_tampered_payloads():
    good = Message("x", {"a": np.arange(3)}).to_bytes()
    with pytest.raises(MessageError):
        Message.from_bytes(good[:-1])
    with pytest.raises(MessageError):
        Message.from_bytes(good + b"\x00")
    header = b'{"kind": "x", "meta": {}, "arrays": [{"name": "a", "dtype": "|O", "shape": [1], "nbytes": 8}]}'
    with pytest.raises(MessageError, match="forbidden dtype"):
        Message.from_bytes(struct.pack(">I", len(header)) + header + b"\x00" * 8)
    with pytest.raises(MessageError):
        Message.from_bytes(b"\x80\x04\x95")  # a pickle prefix is just garbage here
