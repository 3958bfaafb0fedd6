"""The deployment guide's loopback variant, run as written, on one real Flower deployment (issue 24, items 5-6).

``fedtab deploy`` (the guide's own line, on a free port) writes the keys and ``flwr/config.toml``
and prints every command; those commands start the SuperLink, register the keys and start the
SuperNodes (each process with setsid, its group killed in the finally). On that one
deployment: ``fedtab run`` as a separate process prints progress lines while the run goes and the
run id; ``fedtab attach`` fetches the finished run's outputs; a run past its ``--timeout`` ends
stopped on the SuperLink; a SuperNode with an unregistered key exits with status 1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.requires("flwr")]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _binaries() -> bool:
    return all((BIN / b).exists() or shutil.which(b) for b in ("flower-superlink", "flower-supernode", "flwr"))


def _guide_block(lang: str, needle: str) -> str:
    """The first ``lang`` block of docs/deployment.md that contains ``needle``."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    for m in re.finditer(rf"```{lang}[^\n]*\n(.*?)```", text, re.S):
        if needle in m.group(1):
            return m.group(1)
    raise AssertionError(f"docs/deployment.md has no {lang} block with {needle!r}")


def _printed_commands(output: str) -> list[tuple[str, list[str]]]:
    """``[(who, argv)]`` of the Flower section that ``fedtab deploy`` printed."""
    flower = output.split("NVIDIA FLARE")[0]
    return [(m.group(1), shlex.split(m.group(2))) for m in re.finditer(r"^# (.+):\n  (.+)$", flower, re.M)]


def _env(argv: list[str], work: Path) -> tuple[list[str], dict[str, str]]:
    """``argv`` without its leading ``VAR=value`` words, the program made absolute, and its environment."""
    from fedtab.engines.flower_remote import FLWR_ENV

    env = {**os.environ, **FLWR_ENV, "FLWR_HOME": str(work / "flwr_home"), "PYTHONUNBUFFERED": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT / "src")}
    while re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value.replace("$PATH", env["PATH"])  # as the shell expands PATH=<fab-guard>:$PATH
    prog = BIN / argv[0] if (BIN / argv[0]).exists() else shutil.which(argv[0])
    return [str(prog), *argv[1:]], env


def _free_port() -> int:
    from fedtab.engines.flower_deploy import free_port

    return free_port()


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """The guide's trial: its ``fedtab deploy`` line run, then every printed command; yields the
    folder, the commands and the marker every process of the deployment carries."""
    if not _binaries():
        pytest.skip("Flower CLI binaries not installed")
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.data.example_sites import write_heart_sites
    from fedtab.engines.flower_deploy import _wait_port
    from fedtab.engines.processes import spawn, stop_processes

    work = tmp_path_factory.mktemp("guide")
    write_heart_sites(work)
    (work / "job.toml").write_text(_guide_block("toml", "[sites.va]"))
    deploy = shlex.split(_guide_block("bash run", "fedtab deploy").strip())
    port = _free_port()
    deploy[deploy.index("--port") + 1] = str(port)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        res = CliRunner().invoke(app, deploy[1:], env={"COLUMNS": "400"})
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, res.output
    commands = _printed_commands(res.output)
    assert [c[0] for c in commands] == ["coordinator"] * 3 + ["site cleveland", "site va", "analyst"]
    assert "<" not in res.output.split("NVIDIA FLARE")[0].split("# coordinator")[1]  # no placeholders
    config = (work / "trial" / "flwr" / "config.toml").read_text()
    assert f'root-certificates = "{work / "trial" / "ca.pem"}"' in config  # absolute, as Flower needs
    procs, logs = [], []
    marker = f"FLWR_HOME={work / 'flwr_home'}"
    try:
        for i, (who, argv) in enumerate(commands[:-1]):
            argv, env = _env(list(argv), work)
            if "--node-config" in argv:  # each site's operator pins the job's split seed in its own node
                # config (a site's choice: without it the site draws a secret one, and the model could
                # not be compared with the local engine's)
                at = argv.index("--node-config") + 1
                argv[at] = f"{argv[at]} seed=0"
            if argv[0].endswith("flwr"):  # registration: one-shot
                done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=120,
                                      start_new_session=True)
                assert done.returncode == 0 and '"node-id"' in done.stdout, done.stdout + done.stderr
                continue
            proc, log = spawn(argv, work / f"proc{i}.log", env={**env, "FLWR_HOME": str(work / "flwr_home")},
                              cwd=work)
            procs.append(proc)
            logs.append(log)
            listen = int(argv[argv.index("--port") + 1])
            _wait_port(listen, time.monotonic() + 120, proc, work / f"proc{i}.log")
        yield {"work": work, "analyst": commands[-1][1], "port": port, "marker": marker, "env": _env(["x"], work)[1]}
    finally:
        stop_processes(procs, marker=marker)
        for log in logs:
            log.close()


