"""Flower 1.42 engine: a ServerApp that drives fedtab workflows, a ClientApp per site.

Needs the ``flower`` extra (``pip install fedtab[flower]``); ``import fedtab`` does not
import this module.

* :data:`client_app` answers ``query.fedtab`` messages. It builds the site from the
  SuperNode's ``--node-config`` (keys of :mod:`fedtab.engines.site_config`: ``name``,
  ``data-path``, ``target``, ``test-path``, ``selector``...), hands the request to
  :meth:`Site.handle` and replies. Per-site state survives between messages: the live
  site is cached in the process and its state is also stored in Flower's
  ``Context.state`` (arrays + JSON, see :mod:`fedtab.engines.site_state`), because a
  SuperNode starts a fresh ClientApp process for every message.
* :data:`server_app` wraps the Grid in :class:`FlowerFederation` and runs the server app its
  run config's ``server-app`` names (:mod:`fedtab.engines.server_apps`; for a job the job's side
  writes :data:`fedtab.job.apps.SERVER_APP` and the plan in ``job``); with a ``result-path`` in the
  run config it writes the JSON summary there. :func:`make_server_app` builds one around any
  ``workflow(federation, run_config)``.
* Payloads are a Flower ``RecordDict`` of an ``ArrayRecord`` (each array saved by
  numpy without pickle) and a ``ConfigRecord`` (the kind and the JSON metadata).
* :class:`InProcessGrid` runs the real ServerApp and ClientApp in one process (tests,
  notebooks) without a SuperLink.

The app directory for ``flwr run`` is ``fedtab/engines/flower_app`` (:func:`app_dir`).
"""

from __future__ import annotations

import time

_IMPORT_STARTED = time.time()  # a ClientApp process reports how long importing fedtab took
_IMPORT_CPU = time.process_time()

import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message as FlwrMessage, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.logger import log as flwr_log  # noqa: E402
from flwr.proto.node_pb2 import NodeInfo  # noqa: E402  # pylint: disable=E0611
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedtab.federation.protocol.messages import LIMITS, Message, MessageError, decode_meta  # noqa: E402
from ..federation.protocol import Federation, FederationError, Traffic  # noqa: E402
from .flower_trace import process_started, tracer  # noqa: E402
from .site_state import SiteCache, decode_state, encode_state  # noqa: E402

_IMPORT_SECONDS = time.time() - _IMPORT_STARTED
_IMPORTED_CPU = time.process_time()

__all__ = [
    "FlowerFederation",
    "InProcessGrid",
    "MESSAGE_TYPE",
    "RUN_CONFIG_KEYS",
    "app_dir",
    "client_app",
    "from_records",
    "make_server_app",
    "run_in_process",
    "server_app",
    "to_records",
]

log = logging.getLogger("fedtab.engines.flower")

#: Flower message type of every fedtab request (category ``query``, action ``fedtab``).
MESSAGE_TYPE = "query.fedtab"
_HELLO = "__hello__"
_ARRAYS, _HEADER = "fedtab.arrays", "fedtab.header"
_STATE_ARRAYS, _STATE_HEADER = "fedtab.state.arrays", "fedtab.state.header"
#: set in ``Context.state`` once a node without a state folder said so in this run
_WARNED = "fedtab.warned-no-state-dir"
#: the secret seed of a node's row parts in a run, in ``Context.state``, when its node config sets
#: neither a seed nor a state folder (:func:`_run_seed`)
_RUN_SEED = "fedtab.run-seed"
#: the ClientApp's per-message timing (seconds per stage), a ConfigRecord beside the reply
_TIMING = "fedtab.timing"
_STAGES = ("before_fedtab", "fedtab_import", "flower_until_handler", "restore", "work", "store")

_SITES = SiteCache()


# ----------------------------------------------------------------------------- payloads
def to_records(msg: Message, arrays_key: str = _ARRAYS, header_key: str = _HEADER) -> RecordDict:
    """A fedtab message as a Flower ``RecordDict`` (ArrayRecord + ConfigRecord, no pickle)."""
    arrays = ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in msg.arrays.items()})
    header = ConfigRecord({"kind": msg.kind, "meta": json.dumps(msg.meta)})
    return RecordDict({arrays_key: arrays, header_key: header})


