"""The site ledger: what a site has answered and released, kept across requests, setups,
runs and restarts.

A curious server chooses every parameter it sends, including a fresh setup or a fresh
run. Caps the site keeps only in memory for one setup can be reset by re-sending that
setup (issue 20: "20 of 20 fits answered at ``max_rounds=3``"). The ledger is the site's
own record, owned by the site and never by a request:

* **per run** (the engine's run id — Flower's ``run_id``, FLARE's job id, the in-process
  federation's id, set on ``Site.run_id`` by the engine): counters of rounds (``fit``,
  ``impute_fit``, ``score_sums``...), of evaluations per part and of releases per part; a
  new setup inside the run does not reset them, and a new run starts them afresh — so a
  server that spends them with cheap requests locks the site out of nothing but its own
  run. A run's record is dropped once the run was last charged more than ``period_days``
  days ago;
* **per period** (a rolling window of ``period_days`` days): the site's differential-privacy
  spending (each Gaussian release as its noise multiplier; ε is their Rényi-DP
  composition, see :mod:`fedtab.privacy.accountant`), composed over every run of the
  period. ``charge_period`` keeps plain counters per period too (for a cap an operator
  wants across runs), and sets of distinct values (the GBDT bin edges a site has binned
  each feature at, :meth:`SiteLedger.charge_distinct`).

With a ``path`` the ledger is a small JSON file (``ledger.json`` in the site's state
folder, written atomically after every charge), so it outlives the process: a Flower
ClientApp started afresh for every message and a restarted site read it back. Without a
path it lives in the site's state (``store``: a function returning the dict to keep it
in — ``Site.state["ledger"]``, which an engine keeps for the length of a run) or in the
object itself: an in-process simulation, where the job owner holds every site anyway.

Every ``charge_*`` method either records the charge and returns ``None`` or, when the
charge would pass the cap, records nothing and returns the refusal reason (the site
answers with a refusal naming the cap).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

__all__ = ["SiteLedger", "LEDGER_FILE", "LedgerError"]

#: file name of a site's ledger inside its state folder.
LEDGER_FILE = "ledger.json"
_VERSION = 1


class LedgerError(ValueError):
    """The ledger file cannot be read or written (the site refuses to answer without it)."""


def _today(clock: Callable[[], float]) -> str:
    return _dt.datetime.fromtimestamp(clock(), _dt.timezone.utc).date().isoformat()


class SiteLedger:
    """A site's ledger (see the module docstring).

    Args:
        path: the JSON file (its folder is created); ``None`` keeps the ledger in memory.
        store: without ``path``, returns the dict the ledger lives in (created empty on
            first use); ``None`` keeps it in this object.
        period_days: length of the rolling period of the per-period counters and of the
            differential-privacy budget.
        clock: seconds since the epoch (tests pass a fake clock).

    Raises:
        LedgerError: the file exists but is not a ledger this version can read.
    """

    def __init__(self, path: str | Path | None = None, *, store: Callable[[], dict[str, Any]] | None = None,
                 period_days: int = 365, clock: Callable[[], float] | None = None) -> None:
        import time

        if not isinstance(period_days, int) or isinstance(period_days, bool) or period_days < 1:
            raise ValueError(f"ledger period_days must be a positive integer, got {period_days!r}")
        self.path = None if path is None else Path(path)
        self.period_days = period_days
        self._clock = clock or time.time
        self._lock = threading.RLock()
        self._pending: dict[str, Any] | None = None
        self._before: dict[str, Any] | None = None  # the stored ledger a pending block copied
        self._memory: dict[str, Any] = self._empty()
        self._store_fn = store

    @staticmethod
    def _empty() -> dict[str, Any]:
        return {"version": _VERSION, "runs": {}, "days": {}}

    # ----- storage ------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        if self._pending is _UNREAD:  # a pending block's first look: its copy of the ledger
            self._before = self._read()
            self._pending = _copy_ledger(self._before)
        if self._pending is not None:
            return self._pending
        return self._read()

    def _read(self) -> dict[str, Any]:
        if self.path is None and self._store_fn is not None:
            data = self._store_fn()
            if data.get("version") != _VERSION:
                data.clear()
                data.update(self._empty())
            return data
        if self.path is None:
            return self._memory
        if not self.path.is_file():
            return self._empty()
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise LedgerError(f"the site ledger {self.path} cannot be read ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("runs"), dict) \
                or not isinstance(data.get("days"), dict) or not isinstance(data.get("run_days", {}), dict):
            raise LedgerError(f"{self.path} is not a fedtab site ledger (version {_VERSION})")
        return data

    def _store(self, data: dict[str, Any]) -> None:
        if self._pending is not None:
            return  # written when the pending request is accepted (:meth:`pending`)
        self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        if self.path is None and self._store_fn is not None:
            target = self._store_fn()
            if target is not data:
                target.clear()
                target.update(data)
            return
        if self.path is None:
            if self._store_fn is None:
                self._memory = data
            return  # a store's dict was changed in place
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            raise LedgerError(f"the site ledger {self.path} cannot be written ({exc})") from None

    @contextlib.contextmanager
    def pending(self) -> Iterator[Callable[[], None]]:
        """Check before apply: the charges made inside the block go to a copy of the ledger, which
        is written only if the block calls the ``accept`` function it is given; otherwise
        (a refusal, an exception) the ledger is left as it was. Blocks of other threads wait.
        Nested blocks join the outer one."""
        with self._lock:
            if self._pending is not None:
                yield lambda: None
                return
            accepted = []
            self._pending = _UNREAD  # copied on the block's first look (most requests charge nothing)
            try:
                yield lambda: accepted.append(True)
            finally:
                data, self._pending = self._pending, None
            # the stored ledger is not changed inside the block (the charges go to the copy)
            before, self._before = self._before, None
            if accepted and data is not _UNREAD and data != before:
                self._write(data)

    def _window(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The day records inside the current period (older days are dropped when stored)."""
        cutoff = (_dt.date.fromisoformat(_today(self._clock)) - _dt.timedelta(days=self.period_days - 1)).isoformat()
        return [v for k, v in data["days"].items() if k >= cutoff]

    def _prune(self, data: dict[str, Any]) -> None:
        cutoff = (_dt.date.fromisoformat(_today(self._clock)) - _dt.timedelta(days=self.period_days - 1)).isoformat()
        data["days"] = {k: v for k, v in data["days"].items() if k >= cutoff}

    # ----- counters -----------------------------------------------------------------
    def run_count(self, run: str, key: str) -> int:
        """How often ``key`` was charged in ``run``."""
        with self._lock:
            return int(self._load()["runs"].get(str(run), {}).get(key, 0))

    def period_count(self, key: str) -> int:
        """How often ``key`` was charged in the current period."""
        with self._lock:
            return sum(int(d.get("counts", {}).get(key, 0)) for d in self._window(self._load()))

    def charge_run(self, run: str, key: str, cap: int, what: str, n: int = 1, cap_name: str = "cap") -> str | None:
        """Count ``n`` more ``key`` in ``run`` unless that passes ``cap``; the refusal names
        ``what`` and the policy setting ``cap_name``."""
        with self._lock:
            data = self._load()
            runs = data["runs"].setdefault(str(run), {})
            used = int(runs.get(key, 0))
            if used + n > cap:
                return f"{what}: {used} answered in this run, the site's cap is {cap_name}={cap}"
            runs[key] = used + n
            self._prune_runs(data, str(run))
            self._store(data)
        return None

    def _prune_runs(self, data: dict[str, Any], run: str) -> None:
        """Mark ``run`` as charged today and drop the runs last charged before the period
        (a file with runs but no ``run_days``, from an older fedtab, keeps them until charged)."""
        today = _today(self._clock)
        cutoff = (_dt.date.fromisoformat(today) - _dt.timedelta(days=self.period_days - 1)).isoformat()
        seen = data.setdefault("run_days", {})
        seen[run] = today
        for old in [r for r, day in seen.items() if str(day) < cutoff]:
            seen.pop(old, None)
            data["runs"].pop(old, None)

    def charge_period(self, key: str, cap: int | None, what: str, n: int = 1, cap_name: str = "cap") -> str | None:
        """Count ``n`` more ``key`` in today's record unless the period's total passes ``cap``
        (the refusal names ``what`` and the policy setting ``cap_name``)."""
        with self._lock:
            data = self._load()
            self._prune(data)
            used = sum(int(d.get("counts", {}).get(key, 0)) for d in data["days"].values())
            if cap is not None and used + n > cap:
                return (f"{what}: {used} answered in the last {self.period_days} days, the site's cap is "
                        f"{cap_name}={cap}")
            day = data["days"].setdefault(_today(self._clock), {})
            day.setdefault("counts", {})[key] = int(day.get("counts", {}).get(key, 0)) + n
            self._store(data)
        return None

    def charge_distinct(self, values: Mapping[str, Iterable[str]], cap: int, what: str,
                        cap_name: str = "cap") -> str | None:
        """Record, per ``key`` of ``values``, the values not yet seen in the current period
        unless some key would then hold more than ``cap`` distinct values (all or nothing:
        the refusal names ``what``, the key and the policy setting ``cap_name``)."""
        with self._lock:
            data = self._load()
            self._prune(data)
            seen: dict[str, set[str]] = {}
            for day in data["days"].values():
                for key, vals in day.get("distinct", {}).items():
                    seen.setdefault(key, set()).update(vals)
            new = {str(k): set(map(str, v)) - seen.get(str(k), set()) for k, v in values.items()}
            for key, fresh in new.items():
                used = len(seen.get(key, ()))
                if fresh and used + len(fresh) > cap:
                    return (f"{what} {key!r}: {used} distinct in the last {self.period_days} days and "
                            f"{len(fresh)} new, the site's cap is {cap_name}={cap}")
            if any(new.values()):
                day = data["days"].setdefault(_today(self._clock), {}).setdefault("distinct", {})
                for key, fresh in new.items():
                    if fresh:
                        day[key] = sorted(set(day.get(key, ())) | fresh)
                self._store(data)
        return None

    # ----- differential privacy -----------------------------------------------------
    def dp_releases(self, delta: float) -> dict[float, int]:
        """``{noise multiplier: releases}`` of the current period at ``delta``."""
        out: dict[float, int] = {}
        with self._lock:
            for day in self._window(self._load()):
                for z, n in day.get("dp", {}).get(repr(float(delta)), []):
                    out[float(z)] = out.get(float(z), 0) + int(n)
        return out

    def epsilon_spent(self, delta: float) -> float:
        """ε of the current period's releases at ``delta`` (0 when there were none)."""
        from .accountant import epsilon_of

        releases = self.dp_releases(delta)
        return epsilon_of(1.0, releases, delta) if releases else 0.0

    def charge_dp(self, z: float, releases: int, delta: float, budget: float) -> str | None:
        """Record ``releases`` Gaussian releases at noise multiplier ``z`` unless the period's
        composition would then spend more than ``budget`` at ``delta``."""
        from .accountant import epsilon_of

        if not (z > 0 and math.isfinite(z)) or releases < 1:
            raise ValueError(f"a DP charge needs a positive finite multiplier and releases >= 1, got {z!r}, {releases!r}")
        with self._lock:
            data = self._load()
            self._prune(data)
            planned: dict[float, int] = {}
            for day in data["days"].values():
                for zz, n in day.get("dp", {}).get(repr(float(delta)), []):
                    planned[float(zz)] = planned.get(float(zz), 0) + int(n)
            planned[float(z)] = planned.get(float(z), 0) + int(releases)
            eps = epsilon_of(1.0, planned, delta)
            if eps > budget:
                return (f"differential privacy: these {releases} release(s) would bring the site's spending in the last "
                        f"{self.period_days} days to epsilon={eps:.3g}, over its budget {budget:g} (delta={delta:g})")
            day = data["days"].setdefault(_today(self._clock), {})
            entries = day.setdefault("dp", {}).setdefault(repr(float(delta)), [])
            for entry in entries:
                if entry[0] == float(z):
                    entry[1] = int(entry[1]) + int(releases)
                    break
            else:
                entries.append([float(z), int(releases)])
            self._store(data)
        return None

    def snapshot(self) -> dict[str, Any]:
        """The ledger's content (a copy), for the site operator's report."""
        with self._lock:
            return json.loads(json.dumps(self._load()))

    # ----- distinct values per run, releases fixed per period --------------------------
    def run_distinct(self, run: str, key: str) -> list[str]:
        """The distinct values recorded under ``key`` in ``run`` (the models of :meth:`charge_evaluations`
        under ``models:<part>``)."""
        with self._lock:
            return list(self._load().get("run_distinct", {}).get(str(run), {}).get(key, []))

    def charge_evaluations(self, run: str, counts: Mapping[str, int], cap: int, *,
                           models: Mapping[str, Iterable[str]] | None = None, model_cap: int | None = None,
                           model_cap_name: str = "cap") -> str | None:
        """Count ``counts[part]`` more evaluations of every part in ``run`` and record the distinct
        models ``models[part]`` (digests) scored on it, all or nothing, under one lock.

        Refused (nothing recorded, the reason returned) when a part's evaluations would pass
        ``cap`` (``max_evaluations``), or, with ``model_cap``, when a part would then hold more
        than ``model_cap`` distinct models in the run (a model recorded before is free). Without
        ``model_cap`` the models are not recorded (an answer inside a secure sum or with DP)."""
        run = str(run)
        with self._lock:
            data = self._load()
            runs = data["runs"].get(run, {})
            for part, n in counts.items():
                used = int(runs.get(f"evaluate:{part}", 0))
                if used + int(n) > cap:
                    return (f"evaluations of part {part!r}: {used} answered in this run and {int(n)} asked, the "
                            f"site's cap is max_evaluations={cap}")
            fresh: dict[str, list[str]] = {}
            if model_cap is not None and models:
                seen_run = data.get("run_distinct", {}).get(run, {})
                for part, digests in models.items():
                    seen = seen_run.get(f"models:{part}", [])
                    new = [d for d in dict.fromkeys(map(str, digests)) if d not in set(seen)]
                    if new and len(seen) + len(new) > model_cap:
                        return (f"models evaluated on part {part!r}: {len(seen)} distinct in this run and "
                                f"{len(new)} new, the site's cap is {model_cap_name}={model_cap}")
                    if new:
                        fresh[part] = new
            if not any(int(n) for n in counts.values()) and not fresh:
                return None
            runs = data["runs"].setdefault(run, {})
            for part, n in counts.items():
                runs[f"evaluate:{part}"] = int(runs.get(f"evaluate:{part}", 0)) + int(n)
            if fresh:
                store = data.setdefault("run_distinct", {}).setdefault(run, {})
                for part, new in fresh.items():
                    store.setdefault(f"models:{part}", []).extend(new)
            self._prune_runs(data, run)
            for old in [r for r in data.get("run_distinct", {}) if r not in data.get("run_days", {})]:
                data["run_distinct"].pop(old, None)
            self._store(data)
        return None

    def fixed_value(self, key: str) -> Any:
        """The value :meth:`fixed_release` recorded under ``key`` in the current period, or
        ``None`` (nothing is recorded)."""
        with self._lock:
            data = self._load()
            self._prune(data)
            return _recorded(data, key, None)

    def fixed_release(self, key: str, make: Callable[[], Any]) -> Any:
        """The value released under ``key`` in the current period: the one recorded, else
        ``make()`` (JSON-able), recorded today and returned. So every request of a period gets
        the same answer, whatever changed in between (a release the site fixed once)."""
        with self._lock:
            data = self._load()
            self._prune(data)
            recorded = _recorded(data, key, _MISSING)
            if recorded is not _MISSING:
                return recorded
            value = json.dumps(make())  # recorded as its own copy: never changed in place after this
            data["days"].setdefault(_today(self._clock), {}).setdefault("fixed", {})[key] = json.loads(value)
            self._store(data)
            return json.loads(value)


