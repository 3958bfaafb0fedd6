"""Dropouts on a Flower deployment (issue 10, item 5): a SuperNode killed mid-training.

The run goes on with the others (``min-sites`` quorum), names the lost site in ``dropped``
and does not wait out the per-exchange ``timeout``: the killed node, even one killed
while pushing its reply, costs about the stragglers' grace.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.builders import classification_parts, write_site_configs

pytestmark = pytest.mark.slow


def _flower_binaries() -> bool:
    bin_dir = Path(sys.executable).parent
    return all((bin_dir / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


def _replies_sent(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("Sending: query.fedtab")
    except OSError:
        return 0


@pytest.mark.skipif(not _flower_binaries(), reason="Flower CLI binaries not installed")
def test_flower_run_survives_a_supernode_killed_mid_training(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # the SuperNode log watched below must not lag behind
    from fedtab.engines.flower_deploy import LoopbackDeployment

    _, parts = classification_parts(300, 8, 3, 2, [0.34, 0.33, 0.33], seed=1, class_sep=1.5)
    configs = write_site_configs(parts, tmp_path, first=0, selector="anova")
    # a 600 s per-exchange timeout the run must NOT wait out: the dead node gets the grace only
    run = {"steps": "training", "rounds": 2, "local-epochs": 1, "min-sites": 2, "timeout": 600}
    dep = LoopbackDeployment(configs, tmp_path / "deployment", start_timeout=90)
    result: dict = {}
    failure: list[BaseException] = []

    def go() -> None:
        try:
            result.update(dep.run(run, timeout=240))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failure.append(exc)

    try:
        dep.start()
        runner = threading.Thread(target=go, daemon=True)
        runner.start()
        # _procs also holds the `flwr supernode register` processes: pick the SuperNodes by program
        nodes = [p for p in dep._procs if any(Path(str(a)).name == "flower-supernode" for a in p.args)]
        assert len(nodes) == 3
        victim, log = nodes[2], dep.workdir / "supernode2.log"
        deadline = time.monotonic() + 180
        while _replies_sent(log) < 3 and time.monotonic() < deadline and runner.is_alive():  # hello, describe, fit 1
            time.sleep(0.1)
        assert _replies_sent(log) >= 3, f"site-2 never reached its first fit: {failure}"
        os.killpg(victim.pid, signal.SIGKILL)  # the SuperNode with its flower-superexec and flwr-clientapp
        runner.join(260)
        assert not runner.is_alive(), "the run did not finish after the SuperNode was killed"
    finally:
        dep.stop()
    assert not failure, failure
    assert result["sites"] == ["site-0", "site-1", "site-2"]
    assert list(result["dropped"]) == ["site-2"], result["participation"]
    assert result["participation"][0]["sites"] == ["site-0", "site-1", "site-2"]
    assert result["participation"][-1] == {"step": "evaluate", "sites": ["site-0", "site-1"]}
    training = result["training"]
    assert set(training["per_site"]) == {"site-0", "site-1"}
    assert training["weighted_f1"] > 0.7  # the survivors' model is a real one