def from_records(content: RecordDict, arrays_key: str = _ARRAYS, header_key: str = _HEADER) -> Message:
    """Inverse of :func:`to_records`; validates like :meth:`Message.from_bytes`.

    Raises:
        MessageError: records missing or malformed, forbidden dtype, bad JSON.
    """
    try:
        header = content[header_key]
        arrays = content[arrays_key]
    except KeyError as exc:
        raise MessageError(f"Flower message lacks the fedtab record {exc}") from None
    if not isinstance(header, ConfigRecord) or not isinstance(arrays, ArrayRecord):
        raise MessageError("fedtab records have the wrong Flower record types")
    try:
        kind, text = str(header["kind"]), str(header["meta"])
    except KeyError as exc:
        raise MessageError(f"fedtab header is malformed: {exc}") from None
    meta = decode_meta(text)
    if not isinstance(meta, dict):
        raise MessageError("fedtab meta must be a JSON object")
    if len(arrays) > LIMITS.max_arrays:
        raise MessageError(f"message has {len(arrays)} arrays (limit {LIMITS.max_arrays})")
    out = {}
    for name, arr in arrays.items():
        try:
            out[name] = arr.numpy()  # np.load(allow_pickle=False)
        except (TypeError, ValueError, EOFError, OSError, MemoryError) as exc:
            raise MessageError(f"array {name!r} cannot be decoded: {exc}") from None
    return Message(kind, out, meta)


# ----------------------------------------------------------------------------- client side
def _run_seed(context: Context) -> int | None:
    """The secret seed of the node's row parts for this run when its node config sets neither a
    ``seed`` nor a ``state-dir`` (``None`` otherwise: :func:`~fedtab.engines.site_config.own_split`
    takes those). A ClientApp is a new process per message, so the seed is drawn once per run and
    kept in the node's ``Context.state`` (kept by the SuperNode across the run's messages, never
    sent to the server); the next run draws another (the start-of-run warning says so)."""
    from .site_config import draw_secret_seed, site_config

    own = site_config(context.node_config)
    if own.get("seed") not in (None, "") or own.get("state_dir") not in (None, ""):
        return None
    if _RUN_SEED not in context.state:
        context.state[_RUN_SEED] = ConfigRecord({"seed": draw_secret_seed()})
    return int(context.state[_RUN_SEED]["seed"])


def _site_config(context: Context) -> dict[str, Any]:
    """The node's site config: its node config, what the run config's ``site-settings`` may add
    (never its split: :func:`~fedtab.engines.site_config.with_job_settings`), its own split and
    seed (:func:`~fedtab.engines.site_config.own_split`, :func:`_run_seed`)."""
    from .site_config import own_split, with_job_settings

    config = with_job_settings(context.node_config, context.run_config.get("site-settings", ""))
    return own_split(config, seed=_run_seed(context))


def _site_for(context: Context):
    from .site_config import build_lazy_site, warn_without_state_dir  # the table when needed

    key = (context.run_id, context.node_id)
    site, fresh = _SITES.get(key, lambda: build_lazy_site(_site_config(context)))
    if fresh and _STATE_HEADER in context.state:
        site.state = decode_state(from_records(context.state, _STATE_ARRAYS, _STATE_HEADER))
    elif fresh and _WARNED not in context.state:  # the run's first message to this node: warn once per run
        if warn_without_state_dir(site, context.node_config, "Flower"):
            context.state[_WARNED] = ConfigRecord({"run": int(context.run_id)})  # kept by the SuperNode
    site.run_id = f"flower:{context.run_id}"  # the ledger's per-run caps count per Flower run
    return site


def _store_state(site, context: Context) -> None:
    snapshot, skipped = encode_state(site.state)
    if skipped:
        log.debug("site %s: state %s kept in this process only", site.name, skipped)
    records = to_records(snapshot, _STATE_ARRAYS, _STATE_HEADER)
    context.state[_STATE_ARRAYS] = records[_STATE_ARRAYS]
    context.state[_STATE_HEADER] = records[_STATE_HEADER]


def _check_fab_guard(node_config: Mapping[str, Any]) -> None:
    """Refuse to answer when the node config sets ``require-fab-guard`` and this process was not
    started by the site's FAB guard (:mod:`fedtab.engines.flower_guard`: a SuperNode started
    without the guard's folder first on its ``PATH``). This runs only when the FAB's ClientApp is
    fedtab's; a FAB that replaces it is stopped by the guard alone.

    Raises:
        RuntimeError: the guard was required and did not run.
    """
    from .flower_guard import CHECKED_ENV

    required = str(node_config.get("require-fab-guard", node_config.get("require_fab_guard", ""))).strip().lower()
    if required in ("true", "1", "yes") and not os.environ.get(CHECKED_ENV):
        raise RuntimeError("this site requires its FAB guard (require-fab-guard), which did not check this run's FAB: "
                           "start the SuperNode with the guard's folder first on PATH (fedtab deploy prints it)")


