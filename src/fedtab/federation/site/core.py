"""A site: one organisation's local table and the handlers that answer requests.

A :class:`Site` never sends rows. It answers a request :class:`Message` by looking up
the handler registered for the request's ``kind`` (see :func:`handler`) and calling
it with itself and the request. Handlers are thin: they call the pure algorithm
functions in ``fedtab.election`` / ``fedtab.learn`` / ``fedtab.impute`` on the local
data and pack the result into a reply. State that must survive between requests
(the elected mask, the agreed class list, ...) lives in :attr:`Site.state`.
"""

from __future__ import annotations

import logging
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from fedtab.errors import SiteFault
from fedtab.privacy.gate import Releases, Vocabulary, error_text, release
from fedtab.privacy.ledger import LEDGER_FILE, SiteLedger
from fedtab.privacy.policy import policy_from_config
from fedtab.privacy.dp import DP_META
from fedtab.privacy.secagg import SECAGG_META, left_in_clear, masked_fields
from fedtab.federation.site.rollback import LEDGER_KEY, premask_refusal
from fedtab.federation.protocol.kinds import declared
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.mods import answer
from fedtab.federation.site.registry import (HANDLER_HOMES, HANDLERS, RELEASES, TABLE_STEPS, find_handler, find_releases, find_table_step, handler, table_step)
from fedtab.federation.site.parts import DEFAULT_FOLDS, PartError, RowParts, canonical_part, draw_parts

if TYPE_CHECKING:  # pandas is imported where a table is used: a Flower ClientApp answering
    import pandas as pd  # a step from cached arrays never pays for it

__all__ = ["Site", "RowSplit", "handler", "HANDLERS", "HANDLER_HOMES", "RELEASES", "TABLE_STEPS", "table_step", "find_handler",
           "find_releases", "find_table_step", "LOCAL_RUN"]

log = logging.getLogger("fedtab.site")


#: the run id of a site that no engine gave one (an in-process federation sets its own)
LOCAL_RUN = "local"













def site_ledger(site: "Site", state_dir: Any = None) -> SiteLedger:
    """The ledger of ``site``: a file in ``state_dir`` when given, else kept in ``site.state``
    (which engines keep for a run, e.g. in Flower's ``Context.state``)."""
    if state_dir not in (None, ""):
        return SiteLedger(Path(str(state_dir)) / LEDGER_FILE, period_days=site.policy.period_days)
    return SiteLedger(store=lambda: site.state.setdefault(LEDGER_KEY, {}), period_days=site.policy.period_days)


def _strings(meta: Mapping[str, Any], depth: int = 3) -> set[str]:
    """The keys and string values of a request's meta (three levels deep)."""
    out: set[str] = set()
    stack = [(meta, 0)]
    while stack:
        value, d = stack.pop()
        if isinstance(value, str):
            out.add(value)
        elif isinstance(value, Mapping) and d < depth:
            out.update(map(str, value))
            stack.extend((v, d + 1) for v in value.values())
        elif isinstance(value, list) and d < depth and len(value) <= 10_000:
            stack.extend((v, d + 1) for v in value)
    return out


@dataclass(frozen=True)
class RowSplit:
    """How a site draws its row parts (:mod:`fedtab.federation.site.parts`): ``test_size``, the
    fraction of rows held out as the test part, in ``[0, 1)``; ``seed``, the site's own seed of its
    parts and other draws; ``folds``, the most cross-validation folds of its training rows (a
    non-negative integer). Checked by :class:`Site`."""

    test_size: float = 0.2
    seed: int = 0
    folds: int = DEFAULT_FOLDS