#: a pending block's ledger before its first look (:meth:`SiteLedger.pending`)
_UNREAD: Any = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars); a list of scalars is copied in one step."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return list(value) if set(map(type, value)) <= _SCALARS else [_copy(v) for v in value]
    return value


#: a day's records whose values are replaced, never changed in place: a pending block's copy shares them
_REPLACED_ONLY = frozenset({"fixed", "distinct"})


def _copy_ledger(data: Any) -> Any:
    """A pending block's copy of a ledger: :func:`_copy`, except that each day's fixed releases and
    distinct released values are shared with ``data`` (their dicts are copied, their values are
    not). A fixed release is recorded once (:meth:`SiteLedger.fixed_release`; readers get a copy)
    and a key's distinct values are replaced by a new sorted list (:meth:`SiteLedger.charge_distinct`):
    neither is changed in place. Together they are most of a GBDT run's ledger (a sketch grid and
    the released edges per column), which a pending block copied on every level request."""
    days = data.get("days") if isinstance(data, dict) else None
    if not isinstance(days, dict) or not all(isinstance(d, dict) for d in days.values()):
        return _copy(data)
    out = {k: _copy(v) for k, v in data.items() if k != "days"}
    out["days"] = {day: {k: (dict(v) if k in _REPLACED_ONLY and isinstance(v, dict) else _copy(v))
                         for k, v in rec.items()} for day, rec in days.items()}
    return out


#: "nothing recorded" for :func:`_recorded` (a recorded value may itself be ``None``)
_MISSING = object()


def _recorded(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """A copy of the value recorded under ``key`` by :meth:`SiteLedger.fixed_release` on any day kept
    in ``data`` (the earliest), or ``default``."""
    for day in sorted(data["days"]):
        fixed = data["days"][day].get("fixed", {})
        if key in fixed:
            return json.loads(json.dumps(fixed[key]))
    return default