def handle_message(message: FlwrMessage, context: Context) -> FlwrMessage:
    """The ClientApp's body: decode, let the site answer, persist its state, reply.

    Never raises for a bad request or a failing handler: the reply is a fedtab error
    message, so the server can name the site. Beside the reply goes a ``fedtab.timing``
    record, seconds per stage of this message in this process: ``before_fedtab``
    (process start, Python, Flower's imports, FAB install, up to importing this module),
    ``fedtab_import``, ``flower_until_handler``, ``restore`` (build the site, restore
    its state), ``work`` (the site's handler), ``store`` (save its state).
    """
    entered = time.time()
    trace = tracer("clientapp")  # FEDTAB_FLOWER_TRACE: this process's timeline (fedtab.engines.flower_trace)
    if trace is not None:
        trace.event("fedtab_import", t=_IMPORT_STARTED, cpu=_IMPORT_CPU)
        trace.event("fedtab_imported", t=_IMPORT_STARTED + _IMPORT_SECONDS, cpu=_IMPORTED_CPU)
        trace.event("handler_start")
    timing = {"fedtab_import": _IMPORT_SECONDS, "before_fedtab": _IMPORT_STARTED - process_started(),
              "flower_until_handler": max(0.0, entered - _IMPORT_STARTED - _IMPORT_SECONDS)}
    kind = "?"
    try:
        _check_fab_guard(context.node_config)
        request = from_records(message.content)
        kind = request.kind
        site = _site_for(context)
        timing["restore"] = time.time() - entered
        if request.kind == _HELLO:
            reply = Message(_HELLO, meta={"site": site.name})  # the file is read by the first step that needs it
        else:
            reply = site.handle(request)
            timing["work"] = time.time() - entered - timing["restore"]
            _store_state(site, context)
    except KeyboardInterrupt:  # the operator's Ctrl-C in this process ends the run; it is no site's failure
        raise
    except BaseException as exc:  # noqa: BLE001 - reported to the server (even SystemExit from a site's code)
        if sys.is_finalizing():
            raise
        name = context.node_config.get("name", context.node_id)
        reply = Message.error(f"site {name!r}: {type(exc).__name__}: {exc}")
    content = to_records(reply)
    timing["store"] = time.time() - entered - timing.get("restore", 0.0) - timing.get("work", 0.0)
    content[_TIMING] = ConfigRecord({k: float(v) for k, v in timing.items()})
    if trace is not None:
        trace.event("handler_end", kind=kind, error=reply.is_error, bytes=reply.nbytes())
    return FlwrMessage(content, reply_to=message)


client_app = ClientApp()
client_app.query("fedtab")(handle_message)


def forget_sites() -> None:
    """Drop the live sites of this process (as if every ClientApp process were new)."""
    _SITES.clear()


