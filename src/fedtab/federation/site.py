"""A site: one organisation's local table and the handlers that answer requests.

A :class:`Site` never sends rows. It answers a request :class:`Message` by looking up
the handler registered for the request's ``kind`` (see :func:`handler`) and calling
it with itself and the request. Handlers are thin: they call the pure algorithm
functions in ``fedtab.election`` / ``fedtab.learn`` / ``fedtab.impute`` on the local
data and pack the result into a reply. State that must survive between requests
(the elected mask, the agreed class list, ...) lives in :attr:`Site.state`.
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..privacy.policy import policy_from_config
from ..privacy.secagg import SECAGG_META
from .messages import Message

if TYPE_CHECKING:  # pandas is imported where a table is used: a Flower ClientApp answering
    import pandas as pd  # a step from cached arrays never pays for it

__all__ = ["Site", "handler", "HANDLERS", "HANDLER_HOMES", "TABLE_STEPS", "table_step", "find_handler",
           "find_table_step"]

log = logging.getLogger("fedtab.site")

Handler = Callable[["Site", Message], Message]

#: kind -> handler; filled by the workflow modules when they are imported (all of them
#: when ``fedtab.federation`` is, or one on demand by :func:`find_handler`).
HANDLERS: dict[str, Handler] = {}

#: module -> the handler and table-step kinds it registers. :func:`find_handler` imports
#: only the module a request needs, so a process that answers one message (a Flower
#: ClientApp) does not import every workflow. ``tests/engines/test_lean_client.py`` checks that
#: this table equals what the modules register.
HANDLER_HOMES: dict[str, tuple[str, ...]] = {
    "fedtab.federation.baseline_flow": ("local_baseline",),
    "fedtab.federation.election_flow": ("ballot", "set_mask"),
    "fedtab.federation.encoding_flow": ("category_sets", "one_hot"),
    "fedtab.federation.impute_flow": ("impute_schema", "impute_setup", "impute_stats", "impute_fit", "impute_eval",
                                      "impute_apply", "impute_fill"),
    "fedtab.federation.pooled_anova_flow": ("class_moments",),
    "fedtab.federation.profile_flow": ("job_profile",),
    "fedtab.federation.schema": ("schema",),
    "fedtab.federation.score_test_flow": ("score_sums",),
    "fedtab.federation.secure_flow": ("secagg_keys", "secagg_sign", "secagg_unmask"),
    "fedtab.federation.training_flow": ("describe", "setup", "fit", "evaluate"),
    "fedtab.federation.tuning_flow": ("ballot_fit", "split_validation"),
}
_HOME_OF = {kind: module for module, kinds in HANDLER_HOMES.items() for kind in kinds}


TableStep = Callable[["Site", dict[str, Any]], "pd.DataFrame"]

#: kind -> ``fn(site, params) -> new table``: changes of a site's table that a workflow
#: agreed (one-hot encoding, imputation). See :meth:`Site.apply_table_step`.
TABLE_STEPS: dict[str, TableStep] = {}


def table_step(kind: str) -> Callable[[TableStep], TableStep]:
    """Register ``fn(site, params) -> table`` as the table change named ``kind``."""

    def register(fn: TableStep) -> TableStep:
        TABLE_STEPS[kind] = fn
        return fn

    return register


def _registered(registry: dict[str, Any], kind: str) -> Any:
    fn = registry.get(kind)
    home = _HOME_OF.get(kind)
    if fn is None and home is not None:
        try:
            importlib.import_module(home)
        except ImportError as exc:  # e.g. imputation without torch: the caller reports the unknown kind
            log.debug("handler module %s of %r cannot be imported: %s", home, kind, exc)
        fn = registry.get(kind)
    return fn


def find_handler(kind: str) -> Handler | None:
    """The handler registered for ``kind``, importing its workflow module if needed; ``None``
    if there is none."""
    return _registered(HANDLERS, kind)


def find_table_step(kind: str) -> TableStep | None:
    """The table step registered as ``kind``, importing its workflow module if needed."""
    return _registered(TABLE_STEPS, kind)


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register ``fn(site, request) -> reply`` as the site-side handler for ``kind``."""

    def register(fn: Handler) -> Handler:
        if kind in HANDLERS and HANDLERS[kind] is not fn:
            raise ValueError(f"a handler for {kind!r} is already registered")
        HANDLERS[kind] = fn
        return fn

    return register


