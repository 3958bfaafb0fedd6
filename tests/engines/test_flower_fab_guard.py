"""A Flower SuperNode runs only the FAB its site pinned (issue 28: the server builds the FAB).

A curious server could submit a FAB whose ``clientapp`` is its own code. Flower 1.42's
``--trusted-entities`` checks only Flower Hub signatures, so fedtab pins the FAB in the site's own
``flwr-clientapp`` (:mod:`fedtab.engines.flower_guard`). Tested on real Flower processes: two
SuperNodes, one started with the guard first on its ``PATH``, receive a hostile FAB; the unguarded
one runs it (the attack is real), the guarded one refuses it before installing it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

flower = pytest.importorskip("fedtab.engines.flower")
from fedtab.engines import flower_guard  # noqa: E402

BIN = Path(sys.executable).parent

#: a Flower app whose ClientApp is not fedtab's: it writes a file at the site (any code could run there)
HOSTILE_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hostile"
version = "0.1.0"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "curious"

[tool.flwr.app.components]
serverapp = "hostile_app:server"
clientapp = "hostile_app:client"

[tool.flwr.app.config]
min-sites = 2
result-path = ""
"""

HOSTILE_APP = '''
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

client = ClientApp()
server = ServerApp()


@client.query()
def ran(message, context):
    Path(str(context.node_config["marker"])).write_text("the server's code ran at this site")
    return Message(RecordDict({"r": ConfigRecord({"ran": True})}), reply_to=message)


@server.main()
def main(grid, context):
    need = int(context.run_config["min-sites"])
    deadline = time.monotonic() + 60
    nodes = list(grid.get_node_ids())
    while len(nodes) < need and time.monotonic() < deadline:
        time.sleep(0.2)
        nodes = list(grid.get_node_ids())
    msgs = [Message(RecordDict({"q": ConfigRecord({"x": 1})}), dst_node_id=n, message_type="query") for n in nodes]
    replies = grid.send_and_receive(msgs, timeout=45)
    out = {str(r.metadata.src_node_id): (r.error.reason if r.has_error() else "answered") for r in replies}
    Path(str(context.run_config["result-path"])).write_text(json.dumps({"replies": out}))
'''


def test_only_pinned_fab_bytes_pass_and_the_hash_is_computed_not_trusted():
    pinned = flower_guard.fedtab_fab_hash()
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(flower.app_dir())
    assert flower_guard.check_fab(fab, [pinned.upper()]) == pinned == hashlib.sha256(fab).hexdigest()
    with pytest.raises(flower_guard.FabRefused, match="not one of them"):
        flower_guard.check_fab(fab + b" ", [pinned])
    with pytest.raises(flower_guard.FabRefused):
        flower_guard.check_fab(fab, [])


def test_the_guard_refuses_before_flower_installs(monkeypatch):
    """install_guard wraps Flower's runner: a FAB that is not pinned never reaches its installer."""
    installed = []
    runtime = SimpleNamespace(install_from_fab=lambda fab, **kw: installed.append(fab))
    monkeypatch.delenv(flower_guard.CHECKED_ENV, raising=False)
    flower_guard.install_guard([hashlib.sha256(b"ours").hexdigest()], runtime)
    with pytest.raises(flower_guard.FabRefused):
        runtime.install_from_fab(b"theirs", skip_prompt=True)
    assert installed == [] and flower_guard.CHECKED_ENV not in os.environ
    runtime.install_from_fab(b"ours", skip_prompt=True)
    assert installed == [b"ours"] and os.environ[flower_guard.CHECKED_ENV] == hashlib.sha256(b"ours").hexdigest()


def test_pins_file_is_checked(tmp_path):
    with pytest.raises(ValueError, match="64 hex"):
        flower_guard.write_fab_guard(tmp_path / "g", ["abc"])
    folder = flower_guard.write_fab_guard(tmp_path / "ok", ["a" * 64])
    assert flower_guard.load_pins(folder / flower_guard.PINS_FILE) == ["a" * 64]
    assert os.access(folder / flower_guard.GUARD_COMMAND, os.X_OK)
    (folder / flower_guard.PINS_FILE).write_text("[]")
    with pytest.raises(ValueError, match="fab-sha256"):
        flower_guard.load_pins(folder / flower_guard.PINS_FILE)


def test_a_clientapp_that_requires_the_guard_refuses_without_it(tmp_path, monkeypatch):
    """A node config with require-fab-guard: fedtab's ClientApp answers nothing unless the guard checked the FAB
    (a SuperNode started without the guard on its PATH)."""
    csv = tmp_path / "t.csv"
    csv.write_text("a,y\n1,0\n2,1\n")
    cfg = {"name": "s", "data-path": str(csv), "require-fab-guard": "true"}
    app = flower.make_server_app(lambda fed, run_config: {"joined": fed.sites})
    monkeypatch.delenv(flower_guard.CHECKED_ENV, raising=False)
    with pytest.raises(Exception, match="require-fab-guard"):
        flower.run_in_process([cfg], app=app)
    monkeypatch.setenv(flower_guard.CHECKED_ENV, "a" * 64)
    assert flower.run_in_process([cfg], app=app)["joined"] == ["s"]


@pytest.mark.skipif(not (BIN / "flower-superlink").exists(), reason="Flower CLI binaries not installed")
def test_a_guarded_supernode_refuses_a_hostile_fab_the_unguarded_one_runs(tmp_path):
    from fedtab.engines.flower_deploy import LoopbackDeployment

    app = tmp_path / "hostile"
    app.mkdir()
    (app / "pyproject.toml").write_text(HOSTILE_PYPROJECT)
    (app / "hostile_app.py").write_text(HOSTILE_APP)
    guard = flower_guard.write_fab_guard(tmp_path / "guard")  # pins fedtab's own FAB
    markers = {"guarded": tmp_path / "guarded.ran", "open": tmp_path / "open.ran"}
    dep = LoopbackDeployment([], tmp_path / "dep", insecure=True, start_timeout=40)
    try:
        dep.start()
        for name, path_first in (("guarded", guard), ("open", None)):
            dep.add_supernode({"name": name, "marker": str(markers[name])}, name=name, fab_guard=path_first)
        result = dep.run({"min-sites": 2}, app=app, timeout=55)
    finally:
        dep.stop()
    replies = result["replies"]
    assert len(replies) == 2, replies
    assert markers["open"].is_file()  # the attack is real: an unguarded SuperNode ran the server's code
    assert not markers["guarded"].exists()  # the guarded one did not
    assert list(replies.values()).count("answered") == 1
    refused = [r for r in replies.values() if r != "answered"]
    from flwr.cli.build import build_fab_from_disk

    hostile = hashlib.sha256(build_fab_from_disk(app)).hexdigest()
    assert len(refused) == 1 and "FabRefused" in refused[0] and hostile in refused[0], replies  # the hash it computed