# ----------------------------------------------------------------------------- server side
class FlowerFederation(Federation):
    """The sites behind a Flower ``Grid``, addressed by their ``name`` node-config value.

    On construction it waits until ``min_sites`` nodes are online (at most
    ``wait_seconds``) and asks each for its site name; a node that fails to answer is
    asked again until the deadline. Once ``min_sites`` sites are named, nodes that
    still fail (a stale registration of a SuperNode that reconnected) are ignored.

    **Identity.** Without ``site_keys`` a node is the site it declares (its node-config
    ``name``). With ``site_keys`` (``{site: public-key fingerprint}``, see
    :func:`fedtab.deploy.keys.fingerprint`; needs a SuperLink with
    ``--enable-supernode-auth``) a node is the site whose key it authenticated with, as
    the SuperLink reports it in ``NodeInfo.public_key``: a node whose key belongs to no
    site, or that declares another site's name, is left out and listed in
    :attr:`excluded` (never asked again, never blocking the others).

    Args:
        grid: the ServerApp's grid.
        min_sites: nodes to wait for (default: whatever is connected, at least one).
        timeout: seconds to wait for the replies of one :meth:`ask`; a site that did
            not answer in time gets an error reply.
        wait_seconds: how long to wait for ``min_sites`` nodes to connect.
        poll_interval: seconds between two pulls of pending replies.
        site_keys: ``{site: fingerprint}`` binding each site to its node's key.
        grace: stragglers' allowance. Once ``min_sites`` nodes named their site, the other
            online nodes get ``grace`` seconds more to answer (then they are left out, with
            a warning). In a workflow exchange, once the quorum (``self.min_sites``, when
            set) has answered, the others get ``max(grace, time taken so far)`` more --
            so a dead SuperNode costs about that, not the full ``timeout``.

    Raises:
        FederationError: fewer than ``min_sites`` nodes named their site in time (the
            message gives each node's error), a node's ClientApp failed to build its
            site, or (without ``site_keys``) two nodes claim the same site name.
    """

    def __init__(self, grid: Grid, *, min_sites: int = 1, timeout: float = 600.0, wait_seconds: float = 120.0,
                 poll_interval: float = 0.05, site_keys: Mapping[str, str] | None = None, grace: float = 15.0) -> None:
        super().__init__()
        self.grid = grid
        self.grace = float(grace)
        self.poll_interval = poll_interval
        self.timeout = float(timeout)
        self._round = 0
        #: one entry per :meth:`ask` (a request/reply exchange with the sites): ``kind``,
        #: ``seconds``, ``bytes_down`` / ``bytes_up`` (largest request / reply), ``clientapp``
        #: (mean seconds per ClientApp stage, see :func:`handle_message`)
        self.exchanges: list[dict[str, Any]] = []
        self.last_timing: dict[int, dict[str, float]] = {}
        #: ``fn(kind, answered, asked)`` after each :meth:`ask` (the ServerApp's progress lines)
        self.on_exchange: Callable[[str, int, int], None] | None = None
        #: seconds the last site-naming exchange took: the deployment's measured cost of one exchange
        self.hello_seconds = 0.0
        #: ``{node id: reason}`` of nodes left out: unknown key, or a name the node's key does not hold
        self.excluded: dict[int, str] = {}
        self._site_of_key = {fp: site for site, fp in (site_keys or {}).items()}
        self.bound = site_keys is not None
        #: ``{site: key fingerprint}`` (the consortium's key list) when given: secure aggregation
        #: checks each site's identity key against it
        self.site_keys = dict(site_keys) if site_keys else None
        deadline = time.monotonic() + wait_seconds
        self._node_of: dict[str, int] = {}
        problems: dict[int, str] = {}
        while True:
            nodes = self._online_nodes()
            todo = [n for n in nodes if n not in self._node_of.values() and n not in self.excluded]
            if len(nodes) >= max(1, min_sites) and todo:
                named = len(self._node_of)
                expected = self._key_sites(todo)
                todo = [n for n in todo if n not in self.excluded]
                hello_started = time.monotonic()
                replies = self._send({node: Message(_HELLO) for node in todo},
                                     enough=lambda got: named + sum(self._claim_ok(m, expected) for m in got) >= min_sites)
                self.hello_seconds = time.monotonic() - hello_started
                for node in todo:
                    reply = replies[node]
                    name = reply.meta.get("site") if not reply.is_error else None
                    if reply.is_error and "flower_code" not in reply.meta and not reply.meta.get("no_reply"):
                        # the ClientApp ran and failed (bad data path, bad config): never drop a site silently
                        raise FederationError(f"Flower node {node} could not start its site: {reply.meta.get('error')}")
                    if not isinstance(name, str):
                        problems[node] = str(reply.meta.get("error", "no site name"))
                    elif self.bound and name != expected[node]:
                        self._exclude(node, f"claims site {name!r} but authenticated with the key of site "
                                            f"{expected[node]!r}")
                        problems.pop(node, None)
                    elif name in self._node_of:
                        raise FederationError(f"Flower nodes {self._node_of[name]} and {node} both claim site {name!r}")
                    else:
                        self._node_of[name] = node
                        problems.pop(node, None)
            if len(self._node_of) >= max(1, min_sites):
                if problems:  # e.g. a stale registration of a SuperNode that reconnected
                    flwr_log(logging.WARNING, "ignoring Flower nodes that did not name a site: %s", problems)
                break
            if time.monotonic() > deadline:
                detail = "; ".join(f"node {n}: {e}" for n, e in {**problems, **self.excluded}.items())
                raise FederationError(f"{len(self._node_of)} Flower site(s) joined, {min_sites} needed "
                                      f"({detail or f'{len(nodes)} online'})")
            time.sleep(0.5)
        self._node_of = dict(sorted(self._node_of.items()))

    def _key_sites(self, nodes: Sequence[int]) -> dict[int, str | None]:
        """``{node: site its authentication key belongs to}``; excludes nodes with no such site.

        Only with ``site_keys``: the SuperLink reports the public key each node
        authenticated with (``NodeInfo.public_key``, PEM), which is matched by fingerprint.
        """
        if not self.bound:
            return {n: None for n in nodes}
        from ..deploy.keys import fingerprint

        keys = {int(info.node_id): bytes(getattr(info, "public_key", b"") or b"") for info in self.grid.get_nodes()}
        out: dict[int, str | None] = {}
        for node in nodes:
            key = keys.get(node, b"")
            try:
                fp = fingerprint(key) if key else ""
            except ValueError:
                fp = ""
            site = self._site_of_key.get(fp)
            if site is None:
                self._exclude(node, f"its key {fp or '(none)'} belongs to no site of this consortium")
            out[node] = site
        return out

    def _claim_ok(self, reply: FlwrMessage, expected: Mapping[int, str | None]) -> bool:
        if reply.has_error():
            return False
        try:
            name = from_records(reply.content).meta.get("site")
        except MessageError:
            return False
        want = expected.get(int(reply.metadata.src_node_id), None)
        return isinstance(name, str) and (not self.bound or name == want)

    def _exclude(self, node: int, reason: str) -> None:
        if node not in self.excluded:
            self.excluded[node] = reason
            flwr_log(logging.WARNING, "excluding Flower node %s: %s", node, reason)

    def _online_nodes(self) -> list[int]:
        # A SuperNode is listed once registered but only receives messages once online.
        return sorted(n.node_id for n in self.grid.get_nodes() if getattr(n, "status", "") in ("", "online"))

    @property
    def sites(self) -> list[str]:
        return list(self._node_of)

    def node_id(self, site: str) -> int:
        """The Flower node id serving ``site``."""
        return self._node_of[site]

    def _send(self, requests: Mapping[int, Message], enough: Callable[[list[FlwrMessage]], bool] | None = None,
              stretch: bool = False) -> dict[int, Message]:
        self._round += 1
        out, sent = {}, {}
        for node, req in requests.items():
            sent[node] = FlwrMessage(to_records(req), dst_node_id=node, message_type=MESSAGE_TYPE,
                                     group_id=str(self._round))
        t0 = time.monotonic()
        kinds = {req.kind for req in requests.values()}
        replies = self._exchange(list(sent.values()), enough, stretch, "+".join(sorted(kinds)))
        waited = time.monotonic() - t0
        node_of_id = {m.metadata.message_id: node for node, m in sent.items()}
        self.last_timing = {}
        for r in replies:
            node = node_of_id.get(r.metadata.reply_to_message_id)
            if node is None:
                continue
            if not r.has_error() and _TIMING in r.content:  # diagnostics only: known stages, finite numbers
                self.last_timing[node] = {k: float(v) for k, v in r.content[_TIMING].items()
                                          if k in _STAGES and isinstance(v, (int, float)) and abs(v) < 1e9}
            if r.has_error():
                text = f"Flower error {r.error.code}: {r.error.reason}"
                out[node] = Message(Message.error(text).kind, meta={"error": text, "flower_code": int(r.error.code)})
                continue
            try:
                out[node] = from_records(r.content)
            except MessageError as exc:
                out[node] = Message.error(f"undecodable reply: {exc}")
        for node in requests:  # not answered (yet): marked so the site-naming step can tell it from a failure
            out.setdefault(node, Message(Message.error("").kind, meta={"error": f"no reply within {waited:.0f} s",
                                                                       "no_reply": True}))
        return out

    def _exchange(self, messages: list[FlwrMessage], enough: Callable[[list[FlwrMessage]], bool] | None = None,
                  stretch: bool = False, kind: str = "") -> list[FlwrMessage]:
        # Grid.send_and_receive sleeps 3 s between pulls on a deployment; poll faster.
        trace = tracer("serverapp")  # FEDTAB_FLOWER_TRACE (fedtab.engines.flower_trace)
        if trace is not None:
            trace.event("push", kind=kind, round=self._round, nodes=[int(m.metadata.dst_node_id) for m in messages])
        pending = set(self.grid.push_messages(messages))
        if trace is not None:
            trace.event("pushed", kind=kind, round=self._round)
        started = time.monotonic()
        deadline = started + self.timeout
        out: list[FlwrMessage] = []
        graced = False
        while pending and time.monotonic() < deadline:
            got = self._pull(list(pending), min(deadline, time.monotonic() + max(self.grace, time.monotonic() - started)))
            out.extend(got)
            if trace is not None and got:
                trace.event("pulled", kind=kind, round=self._round, nodes=[int(r.metadata.src_node_id) for r in got])
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if pending and not graced and enough is not None and enough(out):
                # enough sites: the others get a grace (a slow ClientApp start), not the full timeout
                now = time.monotonic()
                extra = max(self.grace, now - started) if stretch else self.grace
                deadline, graced = min(deadline, now + extra), True
            if pending:
                time.sleep(self.poll_interval)
        return out

    def _pull(self, ids: list[str], until: float) -> list[FlwrMessage]:
        """``grid.pull_messages(ids)``, returning by about ``until`` (``time.monotonic()``).

        A SuperNode killed between pushing a reply and pushing its content leaves a reply
        whose objects never arrive; Flower 1.42's grid retries pulling them for up to 2 h
        (``pull_objects(max_time=7200)``), blocking this pull -- and every reply in it --
        past any deadline. Bounded here, that reply becomes Flower's "objects unavailable"
        error reply, and its site is dropped like any other that failed.
        """
        module = sys.modules.get(type(self.grid).__module__)
        pull = getattr(module, "pull_objects", None)
        if pull is None:  # not Flower's HTTP grid (e.g. the in-process grid): nothing to bound
            return list(self.grid.pull_messages(ids))
        module.pull_objects = functools.partial(pull, max_time=max(1.0, until - time.monotonic()))
        try:
            return list(self.grid.pull_messages(ids))
        finally:
            module.pull_objects = pull

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        by_node = {}
        for name, req in requests.items():
            if name in self._node_of:
                by_node[self._node_of[name]] = (name, req)
            else:
                replies[name] = Message.error(f"no site called {name!r} in this federation")
        t0 = time.perf_counter()
        quorum = self.min_sites
        enough = None if quorum is None else (lambda got: sum(not m.has_error() for m in got) >= quorum)
        answers = self._send({node: req for node, (_, req) in by_node.items()}, enough, stretch=True) if by_node else {}
        kind, seconds = next(iter(requests.values())).kind if requests else "-", time.perf_counter() - t0
        self.exchanges.append({"kind": kind, "seconds": seconds,
                               "bytes_down": max((req.nbytes() for _, req in by_node.values()), default=0),
                               "bytes_up": max((a.nbytes() for a in answers.values()), default=0),
                               "clientapp": _mean_timing(self.last_timing.values())})
        flwr_log(logging.INFO, "fedtab %s: %d site(s) answered in %.2f s", kind, len(answers), seconds)
        if self.on_exchange is not None:
            self.on_exchange(kind, sum(not a.is_error for a in answers.values()), len(requests))
        for node, (name, req) in by_node.items():
            reply = answers[node]
            self.traffic.records.append(Traffic(name, req.kind, req.nbytes(), reply.nbytes()))
            replies[name] = reply
        return {name: replies[name] for name in requests}


