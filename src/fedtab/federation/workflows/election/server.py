"""The election workflow: sites vote, the server elects, sites learn the mask.

Site side (handlers): ``"ballot"`` runs the site's selector on its training rows and
replies with mask, scores, feature names and sample count; ``"set_mask"`` stores
the elected feature names in ``site.state["features"]``.

Server side: :func:`gather_ballots` asks every site and validates each ballot on
arrival (a bad ballot raises, naming the site), :func:`run_election` elects and
tells the sites. Each step is one configure/aggregate pair run on the run's strategy
(:mod:`fedtab.federation.protocol.modes`), with no test of the run's modes: the ballot step
(:func:`ballot_step`, over :class:`BallotExchange`: ballots are never summed, so they travel in
the clear under secure sums) whose DP release (one ``"election.ballot"``) is spent before the
request goes out; the election (:func:`election_reduction`: the weighted vote, or robustly the
median vote); the mask with the description (the training workflow's ``"describe"`` pair). The
modes are declared once (:data:`ELECTION_MODES`; a peer's rule has no robust variant, the Stouffer
consensus no DP ballot) and checked before anything is sent.

Every ballot is validated on arrival against the agreed schema
(:mod:`fedtab.federation.protocol.schema`, agreed in the same exchange when it is the run's
first): the features must be exactly the ones the site declared, ``n_samples`` must
equal the training rows it declared (an abstaining site too), mask and scores must
match the names. A bad ballot is rejected naming the site.

Consensus needs ``min_holders`` holders (default 2 when two or more sites vote): a
feature held by fewer sites is never "consensus", even if all its holders select it.
It is *disputed* instead and can only win a place through the freedom-degree vote
(so at ``fd = 0`` a single-holder feature is never elected). Imputation is not
affected: it still uses every column, whoever holds it. (``compat`` profiles
reproduce a peer's rule exactly and ignore ``min_holders``.)

``consensus="stouffer"`` (for label-skewed networks) asks each voting site for the
p-value of its selector's test per feature along with its ballot (request meta
``pvalues``; reply array ``pvalues``, validated like the scores: shape, finite, in
[0, 1]; meta ``n_effective`` in (0, n_samples]) and replaces the intersection by the features whose combined p-value passes
Benjamini-Hochberg (see :mod:`fedtab.election.evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Literal, Mapping

import numpy as np

from fedtab.election.ballot import Ballot
from fedtab.election.evidence import check_consensus, check_consensus_alpha
from fedtab.election.rule import ElectionResult, FeatureCounts, RuleSettings, check_aggregation, check_normalization, check_profile, decide
from fedtab.election.tally import ElectionTally, normalise_scores
from fedtab.privacy.dp import DP_META
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, Summed, SumSpec, exchange, run_ledger, set_quorum
from fedtab.federation.protocol.modes import (BaseSums, NoisyRelease, Reduction, SumStep, check_modes, declare_modes, modes_of,
                             run_strategy, supported_modes)
from fedtab.federation.protocol.options import RunOptions
from fedtab.federation.protocol.summing import PlainSums
from fedtab.federation.protocol.schema import SCHEMA_HASH, columns_hash
from fedtab.federation.protocol.reduce import robust_votes

from fedtab.federation.workflows.election.site import _min_rows, pack_mask, unpack_mask

__all__ = ["ElectionHooks", "ElectionOutcome", "ballot_columns", "ballots_from_replies", "gather_ballots", "ballot_step", "BallotExchange", "elect_from_ballots", "election_reduction", "election_modes", "ELECTION_MODES", "COMPAT_ELECTION_MODES", "STOUFFER_ELECTION_MODES", "run_election", "Quorum", "election_settings", "broadcast_mask"]


#: the election's modes: under secure sums the ballots travel in the clear (the rule needs each site's
#: mask and normalised scores) and the description is summed; a DP ballot; the median vote (robust)
ELECTION_MODES = declare_modes("election", "secure", "dp", "robust")
#: a peer's rule (``compat``) has no robust variant
COMPAT_ELECTION_MODES = declare_modes("election.compat", "secure", "dp")
#: the Stouffer consensus needs each site's exact p-values: no DP ballot
STOUFFER_ELECTION_MODES = declare_modes("election.stouffer", "secure", "robust")










def _described_from(reply: Message, features: list[str]) -> Message:
    """The ``"describe"`` reply folded into a ``"set_mask"`` reply (see :func:`broadcast_mask`), over
    the elected ``features``: the site does not echo their names (a reply that does must name exactly
    them; the describe check rejects any other list)."""
    meta = reply.meta.get("describe")
    if not isinstance(meta, dict):
        raise ValueError("the set_mask reply carries no description")
    if "features" not in meta:
        meta = {**meta, "features": features}  # the server's own list, shared: no per-site copy
    out = Message.__new__(Message)  # parts of a decoded reply, already within the limits: not walked again
    out.kind, out.arrays, out.meta = "describe", dict(reply.arrays), meta
    return out


def _selector_request(selector: Any) -> dict[str, Any]:
    from fedtab.election.selector_specs import selector_wire_spec as selector_spec  # no scikit-learn for a named one

    if selector is None:
        return {}
    return {"selector": selector_spec(selector)}


def gather_ballots(
    federation: Federation,
    selector: Any = None,
    *,
    selectors: Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] | None = None,
    min_site_rows: int = 0,
    abstained: dict[str, str] | None = None,
    dp_meta: Mapping[str, Any] | None = None,
    pvalues: bool = False,
) -> list[Ballot]:
    """Ask every active site for a ballot and validate each on arrival (see module docstring).

    Args:
        selector: a built-in selector (name/spec) every site should use; ``None`` lets
            each site use its own (``Site.selector``).
        selectors: per-site overrides ``{site: selector}``.
        on_error: ``"skip"`` leaves out sites whose reply is an error or an invalid
            ballot; ``None``/``"raise"`` follow the federation's quorum policy
            (``federation.min_sites``).
        min_site_rows: sites with fewer training rows do not vote (they abstain).
        abstained: if given, filled with ``{site: reason}`` for every site that did not
            vote: too few rows, or a single target value (see :func:`abstention_reason`).
        dp_meta: a request's DP settings (:func:`~fedtab.privacy.dp.dp_request`): each
            site sends a noisy ballot.
        pvalues: each voting site also sends its selector's test p-values (for
            ``consensus="stouffer"``); a ballot without them is invalid.

    Raises:
        SiteError: a site failed or sent an invalid ballot (naming it) and no quorum lets
            the run go on without it. QuorumError: too few sites answered.
        ValueError: every site abstained.
    """
    step, selector_meta = ballot_step(federation, selector, selectors=selectors, min_site_rows=min_site_rows,
                                      abstained=abstained, dp_meta=dp_meta, pvalues=pvalues)
    return BallotExchange(selector_meta).run(federation, step, on_error=on_error).result


class BallotExchange(BaseSums):
    """The base of the ballot step: each site's ballot in the clear, whatever the run's summing
    strategy (a ballot is not summed: the rule needs each site's mask and normalised scores), each
    site's request with its own selector (``selector_meta``: ``{site: request meta}``)."""

    def __init__(self, selector_meta: Mapping[str, Mapping[str, Any]]) -> None:
        self.summing, self.mode, self.selector_meta = PlainSums(), None, dict(selector_meta)

    def exchange(self, federation: Federation, step: SumStep[Any], *, on_error: str | None = None) -> Summed:
        requests = {s: Message(step.request.kind, step.request.arrays,
                               {**self.selector_meta.get(s, {}), **step.request.meta}) for s in federation.active}
        # a checked ballot is held as its Ballot (float64 scores): the reply is kept without its arrays
        replies = exchange(federation, requests, step.check, on_error=on_error,  # type: ignore[arg-type]
                           fold=lambda site, reply: Message(reply.kind, meta=reply.meta))
        return Summed({}, None, dict(replies), list(replies))


def ballot_step(federation: Federation, selector: Any = None, *, selectors: Mapping[str, Any] | None = None,
                min_site_rows: int = 0, abstained: dict[str, str] | None = None,
                dp_meta: Mapping[str, Any] | None = None, pvalues: bool = False,
                ) -> tuple[SumStep[list[Ballot]], dict[str, dict[str, Any]]]:
    """The ballot step's configure/aggregate pair and each active site's selector request meta (for
    :class:`BallotExchange`): the request (``min_site_rows``, ``pvalues``; ``dp_meta``: DP settings a
    caller chose), each ballot validated on arrival (:func:`ballot_checker`), the valid ballots in
    reply order; its robust reduction the same ballots (the median vote is the election's, see
    :func:`election_reduction`); its DP release one ``"election.ballot"`` release of noisy ballots,
    validated alike.

    Raises (in the reduction):
        ValueError: every site abstained or was left out.
    """
    min_rows = _min_rows(min_site_rows)
    meta: dict[str, Any] = {}
    if min_rows:
        meta["min_site_rows"] = min_rows
    if dp_meta is not None:
        meta[DP_META] = dict(dp_meta)
    if pvalues:
        meta["pvalues"] = True
    selector_meta = {name: _selector_request((selectors or {}).get(name, selector)) for name in federation.active}
    ballots: dict[str, Ballot] = {}
    left_out: dict[str, str] = {}

    def aggregate(summed: Summed) -> list[Ballot]:
        return _valid_ballots([ballots[n] for n in summed.replies if n in ballots], left_out, abstained)

    step: SumStep[list[Ballot]] = SumStep(
        Message("ballot", meta=meta), SumSpec({}),
        ballot_checker(federation, "train", ballots, left_out, min_rows, pvalues=pvalues), aggregate,
        robust=lambda summed: (aggregate(summed), {}), kind="ballot")
    step.noisy = NoisyRelease(step, "election.ballot", 1)
    return step, selector_meta


def ballot_checker(federation: Federation, part: str, ballots: dict[str, Ballot],
                   abstained: dict[str, str] | None = None, min_site_rows: int = 0, *, pvalues: bool = False) -> Any:
    """A validator for ballot replies computed on row part ``part`` (see module docstring).

    Fills ``ballots`` with the accepted ballots and ``abstained`` with ``{site: reason}``
    of the sites that abstain (meta ``abstain``, or fewer than ``min_site_rows`` rows --
    checked here too: the server does not rely on the site obeying). With ``pvalues``
    a voting site's reply must carry valid ``pvalues`` (else they are ignored).
    """

    hashes: dict[int, tuple[tuple[str, ...], str]] = {}  # declared column lists are shared: hashed once each

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        n = validate.integer(reply.meta.get("n_samples"), "n_samples", equal=schema.rows(site, part))
        reason = reply.meta.get("abstain")
        if reason is None and min_site_rows and n < min_site_rows:
            reason = f"{n} training rows, fewer than min_site_rows={min_site_rows}"
        if reason is not None:
            if abstained is not None:
                abstained[site] = str(reason)[:500]
            return
        names = ballot_columns(schema.declaration(site).columns, reply, hashes)
        p = reply.arrays.get("pvalues") if pvalues else None
        eff = reply.meta.get("n_effective") if pvalues else None
        if pvalues and (p is None or eff is None):
            raise ValueError("the ballot carries no p-values and n_effective, which consensus='stouffer' asked for")
        mask = unpack_mask(reply.arrays.get("mask"), len(names))
        ballot = Ballot.build(mask, reply.arrays.get("scores"), n, None, site=site, pvalues=p, n_effective=eff)
        ballots[site] = replace(ballot, feature_names=names)  # unique declared names: not re-checked

    return check


def ballot_columns(declared: tuple[str, ...], reply: Message,
                   hashes: dict[int, tuple[tuple[str, ...], str]] | None = None) -> tuple[str, ...]:
    """The columns a ballot reply votes on: the site's ``declared`` columns, or the subset its
    ``column_index`` array names by position (strictly increasing, in range). A ballot carries no
    names: meta ``schema:hash`` must be :func:`~fedtab.federation.protocol.schema.columns_hash` of
    ``declared`` and ``n_features`` the number of columns voted on.

    Raises:
        ValueError: names in the ballot, a missing or different hash, a bad index array or count.
    """
    if "feature_names" in reply.meta:
        raise ValueError("the ballot carries column names; a ballot refers to the declared columns by position")
    hit = hashes.get(id(declared)) if hashes is not None else None
    if hit is None or hit[0] is not declared:
        hit = (declared, columns_hash(declared))
        if hashes is not None:
            hashes[id(declared)] = hit
    if reply.meta.get(SCHEMA_HASH) != hit[1]:
        raise ValueError(f"the schema hash {str(reply.meta.get(SCHEMA_HASH))[:40]!r} of the ballot is not the hash "
                         "of the columns the site declared")
    index = reply.arrays.get("column_index")
    if index is None:
        names = declared
    else:
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu" or idx.ndim != 1 or idx.size > len(declared):
            raise ValueError(f"column_index must be at most {len(declared)} integer positions")
        if idx.size and (idx.min() < 0 or idx.max() >= len(declared) or (np.diff(idx.astype(np.int64)) <= 0).any()):
            raise ValueError(f"column_index must be increasing positions within the {len(declared)} declared columns")
        names = tuple(declared[i] for i in idx.tolist())
    count = reply.meta.get("n_features")
    if isinstance(count, bool) or count != len(names):
        raise ValueError(f"n_features is {str(count)[:20]}, but the ballot votes on {len(names)} columns")
    return names


def _valid_ballots(ballots: list[Ballot], left_out: Mapping[str, str], abstained: dict[str, str] | None,
                   ) -> list[Ballot]:
    if abstained is not None:
        abstained.update(left_out)
    if not ballots:
        detail = "; ".join(f"site {s!r}: {r}" for s, r in left_out.items())
        raise ValueError("no valid ballots" + (f" (abstained: {detail})" if detail else ""))
    return ballots


def ballots_from_replies(
    replies: Mapping[str, Message],
    *,
    on_error: Literal["raise", "skip"] = "raise",
    min_site_rows: int = 0,
    abstained: dict[str, str] | None = None,
) -> list[Ballot]:
    """Validate ballot replies (error replies already split off) into ballots.

    A reply with meta ``abstain`` (see :func:`ballot_reply`), or whose ``n_samples`` is
    below ``min_site_rows`` (checked here too: the server does not rely on the site
    obeying), is left out and recorded in ``abstained`` as ``{site: reason}``.

    Raises:
        ValueError: an invalid ballot (with ``on_error="raise"``, naming the site); every
            site abstained or was invalid.
    """
    ballots = []
    left_out: dict[str, str] = {}
    known: tuple[str, ...] | None = None
    for name, reply in replies.items():
        reason = reply.meta.get("abstain")
        n = reply.meta.get("n_samples")
        if reason is None and min_site_rows and isinstance(n, int) and n < min_site_rows:
            reason = f"{n} training rows, fewer than min_site_rows={min_site_rows}"
        if reason is not None:
            left_out[name] = str(reason)
            continue
        names = reply.meta.get("feature_names")
        try:
            if isinstance(names, list) and known is not None and len(names) == len(known) and tuple(names) == known:
                # the same columns as the previous ballot (the usual case): validated once
                ballot = replace(Ballot.build(reply.arrays.get("mask"), reply.arrays.get("scores"), n, None,
                                              site=name), feature_names=known)
                if ballot.n_features != len(known):
                    raise ValueError(f"site {name!r}: {len(known)} feature names for {ballot.n_features} mask entries")
            else:
                ballot = Ballot.build(reply.arrays.get("mask"), reply.arrays.get("scores"), n, names, site=name)
                known = ballot.feature_names
            ballots.append(ballot)
        except ValueError:
            if on_error == "raise":
                raise
    return _valid_ballots(ballots, left_out, abstained)


def default_min_holders(n_sites: int) -> int:
    """2 when two or more sites vote (one site's word is never consensus), else 1."""
    return 2 if n_sites >= 2 else 1


def elect_from_ballots(
    ballots: list[Ballot],
    freedom_degree: float,
    aggregation: str = "weighted",
    normalization: str = "all",
    compat: str | None = None,
    min_holders: int | None = None,
    *,
    robust: bool = False,
    consensus: str = "intersection",
    consensus_alpha: float = 0.05,
) -> ElectionResult:
    """Count ``ballots`` in an :class:`ElectionTally` (aligned by name) and elect
    (``compat``: a peer's server rule, see :mod:`fedtab.election.compat`;
    ``consensus``/``consensus_alpha``: see :meth:`ElectionTally.result`).

    ``min_holders``: holders a feature needs to be consensus (``None`` =
    :func:`default_min_holders` of the number of ballots).

    With ``robust=True`` the vote of a feature is the median of its holders'
    normalised scores, one vote per site (:func:`~fedtab.federation.protocol.reduce.robust_votes`),
    instead of the sample-weighted mean: a site's claimed row count buys no influence
    and ``f`` hostile sites cannot push a vote outside the honest sites' range when
    ``K >= 2f + 1``. ``aggregation`` is then ignored and the result's
    ``aggregation`` reads ``"median"``. Which features are consensus / disputed is
    decided by the masks as without ``robust``.

    With ``consensus="stouffer"`` and ``robust`` each feature's combined test leaves out
    the site with the largest term (no single site makes a feature consensus, see
    :mod:`fedtab.election.evidence`) and the disputed features are ranked by the median vote.

    Raises:
        ValueError: ``robust`` together with ``compat`` (a peer's rule has no robust variant);
            ``"stouffer"`` with a ballot that carries no p-values.
    """
    step, what = election_modes(compat, consensus)
    check_modes(step, modes_of(robust=robust), what)
    reduction = election_reduction(ballots, freedom_degree, aggregation, normalization, compat, min_holders,
                                   consensus=consensus, consensus_alpha=consensus_alpha)
    return run_strategy(_OnlyOptions(RunOptions.of(robust=robust))).reduce(reduction).result


@dataclass
class _OnlyOptions:
    """What :func:`~fedtab.federation.protocol.modes.run_strategy` reads of a federation, for a
    reduction without one (:func:`elect_from_ballots`' ``robust``)."""

    options: RunOptions
    summing: Any = field(default_factory=PlainSums)


def election_modes(compat: str | None, consensus: str) -> tuple[str, str]:
    """``(declared step, its name in an error)`` of an election with ``compat`` and ``consensus``:
    :data:`ELECTION_MODES`, :data:`COMPAT_ELECTION_MODES` or :data:`STOUFFER_ELECTION_MODES`."""
    if compat is not None:
        return "election.compat", f"compat={compat!r} (a peer's rule has no robust variant; fedtab's rule has)"
    if check_consensus(consensus) == "stouffer":
        return "election.stouffer", "consensus='stouffer' (a noisy ballot carries no p-values)"
    return "election", "the election"


def election_reduction(ballots: list[Ballot], freedom_degree: float, aggregation: str = "weighted",
                       normalization: str = "all", compat: str | None = None, min_holders: int | None = None, *,
                       consensus: str = "intersection", consensus_alpha: float = 0.05) -> Reduction[ElectionResult]:
    """The election of ``ballots`` as a reduction (arguments as :func:`elect_from_ballots`): the
    sample-weighted vote, or robustly the median vote (one per site) with nobody left out.

    Raises:
        ValueError: bad arguments; a ballot without feature names.
    """
    stouffer = check_consensus(consensus) == "stouffer"
    alpha = check_consensus_alpha(consensus_alpha)
    check_aggregation(aggregation)
    tally = ElectionTally(normalization=check_normalization(normalization), compat=compat)
    for b in ballots:
        if b.feature_names is None:
            raise ValueError(f"site {b.site!r}: ballot has no feature names")
        tally.add_ballot(b)
    holders = default_min_holders(len(ballots)) if min_holders is None else min_holders

    def weighted() -> ElectionResult:
        return tally.result(freedom_degree, aggregation, min_holders=holders, consensus=consensus,
                            consensus_alpha=consensus_alpha)

    def median() -> tuple[ElectionResult, dict[str, str]]:
        index = {n: i for i, n in enumerate(tally.feature_names)}
        norm = np.full((len(ballots), tally.n_features), np.nan)
        for k, b in enumerate(ballots):
            cols = [index[n] for n in b.feature_names or ()]
            norm[k, cols] = normalise_scores(b.mask, b.scores, tally.normalization)
        counts = FeatureCounts(tally.held_by.copy(), tally.selected_by.copy(), robust_votes(norm))
        return decide(tally.feature_names, counts, freedom_degree, "median", tally.normalization, tally.n_sites,
                      min_holders=holders, evidence=tally.combined_pvalues(leave_top_out=True) if stouffer else None,
                      consensus_alpha=alpha), {}

    return Reduction(weighted, median)


def broadcast_mask(federation: Federation, features: list[str], *, describe: str | None = None,
                   ledger: Any = None) -> Any:
    """Tell every site the elected feature names (stored in ``site.state["features"]``).

    Args:
        describe: a row part (``"train"``...): in the same exchange each site also
            answers the training workflow's ``"describe"`` step over ``features`` on that
            part (class labels and per-feature count/sum/sum of squares), summed on the run's
            strategy (plain or secure) and noised under the run's DP (``ledger`` pays). Plain sums
            are running sums: each reply's moments are added as it passes its check, the server
            keeps no site's (the description's ``per_site`` is empty unless the run is robust).

    Returns:
        ``None`` without ``describe``; with it the
        :class:`~fedtab.federation.steps.describe.Description`, to pass to
        :func:`~fedtab.federation.workflows.training.run_training` as ``described`` (one exchange
        fewer, same result).

    Raises:
        FederationError: a site failed (naming it).
    """
    def check_mask(site: str, reply: Message) -> None:
        validate.integer(reply.meta.get("kept"), "kept", equal=len(features))
        validate.integer(reply.meta.get("held"), "held", upper=len(features))

    arrays, meta = _mask_request(federation, features)
    if describe is None:
        exchange(federation, Message("set_mask", arrays, meta), check_mask)
        return None
    from fedtab.federation.steps.describe import Carrier, describe as describe_step

    elected = list(features)
    return describe_step(federation, list(features), str(describe), ledger,
                         carrier=Carrier(kind="set_mask", meta={**meta, "describe": str(describe)}, arrays=arrays,
                                         unpack=lambda reply: _described_from(reply, elected), check_reply=check_mask,
                                         step="election.describe", stream=True))


def _mask_request(federation: Federation, features: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The elected features as bits over the agreed columns with the schema's hash (array ``elected``,
    meta ``schema:hash``: the site checks the hash and reads the names from the schema it stored), or as
    names when there is no agreed schema or a feature is outside it."""
    schema = federation.schema
    if schema is not None and schema.column_set().issuperset(features):
        chosen = set(features)
        bits = np.fromiter((c in chosen for c in schema.columns), dtype=bool, count=len(schema.columns))
        if [c for c, b in zip(schema.columns, bits.tolist()) if b] == list(features):  # order kept
            return {"elected": pack_mask(bits)}, {SCHEMA_HASH: schema.hash}
    return {}, {"features": list(features)}


@dataclass
class ElectionOutcome:
    """What :func:`run_election` returns: the ballots and the election result."""

    ballots: list[Ballot]
    result: ElectionResult
    #: the description of the elected features when :func:`run_election` was called with
    #: ``describe=PART`` (else ``None``); pass to ``run_training(described=...)``.
    described: Any = None
    #: ``{site: reason}`` for sites that did not vote (they still learn the mask and train).
    abstained: dict[str, str] = field(default_factory=dict)
    #: with ``dp``: the privacy bill (:meth:`~fedtab.privacy.accountant.PrivacyLedger.report`).
    privacy: dict[str, Any] | None = None

    def site_summary(self) -> list[dict[str, Any]]:
        """Per site: name, selected count, sample count."""
        return [{"name": b.site, "n_samples": b.n_samples, "selected": b.n_selected} for b in self.ballots]


@dataclass(frozen=True)
class Quorum:
    """How an election treats a site that fails or refuses: ``min_sites`` sets the
    federation's quorum (``federation.min_sites``; ``None`` keeps the federation's: by
    default every site must answer); ``on_error="skip"`` leaves out a site whose ballot is an
    error or invalid (``None``/``"raise"``: the quorum policy decides, see
    :func:`gather_ballots`)."""

    min_sites: int | None = None
    on_error: Literal["raise", "skip"] | None = None


_RULE_KEYS = tuple(f.name for f in fields(RuleSettings))
_QUORUM_KEYS = tuple(f.name for f in fields(Quorum))


def election_settings(rule: RuleSettings | None, quorum: Quorum | None, settings: Mapping[str, Any],
                      caller: str = "run_election") -> tuple[RuleSettings, Quorum]:
    """``(rule, quorum)`` of an election: each given dataclass as it is, else built from the
    flat keywords ``settings`` (the :class:`~fedtab.election.rule.RuleSettings` fields
    ``aggregation``, ``normalization``, ``compat``, ``consensus``, ``consensus_alpha``,
    ``min_holders`` and the :class:`Quorum` fields ``min_sites``, ``on_error``).

    Raises:
        TypeError: a keyword that is neither (as Python names it for ``caller``), or a
            dataclass given together with keywords of its own fields.
    """
    unknown = [k for k in settings if k not in _RULE_KEYS and k not in _QUORUM_KEYS]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    for given, name, keys in ((rule, "rule", _RULE_KEYS), (quorum, "quorum", _QUORUM_KEYS)):
        both = [k for k in keys if k in settings]
        if given is not None and both:
            raise TypeError(f"{caller}() got {name}= and its field(s) {', '.join(both)}: give one or the other")
    if rule is None:
        rule = RuleSettings(**{k: settings[k] for k in _RULE_KEYS if k in settings})
    if quorum is None:
        quorum = Quorum(**{k: settings[k] for k in _QUORUM_KEYS if k in settings})
    return rule, quorum


@dataclass(frozen=True)
class ElectionHooks:
    """Calls :func:`run_election` makes so a caller can queue requests to ride on its exchanges
    (:func:`fedtab.federation.protocol.piggyback.ride`).

    Attributes:
        before_ballot: ``fn(candidate names)`` called right before the ``ballot`` exchange (only when the
            ballots are gathered there) with the columns the election votes on (the agreed schema's
            feature columns; ``None`` when the ballot is the exchange that agrees it); what it queues is
            answered after the requests queued before it (e.g. the imputation's ``impute_apply``): e.g.
            the Newton iteration at zero over every candidate,
            :func:`fedtab.federation.workflows.training.ahead.ride_candidates`.
        before_mask: ``fn(elected names)`` called once the election is decided, right before the
            ``set_mask`` exchange: e.g. a Newton iteration over the elected columns,
            :func:`fedtab.federation.workflows.training.ahead.ride_first_newton`.
    """

    before_ballot: Callable[[list[str] | None], Any] | None = None
    before_mask: Callable[[list[str]], Any] | None = None


def run_election(
    federation: Federation,
    freedom_degree: float = 0.5,
    *,
    selector: Any = None,
    selectors: Mapping[str, Any] | None = None,
    ballots: list[Ballot] | None = None,
    describe: str | None = None,
    min_site_rows: int = 0,
    rule: RuleSettings | None = None,
    hooks: ElectionHooks | None = None,
    **settings: Any,
) -> ElectionOutcome:
    """Gather ballots (unless given), elect, and send the mask to every site.

    Two exchanges (``ballot``, ``set_mask``), one with ``ballots`` given; the first
    exchange of a run also agrees the schema. With ``describe=PART`` (e.g. ``"train"``)
    the ``set_mask`` exchange also gathers the training workflow's description of the
    elected features (``.described``), so a following
    ``run_training(..., described=outcome.described)`` skips its describe step.
    The run's options (``federation.options``) apply: robust mode elects with the median
    vote (see :func:`elect_from_ballots`); secure sums carry the description (two more
    exchanges: keys and unmasking; ballots are *not* summed — the rule needs each site's mask
    and normalised scores, see ``docs/privacy.md``; use DP to bound what a ballot reveals);
    DP makes each ballot a Gaussian release (:func:`~fedtab.privacy.dp.noisy_scores`) and
    each array of the description too (values clipped into the public ``bounds``), paid from
    the run's accountant (``.privacy`` reports it). Given ``ballots`` are not re-noised.
    ``compat`` elects with a peer's server rule (see :mod:`fedtab.election.compat`).

    Sites with fewer than ``min_site_rows`` training rows, or whose training rows hold a
    single target value, abstain (``.abstained``); every site still receives the mask.

    The rule's settings come as ``rule`` (a :class:`~fedtab.election.rule.RuleSettings`) or as
    its fields by keyword (``aggregation="weighted"``, ``normalization="all"``, ``compat=None``,
    ``min_holders``, ``consensus``, ``consensus_alpha``); the quorum as ``quorum`` (a
    :class:`Quorum`) or as ``min_sites`` / ``on_error`` (:func:`election_settings`).

    Args:
        min_holders: holders a feature needs to count as consensus (default: the run's
            ``trust.min_holders``, else 2 with two or more ballots, see the module docstring).
        min_sites: quorum; sets ``federation.min_sites`` (``None`` keeps the
            federation's: by default every site must answer).
        on_error: ``"skip"`` leaves out sites whose ballot is an error or invalid
            (see :func:`gather_ballots`).
        consensus: ``"intersection"`` (the rule, default) or ``"stouffer"``: sites also send
            their selector's test p-values and the consensus is the features whose
            combined (Stouffer) p-value passes Benjamini-Hochberg at ``consensus_alpha``
            instead of the features every holder selected -- under label skew a site that
            mostly sees one class no longer vetoes, and evidence too weak for any one site
            adds up (:mod:`fedtab.election.evidence`). Needs a test-based selector (anova,
            chi2, scikit-learn ``SelectKBest``/``SelectFdr`` over a test); not with
            ``compat`` or ``dp``. It trusts each site's p-values; with ``robust=True`` no
            single site's can make a feature consensus (the top contributor is left out of
            each feature's test).
        consensus_alpha: the false discovery rate of that consensus (default 0.05).
        hooks: :class:`ElectionHooks` — calls that queue requests to ride on the ballot and on ``set_mask``.

    Raises:
        TypeError: an unknown keyword, or ``rule``/``quorum`` together with their fields.
    """
    # ``quorum`` (a Quorum) travels in ``settings``: the function keeps under ten named parameters
    rule, quorum = election_settings(rule, settings.pop("quorum", None), settings)
    check_profile(rule.compat, rule.normalization)
    stouffer = check_consensus(rule.consensus) == "stouffer"
    check_consensus_alpha(rule.consensus_alpha)
    if stouffer and rule.compat is not None:
        raise ValueError("consensus='stouffer' cannot be combined with compat")
    step, what = election_modes(rule.compat, rule.consensus)
    run_strategy(federation).check_supported(supported_modes(step), what)  # before anything is sent
    min_holders = rule.min_holders if rule.min_holders is not None else federation.options.trust.min_holders
    if min_holders is not None and (isinstance(min_holders, bool) or not isinstance(min_holders, int)
                                    or min_holders < 1):
        raise ValueError(f"min_holders must be a positive integer, got {min_holders!r}")
    set_quorum(federation, quorum.min_sites)
    abstained: dict[str, str] = {}
    ledger = run_ledger(federation, *dp_plan(ballots is None, describe is not None))
    if ballots is None:
        if hooks is not None and hooks.before_ballot is not None:
            hooks.before_ballot(list(federation.schema.columns) if federation.schema is not None else None)
        ballot, selector_meta = ballot_step(federation, selector, selectors=selectors, min_site_rows=min_site_rows,
                                            abstained=abstained, pvalues=stouffer)
        ballots = run_strategy(federation, ledger, base=BallotExchange(selector_meta)).run(
            federation, ballot, on_error=quorum.on_error).result
    reduction = election_reduction(ballots, freedom_degree, rule.aggregation, rule.normalization, rule.compat,
                                   min_holders, consensus=rule.consensus, consensus_alpha=rule.consensus_alpha)
    result = run_strategy(federation).reduce(reduction).result
    if hooks is not None and hooks.before_mask is not None:
        hooks.before_mask(list(result.selected_names))
    described = broadcast_mask(federation, result.selected_names, describe=describe, ledger=ledger)
    return ElectionOutcome(ballots, result, described, abstained,
                           privacy=ledger.report() if ledger is not None else None)


def dp_plan(ballots: bool, describe: bool) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scales)`` of one DP election: a ballot, and the description
    riding on ``set_mask`` (3 releases)."""
    return {"election.ballot": int(ballots), "election.describe": 3 if describe else 0}, {}
