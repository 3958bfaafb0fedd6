"""The protocol layer: the server's federation, the one exchange path, summing strategies and run options.

* :mod:`.federation` — :class:`Federation` (the sites a workflow talks to) and the errors
  that name the sites at fault;
* :mod:`.exchange` — :func:`exchange`, the one server path of every request/reply
  exchange, and :func:`exchange_sums` for quantities the server needs only summed;
* :mod:`.summing` — how sums travel (plain or secure), one strategy per run;
* :mod:`.options` — :class:`RunOptions` (privacy, trust) fixed once per run
  (:func:`set_options`), and the run's one privacy accountant (:func:`run_ledger`).
"""

from .exchange import Validator, exchange, exchange_sums
from .federation import (Federation, FederationError, QuorumError, SiteError, SiteRefused, Traffic, TrafficLog,
                         check_min_sites, reject_text, set_quorum)
from .options import (PrivacyOptions, RunOptions, TrustOptions, plan_run_ledger, run_ledger, set_options,
                      set_step_dp)
from .summing import SECURE_SUM, PlainSums, SecureSums, Summed, SummingStrategy, SumSpec

__all__ = ["Federation", "FederationError", "QuorumError", "SiteError", "SiteRefused", "Traffic", "TrafficLog",
           "check_min_sites", "reject_text", "set_quorum", "exchange", "exchange_sums", "Validator",
           "RunOptions", "PrivacyOptions", "TrustOptions", "set_options", "set_step_dp", "run_ledger", "plan_run_ledger", "SumSpec", "Summed",
           "SummingStrategy", "PlainSums", "SecureSums", "SECURE_SUM"]
