"""A loopback deployment's processes do not outlive their owner (the known problem
"LoopbackDeployment processes outlive a killed test"): a :class:`ProcessOwner` whose process
is killed (SIGKILL: no ``finally``, no ``atexit``) or exits without ``stop()`` leaves nothing
running. Linux only (``/proc``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedtab.engines.processes import processes_with_env, start_reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

ROOT = Path(__file__).resolve().parents[2]

#: an owner process: starts a long sleep (own session, marker in its environment) through a
#: ProcessOwner, prints its pid, then dies as ``sys.argv[2]`` says
OWNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from pathlib import Path
    from fedtab.engines.processes import ProcessOwner

    class Owner(ProcessOwner):
        marker = sys.argv[1]

        def start(self):
            name, value = self.marker.split("=", 1)
            env = {**os.environ, name: value}
            self._spawn_logged([sys.executable, "-c", "import time; time.sleep(600)"], Path(sys.argv[3]),
                               env=env, cwd=".")
            return self

    owner = Owner().start()
    print(owner._procs[0].pid, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    # "exit": leave without stop(); atexit stops it
""")


def _gone(marker: str, timeout: float = 30.0) -> set[int]:
    """Marker holders still alive after waiting (bounded) for them to go."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_processes_do_not_outlive_their_owner(tmp_path, how):
    marker = f"FEDTAB_TEST_OWNER={tmp_path}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.run([sys.executable, "-c", OWNER, marker, how, str(tmp_path / "child.log")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert owner.stdout.split()[0].isdigit(), owner.stderr  # the child was started
    assert owner.returncode == (-signal.SIGKILL if how == "kill" else 0), owner.stderr
    try:
        assert not _gone(marker), f"{how}: the owner's processes outlived it"
    finally:
        for pid in processes_with_env(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_reaper_is_not_its_own_target(tmp_path):
    marker = f"FEDTAB_TEST_OWNER={tmp_path}"
    name, value = marker.split("=", 1)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               env={**os.environ, name: value}, start_new_session=True)
    reaper = start_reaper(marker)  # the owner is this (live) process
    try:
        assert reaper.poll() is None and sleeper.poll() is None
        assert processes_with_env(marker) == {sleeper.pid}  # the reaper is not its own target
    finally:
        reaper.kill()
        reaper.wait()
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(ValueError, match="NAME=value"):
        start_reaper("no-equals-sign")