def _fedtab(args: list[str], work: Path, env: dict[str, str]) -> subprocess.Popen:
    code = "from fedtab.cli import app; app()"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=work, env={**env, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _lines_while_running(proc: subprocess.Popen, result: Path, timeout: float) -> list[tuple[str, bool]]:
    """Every output line, and whether ``result`` was still absent when it arrived."""
    import threading

    out: list[tuple[str, bool]] = []
    reader = threading.Thread(target=lambda: out.extend((line.rstrip("\n"), not result.exists())
                                                        for line in proc.stdout), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    reader.join(timeout=10)
    return out


def _assert_matches_the_local_engine(result: dict, out: Path, work: Path) -> None:
    """The consortium's TLS + auth deployment (SuperNodes that know only their name and table,
    the analyst's job file naming the sites only) gives the local engine's columns and
    predictions, with sites identified by their registered keys."""
    import tomllib

    import numpy as np
    import pandas as pd

    from fedtab.job.model_file import load_model
    from fedtab.job.run import run_job

    assert result["engine"] == "flower" and result["deployment"]["identity"] == "key"
    doc = tomllib.loads((work / "job.toml").read_text())
    doc["sites"] = {name: {"path": str(work / f"{name}.csv")} for name in doc["sites"]}
    local = run_job(doc, engine="local", out=work / "local-out")
    assert result["training"]["features"] == local["training"]["features"]
    table = pd.read_csv(work / "va.csv", na_values=["?"])
    np.testing.assert_allclose(load_model(out / "model.fedtab").predict_proba(table, allow_missing=True),
                               load_model(work / "local-out" / "model.fedtab").predict_proba(table, allow_missing=True),
                               atol=1e-6, rtol=0)


def test_the_guides_trial_reports_progress_attaches_and_stops_runs(guide):
    from fedtab.engines.flower_remote import SuperLinkClient

    work, env = guide["work"], guide["env"]
    analyst = guide["analyst"]
    assert analyst[:2] == ["fedtab", "run"]
    out = work / "run-out"
    lines = _lines_while_running(_fedtab([*analyst[1:], "--timeout", "600", "--out", str(out)], work, env),
                                 out / "result.json", 600)
    text = "\n".join(line for line, _ in lines)
    assert (out / "result.json").is_file(), text
    run_id = int(re.search(r"submitted as Flower run (\d+)", text).group(1))
    rounds = [before for line, before in lines if re.search(r"training round \d/2 \(2/2 sites\)", line)]
    assert len(rounds) == 2 and all(rounds), text  # both rounds printed before the outputs existed
    assert re.search(r"2 site\(s\) joined; the job makes about 5 exchanges \(timed on its exchanges after the first\)", text), text
    # the time comes from the job's own exchanges, one line at a step's first exchange
    assert re.search(r"(schema|training): about [0-4] exchanges left × [\d.]+ s ≈", text), text
    first = json.loads((out / "result.json").read_text())
    _assert_matches_the_local_engine(first, out, work)

    # attach: the finished run's outputs, fetched again into another folder
    again = work / "attached"
    proc = _fedtab(["attach", str(run_id), "job.toml", "--superlink", f"127.0.0.1:{guide['port']}",
                    "--root-certificates", str(work / "trial" / "ca.pem"), "--out", str(again)], work, env)
    attach_out = _lines_while_running(proc, again / "result.json", 300)
    assert proc.returncode == 0, attach_out
    second = json.loads((again / "result.json").read_text())
    assert second["deployment"]["run_id"] == run_id and second["training"] == first["training"]
    assert (again / "model.fedtab").exists() and (again / "report.html").is_file()

    # a run past its --timeout is stopped on the SuperLink, not left running
    job = (work / "job.toml").read_text().replace("rounds = 2", "rounds = 500")
    (work / "long.toml").write_text(job)
    proc = _fedtab(["run", "long.toml", *analyst[3:], "--timeout", "10", "--out", str(work / "long")], work, env)
    long_out = "\n".join(line for line, _ in _lines_while_running(proc, work / "long" / "result.json", 300))
    assert proc.returncode == 2 and "stopped on the SuperLink" in long_out, long_out
    long_id = int(re.search(r"submitted as Flower run (\d+)", long_out).group(1))
    client = SuperLinkClient(f"127.0.0.1:{guide['port']}", root_certificates=work / "trial" / "ca.pem",
                             home=work / "probe")
    deadline = time.monotonic() + 60
    while not (status := client.status(long_id)).startswith("finished") and time.monotonic() < deadline:
        time.sleep(1)
    assert status == "finished:stopped", status


def test_a_supernode_with_an_unregistered_key_exits_with_status_1(guide):
    """What the guide says about exit codes, checked: not Flower's documented 305."""
    from fedtab.deploy.keys import write_site_key

    work = guide["work"]
    private, _ = write_site_key("stranger", work / "stranger")
    argv, env = _env(["flower-supernode", "--superlink", f"127.0.0.1:{guide['port']}", "--root-certificates",
                      str(work / "trial" / "ca.pem"), "--auth-supernode-private-key", str(private),
                      "--port", str(_free_port()), "--node-config", 'name="stranger" data-path="/nonexistent"'], work)
    from fedtab.engines.processes import spawn, stop_processes

    proc, log = spawn(argv, work / "stranger.log", env={**env, "FLWR_HOME": str(work / "stranger_home")}, cwd=work)
    try:
        code = proc.wait(timeout=120)  # its SuperExec child may outlive it: wait for the SuperNode alone
    finally:
        stop_processes([proc], marker=f"FLWR_HOME={work / 'stranger_home'}")
        log.close()
    assert code == 1, (work / "stranger.log").read_text()[-2000:]