class Site:
    """One participant's local data plus its per-site state.

    Args:
        name: the site's name, used in every error message about it.
        table: the local table; columns are identified by name. NaN = missing cell.
        target: name of the label column (``None`` for unsupervised work such as imputation).
        test_size: fraction of rows held out as the site's test part (stratified by the
            target when possible). ``0`` keeps every row for training.
        seed: the site's own seed of its row parts (:mod:`fedtab.federation.site.parts`) and of
            every other draw it makes (imputation masks); never one a request sends.
        selector: the feature selector this site trusts: a name from
            ``fedtab.election.selectors.SELECTORS`` or a selector object. A request may
            override it.
        policy: the site's :class:`~fedtab.privacy.DisclosurePolicy` (default: the
            default policy, ``min_rows=10``), or a dict of its settings. Every request
            passes it before its handler runs; a request outside it gets a refusal.
        folds: the most cross-validation folds the site draws of its training rows
            (default 5; fewer when its classes are too small for the policy's floor).
        state_dir: folder of the site's ledger (``ledger.json``, :mod:`fedtab.privacy.ledger`):
            what it answered and released, kept across runs and restarts. ``None`` keeps the
            ledger in memory with this object.

        task: how the site reads its target: ``"auto"`` (from its values), ``"classes"`` or
            ``"regression"``.

    ``test_size``, ``seed`` and ``folds`` (how the site draws its row parts) are keyword
    arguments, or together ``split=RowSplit(...)`` (the keywords override its fields).

    Rows whose target is missing are dropped before the parts are drawn; their number is
    kept in :attr:`unlabelled_rows`.

    Raises:
        ValueError: empty table, missing target column, duplicate column names,
            ``test_size`` outside ``[0, 1)``, no labelled row.
        TypeError: an unknown keyword argument.
    """

    #: the site's :class:`~fedtab.privacy.identity.SiteIdentity` (identity key and verified
    #: consortium key list) for secure aggregation; set by whoever builds the site, never by
    #: a request. ``None``: the site refuses to take part in secure sums.
    identity: Any = None

    #: whether the site keeps its numeric matrices in ``state`` when it reads its table for
    #: the ballot (:func:`fedtab.federation.site.matrices.store_part_matrices`): only worth
    #: it for a site rebuilt in a fresh process per message (a :class:`LazySite`)
    keeps_matrices: bool = False
    #: the run the site is answering (set by the engine: Flower's run id, FLARE's job id,
    #: an in-process federation's id); the ledger's per-run caps count per run
    run_id: str = LOCAL_RUN

    def __init__(
        self,
        name: str,
        table: pd.DataFrame,
        target: str | None = None,
        *,
        selector: Any = "lasso",
        policy: Any = None,
        state_dir: Any = None,
        task: str = "auto",
        split: RowSplit | None = None,
        **split_options: Any,
    ) -> None:
        import pandas as pd

        from fedtab._settings import settings_with

        rs = settings_with(RowSplit, split, split_options, "Site")
        test_size, seed, folds = rs.test_size, rs.seed, rs.folds

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
        if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 0:
            raise ValueError(f"site {name!r}: folds must be a non-negative integer, got {folds!r}")
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
        self.folds = int(folds)
        from fedtab.learn.tasks import site_kind

        #: ``"classes"`` or ``"regression"``: how the site reads its target (``task``: told by its
        #: operator or the job; ``"auto"``: :func:`fedtab.learn.tasks.target_kind` of its values).
        #: A regression site declares no class labels and stratifies its parts by target quantile.
        self.target_kind = "classes" if target is None else site_kind(self.table[target].to_numpy(), task)
        self.selector = selector
        self.policy = policy_from_config(policy)
        self.state: dict[str, Any] = {}
        self.ledger = site_ledger(self, state_dir)
        self.parts = self._draw_parts()

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

    def _labels(self) -> np.ndarray | None:
        """The label key of every row (``None`` for an unsupervised site)."""
        if self.target is None or self.target_kind == "regression":
            return None
        from fedtab.federation.site.matrices import label_keys

        return label_keys(self.table[self.target].to_numpy())

    def _draw_parts(self) -> RowParts:
        """The site's fixed parts (:func:`fedtab.federation.site.parts.draw_parts`), from its own seed."""
        values = self.target_values() if self.target_kind == "regression" else None
        return draw_parts(len(self.table), self._labels(), test_size=self.test_size, folds=self.folds,
                          min_rows=self.policy.min_rows, seed=self.seed, values=values)

    def target_values(self) -> np.ndarray:
        """``(n_rows,)`` the target as float64 (a regression site).

        Raises:
            ValueError: a value that is not a finite number (naming no value).
        """
        try:
            y = np.asarray(self.table[self.target].to_numpy(), dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"site {self.name!r}: the target {self.target!r} holds values that are not numbers") \
                from None
        if not np.isfinite(y).all():
            raise ValueError(f"site {self.name!r}: the target {self.target!r} holds values that are not finite")
        return y

    def n_rows(self, part: str) -> int:
        """Number of rows of ``part`` (``"train"``, ``"test"``, ``"all"``, ``"fold:k"``,
        ``"fit:k"``, ``"fit"``, ``"validation"``).

        Raises:
            ValueError: not one of the site's parts.
        """
        return int(len(self.parts.indices(part)))

    def part_sizes(self) -> dict[str, int]:
        """``{part: rows}`` of every part of the site (:meth:`RowParts.sizes`)."""
        return self.parts.sizes()

    def class_counts(self, part: str) -> dict[str, int]:
        """``{label key: rows}`` of ``part`` (empty for an unsupervised site)."""
        labels = self._labels()
        if labels is None:
            return {}
        keys, counts = np.unique(labels[self.parts.indices(part)], return_counts=True)
        return {str(k): int(c) for k, c in zip(keys, counts)}

    def rows(self, part: str) -> pd.DataFrame:
        """That part of the table (see :meth:`n_rows`)."""
        if canonical_part(part) == "all" and not len(self.parts.excluded):
            return self.table
        return self.table.iloc[self.parts.indices(part)]

    def xy(self, part: str = "train", columns: list[str] | None = None) -> tuple[pd.DataFrame, np.ndarray]:
        """Features (optionally only ``columns``) and target of one part of the table."""
        if self.target is None:
            raise SiteFault(f"site {self.name!r} has no target column")
        rows = self.rows(part)
        cols = self.feature_names if columns is None else columns
        held = self.feature_set
        missing = [c for c in cols if c not in held and c not in rows.columns]
        if missing:
            raise SiteFault(f"site {self.name!r}: {len(missing)} requested column(s) are not in its table")
        return rows[cols], rows[self.target].to_numpy()

    # ----- agreed changes of the table ------------------------------------------------
    def apply_table_step(self, kind: str, params: dict[str, Any]) -> pd.DataFrame:
        """Change the table with the registered step ``kind`` and record it in ``state``.

        The record (``state["table_steps"]``: kind + arrays/JSON params) lets a site
        rebuilt from its raw file in a new process (a Flower ClientApp per message)
        replay the same changes before its next request (:meth:`replay_table_steps`).
        A table step keeps the rows (and so the parts).

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
    def vocabulary(self, request: Message | None = None) -> Vocabulary:
        """The public names this site's replies may carry (see :class:`fedtab.privacy.gate.Vocabulary`)."""
        schema = self.state.get("schema")

        def columns() -> list[str]:
            agreed = schema.get("columns") if isinstance(schema, dict) else None
            names = list(agreed) if isinstance(agreed, list) else []
            try:
                from fedtab.federation.site.matrices import held_features

                names += list(held_features(self))
            except Exception:  # noqa: BLE001 - an unreadable table has no names to add
                pass
            return names

        def labels() -> list[str]:
            return list(self.class_counts("all"))

        from fedtab.privacy.policy import OTHER_CATEGORY

        extra = {self.name, "train", "test", "all", "fit", "validation", OTHER_CATEGORY, *HANDLERS}
        if request is not None:  # what the server sent may be echoed: its keys and its strings
            extra.update(_strings(request.meta))
            extra.update(map(str, request.arrays))
            kind = declared(request.kind)  # the array names the reply may carry: protocol words
            if kind is not None:
                decl = kind.releases
                extra.update({*decl.cells, *(a for v in decl.cells.values() for a in v), *decl.histograms,
                              *decl.aggregates, *decl.keys})
        def more() -> list[str]:
            spec = self.selector
            name = spec.get("name") if isinstance(spec, dict) else spec if isinstance(spec, str) else None
            return [str(name)] if name is not None else []

        return Vocabulary(columns, labels, self._category_count, frozenset(map(str, extra)), more)

    def _category_count(self, column: str, category: str) -> int:
        values = self.table[column].dropna().astype(str) if column in self.table.columns else []
        return int((values == category).sum()) if len(values) else 0

    def handle(self, request: Message) -> Message:
        """Answer one request on the site's one release path (:meth:`_answer`). Never raises.

        Check before apply, everywhere: a request that is refused or fails -- before its handler
        or after it (a secure request that would leave a summable array in the clear, a reply the
        gate withholds, a failed masking) -- leaves the site as it was. The ledger's charges of
        the whole request are pending (:meth:`SiteLedger.pending`) until it is answered; a secure
        request's state (``state``, table, applied steps) is snapshot before its handler and put
        back on a late refusal (:func:`fedtab.federation.site.rollback.snapshot`). A plain request
        has no late refusal of its own: its checks (policy, floors, release cap) all run first.
        A fused request (:mod:`fedtab.federation.protocol.piggyback`) is answered part by part
        through this method: each part is charged, refused or rolled back on its own, so a part
        that was answered stays charged whatever happens to the parts after it.
        """
        from fedtab.federation.protocol.piggyback import PARTS, answer_parts
        from fedtab.federation.site.rollback import restore, snapshot

        if PARTS in request.meta:  # a fused request: each part on this same path, charged and rolled back alone
            return answer_parts(request, self.handle)
        with self.ledger.pending() as accept:  # the inner checks' block joins this one
            saved = snapshot(self, request)
            reply = self._answer(request)
            if reply.is_error or reply.is_refusal:
                restore(self, saved)
            else:
                accept()
        return reply

    def _answer(self, request: Message) -> Message:
        """Answer one request (see :meth:`handle`, which rolls a refusal back). Never raises.

        request -> site policy (may refuse) -> the handler's release declaration (none:
        refused; a part below the floors: refused) -> differential privacy on the site's
        own terms (:meth:`dp_terms`) -> handler, in its kind's mods for the request's modes
        (:func:`fedtab.federation.site.mods.answer`) -> the declared DP noise (:meth:`_noised`) -> release gate
        (:func:`fedtab.privacy.gate.release`) -> [secure masking] -> reply.

        Whatever the handler raises -- even ``SystemExit`` -- becomes an error reply whose text
        is :func:`fedtab.privacy.gate.error_text`; the full text goes to the site's log. Only
        an interpreter that is shutting down and ``KeyboardInterrupt`` (the operator's Ctrl-C in
        the process the site runs in: it ends the run, it is not this site's failure) are let go.

        Schema protocol (:mod:`fedtab.federation.protocol.schema`): an agreed schema riding on the
        request is stored in ``state["schema"]`` before the handler runs; a request
        flagged ``schema:declare`` gets this site's declaration added to its reply.
        """
        from fedtab.federation.protocol.schema import AGREED, DECLARE, DECLARED, SCHEMA_HASH
        from fedtab.federation.site.schema import check_request_hash, declare, received_schema, remember_declaration

        fn = find_handler(request.kind)
        if fn is None:
            return Message.error(f"site {self.name!r} has no handler for {request.kind[:80]!r}")
        try:
            self.replay_table_steps()
            meta = request.meta
            kind = declared(request.kind)
            if kind is None:
                return Message.refusal(f"the site's release gate has no declaration for {request.kind[:80]!r}")
            decl = kind.releases
            # check before apply: the checks see the schema the request brings and charge the ledger
            # only if the request is accepted; a refusal (or an error) leaves the site as it was
            had_schema, old_schema = "schema" in self.state, self.state.get("schema")
            accepted = False
            try:
                with self.ledger.pending() as accept:
                    if AGREED in meta or DECLARE in meta or SCHEMA_HASH in meta:
                        if AGREED in meta:  # the server's schema, checked against its hash before it is stored
                            self.state["schema"] = received_schema(self, meta[AGREED])
                        check_request_hash(self, meta)  # a request referring to the schema by position
                        request = Message(request.kind, request.arrays,
                                          {k: v for k, v in meta.items() if k not in (AGREED, DECLARE, SCHEMA_HASH)})
                    # request -> the part's floors -> site policy (caps charged to the ledger) -> DP terms
                    reason = (self._part_refusal(decl, request) or premask_refusal(kind, request)
                              or self.policy.refusal(self, request, kind) or self._charge_release(decl, request))
                    dp = request.meta.get(DP_META)
                    if reason is None and dp is not None:
                        reason, request = self.dp_terms(decl, request)
                    if reason is None:
                        accept()
                        accepted = True
            finally:
                if not accepted:  # the schema the request brought is not kept either
                    if had_schema:
                        self.state["schema"] = old_schema
                    else:
                        self.state.pop("schema", None)
            if reason is not None:
                log.info("site %s refuses %s: %s", self.name, request.kind, reason)
                return Message.refusal(reason)
            reply = answer(kind, self, request, fn)  # handler wrapped in its kind's mods for the request's modes
            if not isinstance(reply, Message):
                raise TypeError(f"the {request.kind!r} handler returned {type(reply).__name__}, not a Message")
            reply = self._noised(decl, request, reply)  # handler -> [the declared DP noise] -> gate
            secure = SECAGG_META in request.meta and not (reply.is_error or reply.is_refusal)
            masked = masked_fields(request.meta) if secure else frozenset()
            if secure:  # masking is the site's decision: every summable array masked, or no reply
                clear = left_in_clear(masked, reply.arrays, kind.summable)
                if clear:
                    reason = (f"the secure-aggregation request for {request.kind!r} leaves summable array(s) "
                              f"{clear[:8]} unmasked; this site masks all of them or answers nothing")
                    log.info("site %s refuses %s: %s", self.name, request.kind, reason)
                    return Message.refusal(reason)
            if not (reply.is_error or reply.is_refusal):
                reply = release(decl, reply, min_rows=self.policy.min_rows, under_dp=dp is not None,
                                vocab=self.vocabulary(request), masked=masked)
            if secure:
                from fedtab.privacy.secagg import mask_reply

                reply = mask_reply(self, request, reply, kind.summable)  # gate -> [secure masking] -> wire
            if meta.get(DECLARE) and not reply.is_error:
                declaration = declare(self)
                self.state[DECLARED] = remember_declaration(self.state.get(DECLARED), list(declaration["columns"]))
                reply = Message(reply.kind, reply.arrays, {**reply.meta, DECLARED: declaration})
            return reply
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to the server, never ends it
            if sys.is_finalizing():
                raise
            log.debug("site %s failed on %s:\n%s", self.name, request.kind, traceback.format_exc())
            try:
                words = self.vocabulary(request).words()
            except BaseException:  # noqa: BLE001 - no names to keep: every quoted token is scrubbed
                words = frozenset()
            return Message.error(error_text(exc, request.kind, words))

    def state_digest(self) -> str:
        """SHA-256 of everything a request can change at the site: its ``state`` (the ledger kept
        in it read through :meth:`SiteLedger.snapshot`), its ledger, its table and its parts. Two
        equal digests: the site is in the same state (tests: a refused request changes none of it)."""
        import hashlib
        import pickle

        state = {k: v for k, v in self.state.items() if k != LEDGER_KEY}
        blob = pickle.dumps((sorted(state), [state[k] for k in sorted(state)], self.ledger.snapshot(),
                             self.table, self.parts, self._steps_applied), protocol=4)
        return hashlib.sha256(blob).hexdigest()

    @staticmethod
    def _noised(decl: Releases, request: Message, reply: Message) -> Message:
        """``reply`` as released under the request's DP settings (on the site's terms, see
        :meth:`dp_terms`) when its kind declares the sensitivities the site noises
        (``Releases.dp_noise``, :func:`fedtab.privacy.dp.noise_release`); otherwise as the
        handler made it (no DP asked for, or a handler that noises its own release)."""
        spec = request.meta.get(DP_META)
        if decl.dp_noise is None or spec is None or reply.is_error or reply.is_refusal:
            return reply
        from fedtab.privacy.dp import noise_release

        sens = {k: float(v(request)) if callable(v) else v for k, v in decl.dp_noise.items()}  # Δ may depend on the request
        return Message(reply.kind, noise_release(reply.arrays, sens, spec), reply.meta)

    def _part_refusal(self, decl: Releases, request: Message) -> str | None:
        """Why the part a reply would be computed over is refused: not a part of the site,
        fewer than ``min_rows`` rows (but some), or (per-class releases) a class present
        with fewer."""
        part = decl.part_of(request, self)
        if part is None:
            return None
        try:
            n = self.n_rows(part)
        except PartError as exc:
            return str(exc)
        floor = self.policy.min_rows
        if 0 < n < floor:  # an empty part has nothing behind it: its reply holds only zeros
            return f"{request.kind} on part {part!r}: it has {n} row(s), fewer than the site's min_rows={floor}"
        if decl.per_class and self.target is not None:
            small = sorted(k for k, c in self.class_counts(part).items() if 0 < c < floor)
            if small:
                return (f"{request.kind} on part {part!r}: {len(small)} class(es) have fewer than the site's "
                        f"min_rows={floor} rows there")
        return None

    def _charge_release(self, decl: Releases, request: Message) -> str | None:
        """Charge one release over the request's part (``max_releases_per_part``) before the
        handler runs; the refusal, or ``None`` (the charge stays pending until the reply leaves)."""
        part = decl.part_of(request, self)
        if part is None:
            return None
        return self.ledger.charge_run(self.run_id, f"release:{canonical_part(part)}",
                                      self.policy.max_releases_per_part, f"releases over part {part!r}",
                                      cap_name="max_releases_per_part")

    def dp_terms(self, decl: Releases, request: Message) -> tuple[str | None, Message]:
        """Differential privacy on the site's terms: ``(refusal or None, request to answer)``.

        The request's noise multiplier ``z`` can only add noise: the site answers with
        ``max(z, z_floor)`` where ``z_floor`` is the smallest multiplier whose single
        release spends at most the policy's ``max_epsilon_per_release`` (at the policy's
        ``delta``), and it charges the declaration's releases to its ledger — refusing when
        they would take the period's spending over ``epsilon_budget``.
        """
        from fedtab.privacy.dp import site_noise_floor

        spec = request.meta.get(DP_META)
        if not isinstance(spec, dict):
            return "differential privacy settings must be a JSON object", request
        releases = decl.releases_under_dp(request)
        if releases < 1:
            return f"{request.kind!r} has no differentially private release", request
        z = spec.get("z")
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not z > 0 or not np.isfinite(z):
            return "the DP noise multiplier must be a positive finite number", request
        try:
            floor = site_noise_floor(self.policy.max_epsilon_per_release, self.policy.delta)
        except ImportError as exc:
            return f"differential privacy is not available at this site ({exc})", request
        z_site = max(float(z), floor)
        reason = self.ledger.charge_dp(z_site, releases, self.policy.delta, self.policy.epsilon_budget)
        if reason is not None:
            return reason, request
        return None, Message(request.kind, request.arrays, {**request.meta, DP_META: {**spec, "z": z_site}})

    def __repr__(self) -> str:
        return f"Site({self.name!r}, rows={len(self.table)}, features={len(self.feature_names)}, target={self.target!r})"
