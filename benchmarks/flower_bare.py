"""Flower's floor for benchmarks/vs_nvflare.py: a bare ServerApp/ClientApp pair, no fedtab.

The ServerApp waits for ``min-sites`` online nodes, then makes one exchange per entry of
the run config's ``plan`` (JSON list of ``[request bytes, reply bytes]``): it sends every
node a ``uint8`` array of the request size, each ClientApp answers with an array of the
reply size and does nothing else. Replies are pulled every 0.05 s, as fedtab's
``FlowerFederation`` does. The ServerApp writes ``{"engine": "flower-bare",
"seconds_total", "exchanges": [{"seconds", "bytes_down", "bytes_up"}]}`` to
``result-path``. Imports only Flower and numpy, so a ClientApp process costs what any
Flower app costs.

With ``FEDTAB_FLOWER_TRACE`` set to a folder, both apps write the timeline events of
``fedtab.engines.flower_trace`` (same file layout and event names, written here without
importing fedtab): a fedtab run and a bare run can then be laid side by side.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

__all__ = ["client_app", "server_app"]

client_app = ClientApp()
server_app = ServerApp()
_TRACE: dict[str, Path] = {}


def _started() -> float:
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.time() - (float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return float("nan")


def _event(role: str, name: str, **fields: object) -> None:
    """fedtab.engines.flower_trace's event line, when FEDTAB_FLOWER_TRACE names a folder."""
    folder = os.environ.get("FEDTAB_FLOWER_TRACE", "")
    if not folder:
        return
    lines = []
    if role not in _TRACE:
        _TRACE[role] = Path(folder) / f"{role}-{os.getpid()}.jsonl"
        _TRACE[role].parent.mkdir(parents=True, exist_ok=True)
        lines.append({"event": "process_start", "t": _started(), "cpu": 0.0})
        atexit.register(_event, role, "exit")
    cpu = os.times()
    lines.append({"event": name, "t": time.time(), "cpu": cpu.user + cpu.system, **fields})
    with open(_TRACE[role], "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps({**line, "pid": os.getpid(), "role": role}) + "\n" for line in lines)


@client_app.query("bare")
def _answer(message: Message, context: Context) -> Message:
    _event("clientapp", "handler_start")
    size = int(message.content["cfg"]["reply-bytes"])
    _event("clientapp", "handler_end", kind="bare", error=False, bytes=size)
    return Message(RecordDict({"payload": ArrayRecord({"x": Array(np.zeros(size, dtype=np.uint8))})}),
                   reply_to=message)


def _online(grid: Grid) -> list[int]:
    return sorted(n.node_id for n in grid.get_nodes() if getattr(n, "status", "") in ("", "online"))


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    _event("serverapp", "main_start")
    cfg = dict(context.run_config)
    plan = [(int(d), int(u)) for d, u in json.loads(str(cfg["plan"]))]
    timeout, need = float(cfg.get("timeout", 600)), int(cfg.get("min-sites", 1))
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while len(nodes := _online(grid)) < need:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(nodes)} nodes online, {need} needed")
        time.sleep(0.5)
    exchanges = []
    for i, (down, up) in enumerate(plan):
        start = time.perf_counter()
        msgs = [Message(RecordDict({"payload": ArrayRecord({"x": Array(np.zeros(down, dtype=np.uint8))}),
                                    "cfg": ConfigRecord({"reply-bytes": up})}),
                        dst_node_id=node, message_type="query.bare", group_id=str(i)) for node in nodes]
        _event("serverapp", "push", kind="bare", round=i + 1, nodes=nodes)
        pending = set(grid.push_messages(msgs))
        _event("serverapp", "pushed", kind="bare", round=i + 1)
        until = time.monotonic() + timeout
        while pending and time.monotonic() < until:
            got = list(grid.pull_messages(list(pending)))
            if got:
                _event("serverapp", "pulled", kind="bare", round=i + 1, nodes=[int(r.metadata.src_node_id) for r in got])
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if pending:
                time.sleep(0.05)
        if pending:
            raise RuntimeError(f"exchange {i}: {len(pending)} node(s) did not answer within {timeout:g} s")
        exchanges.append({"seconds": time.perf_counter() - start, "bytes_down": down, "bytes_up": up})
    result = {"engine": "flower-bare", "sites": len(nodes), "seconds_total": time.perf_counter() - t0,
              "exchanges": exchanges}
    if cfg.get("result-path"):
        Path(str(cfg["result-path"])).write_text(json.dumps(result, indent=2))
    _event("serverapp", "main_end")
