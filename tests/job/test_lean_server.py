"""The server's side of a job imports neither scikit-learn nor pandas (issue 31, a lean Flower ServerApp).

A Flower ServerApp is a fresh process on the same machines as the sites' ClientApps in a
loopback deployment: importing scikit-learn, scipy.stats and pandas there cost about a
second of CPU while the sites answered the naming hello. These tests record the sites'
replies of an in-process run, replay the server's side alone in a fresh interpreter (its
preparation, then the job's server app on a federation that answers with the recorded
replies) and check that it reaches the same result without importing them.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedtab.engines import LocalFederation
from fedtab.engines.site_config import build_site
from fedtab.job.apps import server_app
from tests.builders import write_classification_sites

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("sklearn", "pandas", "pyarrow", "torch", "scipy.stats", "scipy.optimize")

REPLAY = textwrap.dedent("""
    import json, pickle, sys
    from fedtab.engines import LocalFederation
    from fedtab.federation.protocol.messages import Message
    from fedtab.job.apps import _prepare, server_app

    recorded = pickle.loads(open(sys.argv[1], "rb").read())

    class Replay:  # a site that answers each request with its recorded reply, in order
        identity = None

        def __init__(self, name, replies):
            self.name, self.replies = name, list(replies)

        def handle(self, request):
            return Message.from_bytes(self.replies.pop(0))

    _prepare(recorded["config"])
    fed = LocalFederation([Replay(n, r) for n, r in recorded["replies"].items()], identities=False, run_id="lean")
    result = server_app(fed, recorded["config"])
    heavy = sorted(m for m in sys.modules if m in %r)
    print(json.dumps({"heavy": heavy, "left": sum(len(s.replies) for s in fed._sites.values()),
                      "features": result["election"]["selected"],
                      "coef": result["model"]["params"]["coef"]}))
""" % (HEAVY,))


@pytest.mark.parametrize("training", [{"rounds": 3}, {"rounds": 3, "model": {"name": "logistic",
                                                                             "params": {"solver": "fedavg"}}}],
                         ids=["newton", "fedavg"])
def test_the_servers_side_of_a_job_imports_no_scikit_learn_or_pandas(tmp_path, jobs, training):
    configs = write_classification_sites(tmp_path, 600, 12, 4, 2, table_seed=2, split_seed=0)
    config = jobs.config(jobs.plan(election={"freedom_degree": 0.5, "selector": {"name": "lasso", "params":
                                                                                   {"C": 0.2}}},
                                   training=training))
    sites = [build_site(c) for c in configs]
    replies: dict[str, list[bytes]] = {s.name: [] for s in sites}
    depth = [0]  # a site answers a fused request by answering its parts itself: record the outer reply only
    for site in sites:
        def record(request, answer=site.handle, name=site.name):  # noqa: ANN001, ANN202
            depth[0] += 1
            try:
                reply = answer(request)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                replies[name].append(reply.to_bytes())
            return reply
        site.handle = record
    want = server_app(LocalFederation(sites, identities=False, run_id="lean"), config)
    (tmp_path / "recorded.pkl").write_bytes(pickle.dumps({"replies": replies, "config": config}))
    out = subprocess.run([sys.executable, "-c", REPLAY, str(tmp_path / "recorded.pkl")], capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["left"] == 0  # the replayed server asked what the real one asked
    assert got["features"] == want["election"]["selected"] and len(got["features"]) >= 2
    np.testing.assert_allclose(got["coef"], want["model"]["params"]["coef"], rtol=1e-9, atol=1e-12)
    assert got["heavy"] == []
