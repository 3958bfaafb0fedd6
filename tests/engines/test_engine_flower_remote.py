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


FAKE_FLWR = '''#!{python}
"""A stand-in for Flower's `flwr` CLI: run / ls / log, driven by files in its FLWR_HOME."""
import json, os, sys, time
from pathlib import Path
home = Path(os.environ["FLWR_HOME"])
args = sys.argv[1:]
with open(home / "calls.log", "a") as f:
    f.write(" ".join(args) + "\\n")
if args[0] == "run":
    print(json.dumps({{"success": True, "run-id": 7}}))
elif args[0] == "ls":
    statuses = json.loads((home / "statuses.json").read_text())
    status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
    (home / "statuses.json").write_text(json.dumps(statuses))
    print(json.dumps({{"success": True, "runs": [{{"run-id": 7, "status": status}}]}}))
elif args[0] == "log" and "--stream" in args:
    time.sleep(0.05)  # the SuperLink ends the stream (here: at once, as after a dropped connection)
elif args[0] == "log":
    print((home / "run.log").read_text())
'''


def _fake_client(tmp_path, statuses, log_text):
    import sys

    from fedtab.engines.flower_remote import SuperLinkClient

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flwr").write_text(FAKE_FLWR.format(python=sys.executable))
    (bin_dir / "flwr").chmod(0o755)
    ca = tmp_path / "ca.pem"
    ca.write_text("not used by the fake")
    client = SuperLinkClient("127.0.0.1:9093", root_certificates=ca, home=tmp_path / "home", bin_dir=bin_dir)
    (client.home / "statuses.json").write_text(json.dumps(statuses))
    (client.home / "run.log").write_text(log_text)
    return client


def test_superlink_client_follows_the_run_and_reads_its_result_from_the_log(tmp_path):
    """Against a stand-in `flwr`: the stream is restarted until the run is final, then the result
    is decoded from `flwr log --show`; the run config carries result-log; the connection has the CA."""
    from fedtab.engines.result_log import encode_result

    result = {"election": {"selected": ["age"]}}
    client = _fake_client(tmp_path, ["running", "running", "finished:completed"],
                          "INFO starting\n" + "\n".join(encode_result(result)) + "\n")
    out = client.run({"min-sites": 3, "job": '{"target": "y"}'}, timeout=60, status_every=0.01)
    assert out == {**result, "run_id": 7}
    calls = (client.home / "calls.log").read_text().splitlines()
    assert calls[0].startswith("run ") and "result-log=true" in calls[0] and "job='{\"target\": \"y\"}'" in calls[0]
    assert sum(c.endswith("--stream") for c in calls) == 3 and calls[-1].endswith("--show")
    config = (client.home / "config.toml").read_text()
    assert 'address = "127.0.0.1:9093"' in config and str(tmp_path / "ca.pem") in config


@pytest.mark.parametrize("statuses, log_text, fragment", [
    (["finished:failed"], "Traceback: FederationError: site 'va' failed\n", "(?s)ended as 'finished:failed'.*site 'va' failed"),
    (["finished:completed"], "the ServerApp printed nothing\n", "completed but the run log holds no fedtab result"),
])
def test_superlink_client_reports_failed_runs_and_missing_results(tmp_path, statuses, log_text, fragment):
    from fedtab.engines.errors import RunError

    client = _fake_client(tmp_path, statuses, log_text)
    with pytest.raises(RunError, match=fragment):
        client.run({"min-sites": 1}, timeout=60, status_every=0.01)


def test_superlink_client_gives_up_after_its_timeout(tmp_path):
    from fedtab.engines.errors import RunError

    client = _fake_client(tmp_path, ["running"], "")
    with pytest.raises(RunError, match="did not finish within 1 s"):
        client.run({"min-sites": 1}, timeout=1, status_every=0.2)
