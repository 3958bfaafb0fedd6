"""A site whose table is read only when a request needs it.

An engine that starts a new process for every message (a Flower SuperNode runs each
message in a fresh ``flwr-clientapp``) would otherwise read the site's file, and import
pandas, for every message. Most later steps need no table: a FedAvg round and the
evaluation work on the standardised matrices that the first round stores in
``Site.state`` (``train_setup["_cache"]``), and the policy checks need only row counts.
:class:`LazySite` answers such requests without reading the file; the first attribute
that needs the table loads the real :class:`~fedtab.federation.site.core.Site` (which replays
the agreed table steps) and every later access goes to it.
"""

from __future__ import annotations

from typing import Any, Callable

from fedtab.federation.site.core import Site

__all__ = ["LazySite"]

#: ``Site.state`` key of the row counts a loaded site recorded: ``{"parts": {part: rows},
#: "classes": {part: {label: rows}}, "steps"}`` (``steps`` = table steps applied when counted).
ROWS_KEY = "site_rows"


class LazySite(Site):
    """A :class:`Site` built by ``load()`` on first use of its table.

    Args:
        name: the site's name (known without reading anything).
        load: builds the real site (reads its file); called at most once.
        target, policy: as :class:`Site` (the policy is checked before the table is read).

    ``state`` is shared with the real site once loaded. Row counts for the policy checks
    come from ``state["site_rows"]`` (written when the real site loads) while no table step
    was agreed since; otherwise the site loads. When it reads its table for the ballot it
    also stores its numeric matrices (``keeps_matrices``), so ``set_mask`` and the first
    FedAvg round need neither the file nor pandas.
    """

    keeps_matrices = True

    def __init__(self, name: str, load: Callable[[], Site], *, target: str | None = None, policy: Any = None,
                 ledger: Any = None) -> None:
        # Site.__init__ is not called: it validates and splits a table this object does not read yet.
        from fedtab.privacy.policy import policy_from_config
        from fedtab.federation.site.core import site_ledger

        self.__dict__.update(name=str(name), target=target, policy=policy_from_config(policy), _load=load,
                             _site=None, _state={}, run_id=Site.run_id)
        self.__dict__["ledger"] = ledger if ledger is not None else site_ledger(self)

    # ----- the real site ------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether the table has been read."""
        return self._site is not None

    def real(self) -> Site:
        """The real site (read on first call; its recorded table steps replayed)."""
        if self._site is None:
            site = self._load()
            if site.name != self.name:
                raise ValueError(f"site {self.name!r}: the loaded site is named {site.name!r}")
            site.state = self._state
            site.ledger, site.run_id = self.ledger, self.run_id  # the site's ledger, whatever reads the table
            site.replay_table_steps()
            self.__dict__["_site"] = site
            sizes = site.part_sizes()
            self._state[ROWS_KEY] = {"parts": sizes, "classes": {p: site.class_counts(p) for p in sizes},
                                     "steps": len(self._state.get("table_steps") or []),
                                     "target_kind": site.target_kind}
        return self._site

    def __getattr__(self, name: str) -> Any:  # attributes only the loaded site has (table, _split, selector ...)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "state":
            self.__dict__["_state"] = value
            if self._site is not None:
                self._site.state = value
        elif name in ("name", "target", "policy", "ledger", "run_id", "identity"):
            self.__dict__[name] = value
            if name in ("ledger", "run_id") and self._site is not None:
                setattr(self._site, name, value)
        else:  # table, _steps_applied ...: the loaded site's
            setattr(self.real(), name, value)

    @property
    def state(self) -> dict[str, Any]:  # type: ignore[override]
        return self._state

    # ----- what works without the table ---------------------------------------------
    def _recorded(self) -> dict[str, Any] | None:
        counts = self._state.get(ROWS_KEY)
        if (self._site is None and isinstance(counts, dict) and isinstance(counts.get("parts"), dict)
                and counts.get("steps") == len(self._state.get("table_steps") or [])):
            return counts
        return None

    def n_rows(self, part: str) -> int:
        from fedtab.federation.site.parts import canonical_part

        counts = self._recorded()
        name = canonical_part(part)
        if counts is not None and name in counts["parts"]:
            return int(counts["parts"][name])
        return self.real().n_rows(part)

    def class_counts(self, part: str) -> dict[str, int]:
        from fedtab.federation.site.parts import canonical_part

        counts = self._recorded()
        name = canonical_part(part)
        if counts is not None and name in counts.get("classes", {}):
            return {str(k): int(v) for k, v in counts["classes"][name].items()}
        return self.real().class_counts(part)

    @property
    def target_kind(self) -> str:
        """How the site reads its target (``"classes"`` / ``"regression"``), recorded when the table
        was read, so a later message need not read it again."""
        counts = self._recorded()
        if counts is not None and counts.get("target_kind") in ("classes", "regression"):
            return str(counts["target_kind"])
        return self.real().target_kind

    def part_sizes(self) -> dict[str, int]:
        counts = self._recorded()
        return dict(counts["parts"]) if counts is not None else self.real().part_sizes()

    def _features(self) -> tuple[tuple[str, ...], frozenset[str]]:
        return self.real()._features()

    def replay_table_steps(self) -> None:
        if self._site is not None:  # else: replayed when (if) the table is read
            self._site.replay_table_steps()

    def apply_table_step(self, kind: str, params: dict[str, Any]):  # noqa: ANN201 - as Site
        return self.real().apply_table_step(kind, params)

    def __repr__(self) -> str:
        return repr(self._site) if self._site is not None else f"LazySite({self.name!r}, not read yet)"