def _mean_timing(timings: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per stage, the mean over the sites that reported it (seconds)."""
    sums: dict[str, list[float]] = {}
    for t in timings:
        for k, v in t.items():
            if v == v:  # not nan
                sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


Workflow = Callable[[Federation, Mapping[str, Any]], dict[str, Any]]

#: the run-config keys of the Flower app (declared in ``flower_app/pyproject.toml``; ``flwr run
#: --run-config`` refuses any other): the server app and its job plan, and what the ServerApp and
#: ClientApps read
RUN_CONFIG_KEYS = ("server-app", "job", "min-sites", "timeout", "site-keys", "result-path", "result-log",
                   "site-settings", "poll-interval")


def _site_keys(text: str) -> dict[str, str]:
    from ..deploy.keys import load_site_keys

    try:
        return load_site_keys(text)
    except ValueError as exc:
        raise FederationError(f"run config 'site-keys': {exc}") from None


def _poll_interval(value: Any) -> float:
    """The run config's ``poll-interval`` (seconds, 0.001–10).

    Raises:
        FederationError: not a number in that range.
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise FederationError(f"run config 'poll-interval' must be a number of seconds, got {value!r}") from None
    if not 0.001 <= seconds <= 10:
        raise FederationError(f"run config 'poll-interval' must be between 0.001 and 10 seconds, got {seconds:g}")
    return seconds


def _truthy(value: Any) -> bool:
    """A run-config flag: a bool, or the text ``true``/``1`` (Flower may pass either)."""
    return value is True or str(value).strip().lower() in ("true", "1")


def make_server_app(workflow: Workflow | None = None) -> ServerApp:
    """A ServerApp running ``workflow(federation, run_config)`` on a :class:`FlowerFederation`
    (default: the server app the run config's ``server-app`` names, ``"module:function"``, see
    :mod:`fedtab.engines.server_apps`; the job's side writes it, :func:`fedtab.job.apps.engine_config`,
    with the job plan in ``job``: this engine never imports the job).

    Run-config keys read here (:data:`RUN_CONFIG_KEYS`): ``server-app`` (without a ``workflow``),
    ``min-sites`` (nodes to wait for;
    the job's quorum is its ``[trust] min_sites``), ``timeout`` (seconds per request round
    until the job's ``[trust] timeout`` applies), ``result-path`` (write the workflow's JSON summary there),
    ``site-keys`` (JSON ``{site: public-key fingerprint or public key}``: name each node
    by the key it authenticated with, see :class:`FlowerFederation`),
    ``result-log`` (true: also print the summary into the ServerApp's log, where
    ``flwr log`` fetches it, see :mod:`fedtab.engines.result_log`, and the server app's progress
    lines, :mod:`fedtab.engines.progress`), ``poll-interval`` (seconds
    between two pulls of the sites' replies, default 0.05: a reply is collected as soon as it
    arrives instead of on ``Grid.send_and_receive``'s 3 s sleep); ``site-settings`` is
    read by the ClientApps; the rest (``job``) goes to the server app. The summary
    gains ``engine``, ``seconds_total``, ``bytes``, ``exchanges`` (per request/reply
    exchange of the workflow, see :attr:`FlowerFederation.exchanges`), ``identity`` (``"key"`` or
    ``"declared"``) and ``excluded_nodes`` (``{node id: reason}``).

    Raises (in the ServerApp):
        FederationError: a bad run-config value (``server-app``: see
            :func:`~fedtab.engines.server_apps.load_server_app`).
    """
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        from .server_apps import SERVER_APP_KEY, load_server_app, start_prepare, workflow_app  # the server's side only

        trace = tracer("serverapp")  # FEDTAB_FLOWER_TRACE (fedtab.engines.flower_trace)
        if trace is not None:
            trace.event("main_start")
        cfg = dict(context.run_config)
        t0 = time.perf_counter()
        # named before any node is waited for: a bad name fails the run at once
        app = workflow_app(workflow) if workflow is not None else load_server_app(cfg.get(SERVER_APP_KEY))
        if trace is not None:
            trace.event("app_loaded")
        # the app's own preparation (for a job: importing its step loop and parsing its plan)
        # runs while the ClientApps start for the site-naming hello, not between its replies and the first step
        prepared = start_prepare(app, cfg)
        keys = str(cfg.get("site-keys", "") or "")
        fed = FlowerFederation(grid, min_sites=int(cfg.get("min-sites", 1)), timeout=float(cfg.get("timeout", 600)),
                               site_keys=_site_keys(keys) if keys else None,
                               poll_interval=_poll_interval(cfg.get("poll-interval", 0.05)))
        # an analyst following the log (result-log) gets a progress line per exchange (print: the ServerApp's log)
        emit = (lambda line: print(line, flush=True)) if _truthy(cfg.get("result-log", False)) else None
        prepared()
        if trace is not None:
            trace.event("prepared")
        result = dict(app(fed, cfg, emit))
        result["engine"] = "flower"
        result["seconds_total"] = time.perf_counter() - t0
        down, up = fed.traffic.total()
        result["bytes"] = {"down": down, "up": up}
        result["exchanges"] = list(fed.exchanges)  # the workflow's, after the site-naming hello
        result["identity"] = "key" if fed.bound else "declared"
        result["excluded_nodes"] = {str(n): why for n, why in fed.excluded.items()}
        path = str(cfg.get("result-path", "") or "")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(result, indent=2))
        context.state["fedtab.result"] = ConfigRecord({"json": json.dumps(result)})
        if trace is not None:
            trace.event("main_end")
        if _truthy(cfg.get("result-log", False)):  # for an analyst who reads it back with `flwr log`
            from .result_log import encode_result

            print("\n".join(encode_result(result)), flush=True)

    return server