class Site:
    """One participant's local data plus its per-site state.

    Args:
        name: the site's name, used in every error message about it.
        table: the local table; columns are identified by name. NaN = missing cell.
        target: name of the label column (``None`` for unsupervised work such as imputation).
        test_size: fraction of rows held out as the site's test split (stratified by the
            target when possible). ``0`` keeps every row for training.
        seed: seed of the train/test split.
        selector: the feature selector this site trusts: a name from
            ``fedtab.election.selectors.SELECTORS`` or a selector object. A request may
            override it.
        policy: the site's :class:`~fedtab.privacy.DisclosurePolicy` (default: the
            default policy, ``min_rows=10``), or a dict of its settings. Every request
            passes it before its handler runs; a request outside it gets a refusal.

    Rows whose target is missing are dropped before the split; their number is kept in
    :attr:`unlabelled_rows`.

    Raises:
        ValueError: empty table, missing target column, duplicate column names,
            ``test_size`` outside ``[0, 1)``, no labelled row.
    """

    #: the site's :class:`~fedtab.privacy.identity.SiteIdentity` (identity key and verified
    #: consortium key list) for secure aggregation; set by whoever builds the site, never by
    #: a request. ``None``: the site refuses to take part in secure sums.
    identity: Any = None

    #: whether the site keeps its numeric matrices in ``state`` when it reads its table for
    #: the ballot (:func:`fedtab.federation.training_flow.store_part_matrices`): only worth
    #: it for a site rebuilt in a fresh process per message (a :class:`LazySite`)
    keeps_matrices: bool = False

    def __init__(
        self,
        name: str,
        table: pd.DataFrame,
        target: str | None = None,
        *,
        test_size: float = 0.2,
        seed: int = 0,
        selector: Any = "lasso",
        policy: Any = None,
    ) -> None:
        import pandas as pd

        if not isinstance(table, pd.DataFrame):
            raise ValueError(f"site {name!r}: table must be a pandas DataFrame, got {type(table).__name__}")
        if len(table) == 0:
            raise ValueError(f"site {name!r}: the table has no rows")
        if table.columns.duplicated().any():
            dups = sorted(set(table.columns[table.columns.duplicated()].astype(str)))
            raise ValueError(f"site {name!r}: duplicate column names {dups}")
        if target is not None and target not in table.columns:
            raise ValueError(f"site {name!r}: target column {target!r} is not in the table")
        if not 0 <= test_size < 1:
            raise ValueError(f"site {name!r}: test_size must be in [0, 1), got {test_size}")
        self.unlabelled_rows = 0
        if target is not None:
            labelled = table[target].notna().to_numpy()
            self.unlabelled_rows = int((~labelled).sum())
            table = table[labelled]
            if len(table) == 0:
                raise ValueError(f"site {name!r}: no row has a value in the target column {target!r}")
        self.name = str(name)
        self.table = table.reset_index(drop=True)
        self._steps_applied = 0
        self.target = target
        self.test_size = float(test_size)
        self.seed = int(seed)
        self.selector = selector
        self.policy = policy_from_config(policy)
        self.state: dict[str, Any] = {}
        self._split = self._make_split()

    # ----- data views ---------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        """The site's feature columns (everything but the target), in table order."""
        return list(self._features()[0])

    @property
    def feature_set(self) -> frozenset[str]:
        """The site's feature columns as a set: O(1) membership tests for handlers that
        check many requested names (``f in site.feature_names`` would be O(d) each)."""
        return self._features()[1]

    def _features(self) -> tuple[tuple[str, ...], frozenset[str]]:
        # Built once per column index (not per access): iterating a wide pandas index
        # costs ~1 ms per 1,000 columns, and handlers ask for it once per requested name.
        key = (self.table.columns, self.target)
        cached = self.__dict__.get("_feature_cache")
        if cached is None or cached[0][0] is not key[0] or cached[0][1] != key[1]:
            names = tuple(str(c) for c in self.table.columns.tolist() if c != self.target)
            cached = (key, names, frozenset(names))
            self._feature_cache = cached
        return cached[1], cached[2]

    def _make_split(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.table)
        idx = np.arange(n)
        if self.test_size == 0 or n < 2:
            return idx, idx[:0]
        rng = np.random.default_rng(self.seed)
        if self.target is not None:
            y = self.table[self.target].to_numpy()
            train, test = [], []
            import pandas as pd

            for cls in pd.unique(y):
                members = rng.permutation(idx[y == cls])
                k = int(round(len(members) * self.test_size))
                if len(members) >= 2:
                    k = min(max(k, 1), len(members) - 1)
                else:
                    k = 0
                test.append(members[:k])
                train.append(members[k:])
            tr, te = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
        else:
            perm = rng.permutation(idx)
            k = int(round(n * self.test_size))
            te, tr = np.sort(perm[:k]), np.sort(perm[k:])
        return tr, te

    def n_rows(self, part: str) -> int:
        """Number of rows of ``part`` (``"train"``, ``"test"`` or ``"all"``).

        Raises:
            ValueError: unknown part.
        """
        if part == "all":
            return len(self.table)
        if part in ("train", "test"):
            return len(self._split[0 if part == "train" else 1])
        raise ValueError(f"unknown part {part!r}; expected 'train', 'test' or 'all'")

    def rows(self, part: str) -> pd.DataFrame:
        """``part`` = ``"train"``, ``"test"`` or ``"all"``: that slice of the table."""
        if part == "all":
            return self.table
        if part == "train":
            return self.table.iloc[self._split[0]]
        if part == "test":
            return self.table.iloc[self._split[1]]
        raise ValueError(f"unknown part {part!r}; expected 'train', 'test' or 'all'")

    def xy(self, part: str = "train", columns: list[str] | None = None) -> tuple[pd.DataFrame, np.ndarray]:
        """Features (optionally only ``columns``) and target of one part of the table."""
        if self.target is None:
            raise ValueError(f"site {self.name!r} has no target column")
        rows = self.rows(part)
        cols = self.feature_names if columns is None else columns
        held = self.feature_set
        missing = [c for c in cols if c not in held and c not in rows.columns]
        if missing:
            raise ValueError(f"site {self.name!r}: columns {missing[:5]} are not in its table")
        return rows[cols], rows[self.target].to_numpy()

    # ----- agreed changes of the table ------------------------------------------------
    def apply_table_step(self, kind: str, params: dict[str, Any]) -> pd.DataFrame:
        """Change the table with the registered step ``kind`` and record it in ``state``.

        The record (``state["table_steps"]``: kind + arrays/JSON params) lets a site
        rebuilt from its raw file in a new process (a Flower ClientApp per message)
        replay the same changes before its next request (:meth:`replay_table_steps`).

        Raises:
            ValueError: unknown step kind, or as the step function.
        """
        fn = find_table_step(kind)
        if fn is None:
            raise ValueError(f"unknown table step {kind!r}; known: {sorted(TABLE_STEPS)}")
        self.replay_table_steps()
        self.table = fn(self, params)
        self.state.setdefault("table_steps", []).append({"kind": kind, "params": params})
        self._steps_applied += 1
        return self.table

    def replay_table_steps(self) -> None:
        """Apply the recorded table steps this object has not applied yet (after a restart)."""
        steps = self.state.get("table_steps") or []
        for step in steps[self._steps_applied:]:
            fn = find_table_step(step["kind"])
            if fn is None:
                raise ValueError(f"unknown table step {step['kind']!r} in the stored state")
            self.table = fn(self, step["params"])
            self._steps_applied += 1

    # ----- protocol -----------------------------------------------------------------
    def handle(self, request: Message) -> Message:
        """Answer one request. Never raises: whatever the handler raises -- even
        ``SystemExit`` or ``KeyboardInterrupt`` -- becomes an error reply (only an
        interpreter that is shutting down is let go). A request the site's disclosure
        policy does not allow gets a refusal (nothing is computed).

        Schema protocol (:mod:`fedtab.federation.schema`): an agreed schema riding on the
        request is stored in ``state["schema"]`` before the handler runs; a request
        flagged ``schema:declare`` gets this site's declaration added to its reply.
        """
        from .schema import AGREED, DECLARE, DECLARED, declare

        fn = find_handler(request.kind)
        if fn is None:
            return Message.error(f"site {self.name!r} has no handler for {request.kind[:80]!r}")
        try:
            self.replay_table_steps()
            meta = request.meta
            if AGREED in meta or DECLARE in meta:
                if isinstance(meta.get(AGREED), dict):
                    self.state["schema"] = meta[AGREED]
                request = Message(request.kind, request.arrays,
                                  {k: v for k, v in meta.items() if k not in (AGREED, DECLARE)})
            reason = self.policy.refusal(self, request)  # request -> site policy -> handler
            if reason is not None:
                log.info("site %s refuses %s: %s", self.name, request.kind, reason)
                return Message.refusal(reason)
            reply = fn(self, request)
            if not isinstance(reply, Message):
                raise TypeError(f"the {request.kind!r} handler returned {type(reply).__name__}, not a Message")
            if SECAGG_META in request.meta and not (reply.is_error or reply.is_refusal):
                from ..privacy.secagg import mask_reply

                reply = mask_reply(self, request, reply)  # handler -> [secure masking] -> wire
            if meta.get(DECLARE) and not reply.is_error:
                reply = Message(reply.kind, reply.arrays, {**reply.meta, DECLARED: declare(self)})
            return reply
        except BaseException as exc:  # noqa: BLE001 - reported to the server, never ends it
            if sys.is_finalizing():
                raise
            log.debug("site %s failed on %s:\n%s", self.name, request.kind, traceback.format_exc())
            return Message.error(f"{type(exc).__name__}: {str(exc)[:2000]}")

    def __repr__(self) -> str:
        return f"Site({self.name!r}, rows={len(self.table)}, features={len(self.feature_names)}, target={self.target!r})"
