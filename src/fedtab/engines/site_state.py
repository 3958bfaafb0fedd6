"""Keeping a site's per-site state alive between requests, whatever the engine does.

Engines do not guarantee that the Python object answering one request is the one that
answered the previous request: a Flower SuperNode starts a fresh ClientApp process
for every message, and FLARE's simulator may rebuild an executor between tasks. The
workflows, however, keep state on the site between requests (``Site.state``: the
elected features, the agreed class list and standardisation, the imputer...).

Two mechanisms, used together by the engine adapters:

* :class:`SiteCache` keeps live :class:`~fedtab.federation.site.core.Site` objects per
  ``(run, site)`` in this process, so state of any type survives as long as the process
  does (in-process Flower grid, FLARE client processes).
* :func:`encode_state` / :func:`decode_state` turn ``Site.state`` into a
  :class:`~fedtab.federation.protocol.messages.Message` (arrays + JSON, never pickle) that an
  engine can store next to the site (Flower's ``Context.state``, a file in FLARE's site
  workspace) and restore in a new process. Supported values: JSON scalars, str-keyed
  dicts, lists, tuples, numpy arrays and scalars, ``numpy.random.Generator`` and
  dataclasses defined in ``fedtab``. Other values (torch modules, optimizers...) are
  left out and reported by :func:`encode_state`; a handler that needs them after a
  process restart fails with its own "not set up" error instead of computing garbage.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, Callable, Hashable

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site

__all__ = ["SiteCache", "StateNotEncodable", "encode_state", "decode_state"]

log = logging.getLogger("fedtab.engines")

_STATE_KIND = "site_state"


class StateNotEncodable(TypeError):
    """A state value has a type the codec cannot store without pickle."""


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            if isinstance(value, float) and not np.isfinite(value):
                return {"f": repr(value)}
            return {"v": value}
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufU":
                raise StateNotEncodable(f"{path}: array of dtype {value.dtype}")
            key = f"a{len(self.arrays)}"
            self.arrays[key] = value
            return {"a": key}
        if isinstance(value, np.generic):
            return self.encode(value.item(), path)
        if isinstance(value, np.random.Generator):
            state = value.bit_generator.state
            return {"rng": type(value.bit_generator).__name__, "state": self.encode(state, path + ".state")}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            cls = type(value)
            if not cls.__module__.startswith("fedtab."):
                raise StateNotEncodable(f"{path}: dataclass {cls.__qualname__} is not defined in fedtab")
            fields = {f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)}
            return {"dc": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise StateNotEncodable(f"{path}: dict with non-string keys")
            return {"d": {k: self.encode(v, f"{path}.{k}") for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
            return {"t" if isinstance(value, tuple) else "l": items}
        raise StateNotEncodable(f"{path}: {type(value).__module__}.{type(value).__qualname__}")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(node, dict) or len(node) == 0:
        raise ValueError("malformed site state")
    if "v" in node:
        return node["v"]
    if "f" in node:
        return float(node["f"])
    if "a" in node:
        return arrays[node["a"]]
    if "d" in node:
        return {k: _decode(v, arrays) for k, v in node["d"].items()}
    if "l" in node:
        return [_decode(v, arrays) for v in node["l"]]
    if "t" in node:
        return tuple(_decode(v, arrays) for v in node["t"])
    if "rng" in node:
        bitgen = getattr(np.random, str(node["rng"]))
        if not (isinstance(bitgen, type) and issubclass(bitgen, np.random.BitGenerator)):
            raise ValueError(f"unknown bit generator {node['rng']!r}")
        gen = bitgen()
        gen.state = _decode(node["state"], arrays)
        return np.random.Generator(gen)
    if "dc" in node:
        module, _, qualname = str(node["dc"]).partition(":")
        if not module.startswith("fedtab."):
            raise ValueError(f"refusing to restore {node['dc']!r}: not a fedtab dataclass")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            raise ValueError(f"{node['dc']!r} is not a dataclass")
        return obj(**{k: _decode(v, arrays) for k, v in node["fields"].items()})
    raise ValueError(f"malformed site state node {sorted(node)}")


def encode_state(state: dict[str, Any]) -> tuple[Message, list[str]]:
    """``(message, skipped)``: the encodable top-level entries of ``state`` and the
    keys left out because some value in them cannot be stored without pickle."""
    enc = _Encoder()
    entries, skipped = {}, []
    for key, value in state.items():
        trial = _Encoder()
        trial.arrays = dict(enc.arrays)
        try:
            entries[str(key)] = trial.encode(value, str(key))
        except StateNotEncodable as exc:
            skipped.append(str(key))
            log.debug("site state %s is kept in memory only: %s", key, exc)
            continue
        enc = trial
    return Message(_STATE_KIND, enc.arrays, {"state": entries}), skipped


def decode_state(message: Message) -> dict[str, Any]:
    """Inverse of :func:`encode_state`.

    Raises:
        ValueError: not a site-state message, or a malformed one.
    """
    if message.kind != _STATE_KIND or not isinstance(message.meta.get("state"), dict):
        raise ValueError(f"expected a {_STATE_KIND!r} message, got {message.kind!r}")
    return {k: _decode(v, message.arrays) for k, v in message.meta["state"].items()}


class SiteCache:
    """Live sites of this process, keyed by ``(run, site)``.

    ``get(key, build)`` returns the cached site or builds one with ``build()``; an engine
    that also persists state restores it into a freshly built site itself.
    """

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self._sites: dict[Hashable, Site] = {}

    def get(self, key: Hashable, build: Callable[[], Site]) -> tuple[Site, bool]:
        """``(site, fresh)``; ``fresh`` is True when the site was just built."""
        site = self._sites.get(key)
        if site is not None:
            return site, False
        if len(self._sites) >= self.max_entries:
            self._sites.pop(next(iter(self._sites)))
        site = build()
        self._sites[key] = site
        return site, True

    def drop(self, key: Hashable) -> None:
        self._sites.pop(key, None)

    def clear(self) -> None:
        self._sites.clear()