server_app = make_server_app()


def app_dir() -> Path:
    """The Flower app directory (``pyproject.toml`` with ``[tool.flwr.app]``) for ``flwr run``."""
    return Path(__file__).with_name("flower_app")


# ----------------------------------------------------------------------------- in process
class InProcessGrid(Grid):
    """A ``Grid`` whose nodes are ClientApps called in this process (no SuperLink).

    Each node has its own ``Context`` (node config, state kept between messages, as a
    SuperNode keeps it). With ``fresh_processes=True`` the live-site cache is cleared
    before every message, so per-site state must survive through ``Context.state``
    exactly as in a deployment where every message starts a new ClientApp process.
    ``public_keys`` (one PEM public key or ``None`` per node) is what :meth:`get_nodes`
    reports as each node's authentication key, as a SuperLink with SuperNode
    authentication does.
    """

    def __init__(self, app: ClientApp, node_configs: Sequence[Mapping[str, Any]], *, run_id: int | None = None,
                 run_config: Mapping[str, Any] | None = None, fresh_processes: bool = False,
                 public_keys: Sequence[bytes | None] | None = None) -> None:
        from flwr.supercore.run import Run

        self.app = app
        self._keys = {1000 + i: k for i, k in enumerate(public_keys or [])}
        self.fresh_processes = fresh_processes
        # a fresh run id per grid, so live sites cached for another run are never reused
        self._run = Run.create_empty(run_id if run_id is not None else uuid.uuid4().int >> 65)
        self._contexts = {
            1000 + i: Context(run_id=self._run.run_id, node_id=1000 + i, node_config=dict(cfg), state=RecordDict(),
                              run_config=dict(run_config or {}))
            for i, cfg in enumerate(node_configs)
        }
        self._replies: dict[str, FlwrMessage] = {}

    def set_run(self, run) -> None:  # noqa: ANN001 - flwr's Run
        self._run = run

    @property
    def run(self):  # noqa: ANN201
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> FlwrMessage:
        return FlwrMessage(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [NodeInfo(node_id=n, public_key=self._keys.get(n) or b"") for n in self._contexts]

    def push_messages(self, messages: Iterable[FlwrMessage]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            msg.metadata.__dict__["_run_id"] = self._run.run_id
            ctx = self._contexts.get(msg.metadata.dst_node_id)
            if ctx is None:
                continue
            if self.fresh_processes:
                forget_sites()
            try:
                reply = self.app(msg, ctx)
            except Exception as exc:  # noqa: BLE001 - what a SuperNode does with a crashing ClientApp
                reply = FlwrMessage(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[FlwrMessage]:
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]

    def send_and_receive(self, messages: Iterable[FlwrMessage], *, timeout: float | None = None) -> Iterable[FlwrMessage]:
        return self.pull_messages(self.push_messages(messages))


def run_in_process(node_configs: Sequence[Mapping[str, Any]], run_config: Mapping[str, Any] | None = None, *,
                   app: ServerApp | None = None, fresh_processes: bool = True,
                   public_keys: Sequence[bytes | None] | None = None) -> dict[str, Any]:
    """Run ``app`` (default :data:`server_app`) against :data:`client_app` nodes in this process.

    ``public_keys``: each node's authentication key (PEM), see :class:`InProcessGrid`.
    Node configs without secure-aggregation identities get them from a consortium written
    to a temporary folder for the call (:func:`fedtab.deploy.keys.write_consortium_keys`),
    as ``fedtab deploy`` would have made them. Returns the JSON summary the ServerApp produced.
    """
    import tempfile

    from .site_config import IDENTITY_KEYS, site_config

    if any(site_config(c).get(k) for c in node_configs for k in IDENTITY_KEYS):
        return _run_in_process(node_configs, run_config, app, fresh_processes, public_keys)
    from ..deploy.keys import write_consortium_keys

    with tempfile.TemporaryDirectory(prefix="fedtab-identities-") as tmp:
        try:
            keys = write_consortium_keys(tmp, [str(c.get("name", "")) for c in node_configs])
        except ValueError as exc:  # names unfit for key files: the sites then refuse secure sums, saying why
            log.warning("no secure-aggregation identities for the in-process nodes: %s", exc)
            return _run_in_process(node_configs, run_config, app, fresh_processes, public_keys)
        configs = [{**keys.identity_config(str(c.get("name"))), **c} for c in node_configs]
        return _run_in_process(configs, run_config, app, fresh_processes, public_keys)


def _run_in_process(node_configs: Sequence[Mapping[str, Any]], run_config: Mapping[str, Any] | None,
                    app: ServerApp | None, fresh_processes: bool,
                    public_keys: Sequence[bytes | None] | None) -> dict[str, Any]:
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    cfg = {"min-sites": len(node_configs), **dict(run_config or {})}
    grid = InProcessGrid(client_app, node_configs, run_config=cfg, fresh_processes=fresh_processes,
                         public_keys=public_keys)
    ctx = Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                  run_config=cfg)
    # Flower stamps new messages with the identity of the running task, which its
    # ServerApp process sets at start-up; do the same for the duration of the call.
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run.run_id, SUPERLINK_NODE_ID
    try:
        (app or server_app)(grid, ctx)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    return json.loads(str(ctx.state["fedtab.result"]["json"]))
