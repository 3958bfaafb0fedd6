"""The analyst's side of a Flower deployment: site settings a job may give, the result carried in the run log."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_a_site_takes_only_label_split_and_selector_from_the_job():
    """A server may not choose which file a site reads nor relax its policy; the node's own keys win."""
    from fedtab.engines.site_config import with_job_settings

    node = {"name": "a", "data-path": "/site/a.csv", "selector": "mutual_info"}
    settings = json.dumps({"a": {"target": "y", "na-values": '["?"]', "selector": "lasso", "test-size": 0.3,
                                 "seed": 4}, "b": {"data-path": "/etc/passwd"}})
    got = with_job_settings(node, settings)
    assert got == {**node, "target": "y", "na-values": '["?"]', "test-size": 0.3, "seed": 4}
    assert with_job_settings(node, "") == node
    for hostile in ({"a": {"data-path": "/etc/passwd"}}, {"a": {"test_path": "/x.csv"}}, {"a": {"min-rows": 1}},
                    {"a": {"policy": "{}"}}):
        with pytest.raises(ValueError, match="site 'a' refuses job settings"):
            with_job_settings(node, json.dumps(hostile))
    with pytest.raises(ValueError, match="site-settings"):
        with_job_settings(node, "[1, 2]")
    with pytest.raises(ValueError, match="site-settings"):
        with_job_settings(node, "{not json")


def test_result_log_round_trip_and_refuses_forged_or_damaged_results(monkeypatch):
    """What a hostile site could smuggle into the ServerApp's log (via an error text it logs) is refused."""
    import base64
    import hashlib
    import zlib

    from fedtab.engines import result_log
    from fedtab.engines.result_log import CHUNK, ResultLogError, decode_result, encode_result

    result = {"election": {"selected": ["age", "sex"]}, "w": list(np.random.default_rng(0).normal(size=3000))}
    lines = encode_result(result)
    assert len(lines) > 1 and all(len(line) < CHUNK + 100 for line in lines)
    assert decode_result("INFO: starting\n" + "\n".join(lines) + "\nINFO: done\n") == result
    forged = encode_result({"election": {"selected": ["age"]}})
    with pytest.raises(ResultLogError, match="2 fedtab results"):
        decode_result("\n".join(forged + lines))
    with pytest.raises(ResultLogError, match="repeats"):
        decode_result("\n".join(lines + lines[:1]))
    with pytest.raises(ResultLogError, match="chunks"):
        decode_result("\n".join(lines[1:]))
    tampered = lines[0][:-8] + ("A" if lines[0][-8] != "A" else "B") + lines[0][-7:]
    with pytest.raises(ResultLogError, match="hash"):
        decode_result("\n".join([tampered, *lines[1:]]))
    with pytest.raises(ResultLogError, match="no fedtab result"):
        decode_result("INFO: the run failed\n")
    monkeypatch.setattr(result_log, "MAX_BYTES", 10_000)  # a zip bomb: 20 kB of JSON from a few hundred bytes
    with pytest.raises(ResultLogError, match="larger than"):
        decode_result("\n".join(encode_result({"zeros": [0] * 10_000})))
    payload = base64.b64encode(zlib.compress(b"[1, 2]")).decode()
    with pytest.raises(ResultLogError, match="not a JSON object"):
        decode_result(f"fedtab-result 1/1 {hashlib.sha256(payload.encode()).hexdigest()} {payload}")
