"""Flower's floor for benchmarks/vs_nvflare.py: a bare ServerApp/ClientApp pair, no fedtab.

The ServerApp waits for ``min-sites`` online nodes, then makes one exchange per entry of
the run config's ``plan`` (JSON list of ``[request bytes, reply bytes]``): it sends every
node a ``uint8`` array of the request size, each ClientApp answers with an array of the
reply size and does nothing else. Replies are pulled every 0.05 s, as fedtab's
``FlowerFederation`` does. The ServerApp writes ``{"engine": "flower-bare",
"seconds_total", "exchanges": [{"seconds", "bytes_down", "bytes_up"}]}`` to
``result-path``. Imports only Flower and numpy, so a ClientApp process costs what any
Flower app costs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

__all__ = ["client_app", "server_app"]

client_app = ClientApp()
server_app = ServerApp()


@client_app.query("bare")
def _answer(message: Message, context: Context) -> Message:
    size = int(message.content["cfg"]["reply-bytes"])
    return Message(RecordDict({"payload": ArrayRecord({"x": Array(np.zeros(size, dtype=np.uint8))})}),
                   reply_to=message)


def _online(grid: Grid) -> list[int]:
    return sorted(n.node_id for n in grid.get_nodes() if getattr(n, "status", "") in ("", "online"))


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
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
        pending = set(grid.push_messages(msgs))
        until = time.monotonic() + timeout
        while pending and time.monotonic() < until:
            pending.difference_update(r.metadata.reply_to_message_id for r in grid.pull_messages(list(pending)))
            if pending:
                time.sleep(0.05)
        if pending:
            raise RuntimeError(f"exchange {i}: {len(pending)} node(s) did not answer within {timeout:g} s")
        exchanges.append({"seconds": time.perf_counter() - start, "bytes_down": down, "bytes_up": up})
    result = {"engine": "flower-bare", "sites": len(nodes), "seconds_total": time.perf_counter() - t0,
              "exchanges": exchanges}
    if cfg.get("result-path"):
        Path(str(cfg["result-path"])).write_text(json.dumps(result, indent=2))
