"""The protocol layer: the server's federation, the one exchange path, summing strategies and run options.

* :mod:`.federation` — :class:`Federation` (the sites a workflow talks to) and the errors
  that name the sites at fault;
* :mod:`.exchange` — :func:`exchange`, the one server path of every request/reply
  exchange, and :func:`exchange_sums` for quantities the server needs only summed;
* :mod:`.summing` — how sums travel (plain or secure), one strategy per run;
* :mod:`.options` — :class:`RunOptions` (privacy, trust) fixed once per run
  (:func:`set_options`), and the run's one privacy accountant (:func:`run_ledger`);
* :mod:`.modes` — privacy and trust modes as wrappers of the summing strategy
  (``RobustSums``, ``NoisySums``) and the step loop that runs them;
* :mod:`.secure_aggregator` — the server side of secure aggregation;
* :mod:`.schema` — the agreed schema: the first thing a federation settles, riding on the
  first exchange;
* :mod:`.kinds` — the message-kind registry: every kind declared once;
* :mod:`.messages` — :class:`~.messages.Message` and its wire format;
* :mod:`.validate` — reply validators; :mod:`.reduce` — the robust reducers.
"""

from __future__ import annotations

from fedtab._lazy import lazy_exports

# the function ``exchange`` shares its name with its module: bound here, first, so that
# ``from fedtab.federation.protocol import exchange`` is the function whatever was imported before
from .exchange import Validator as Validator, exchange as exchange, exchange_sums as exchange_sums

#: public name -> submodule that defines it (resolved on first access, PEP 562: importing
#: :mod:`.messages` — every Flower ClientApp message does — costs only that module)
_EXPORTS = {
    **dict.fromkeys(("Federation", "FederationError", "QuorumError", "SiteError", "SiteRefused", "Traffic",
                     "TrafficLog", "check_min_sites", "reject_text", "set_quorum"), "federation"),
    **dict.fromkeys(("PrivacyOptions", "RunOptions", "TrustOptions", "plan_run_ledger", "run_ledger",
                     "set_options", "set_step_dp"), "options"),
    **dict.fromkeys(("SECURE_SUM", "PlainSums", "SecureSums", "Summed", "SummingStrategy", "SumSpec"), "summing"),
}


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{module}" for name, module in _EXPORTS.items()})


__all__ = sorted([*_EXPORTS, "Validator", "exchange", "exchange_sums"])
