"""Step 5, the score test (``[election] method = "score-test"``): forward selection by score tests
on the sites' pooled sums (one-vs-rest with more than two classes), at false discovery rate
``[election] score_test_alpha`` (:func:`fedtab.federation.workflows.score_test.server.run_pooled_score_test`),
or with ``[election] fdr = q`` the selection with error control (every column's pooled score test,
one ``fdr_method`` correction at ``q``). ``result["election"]`` records ``fdr`` (``{"q", "method"}``
or ``None``) and ``fdr_method``.

Secure aggregation comes from ``[privacy]``; the score test has no DP or robust mode
(:func:`fedtab.job.spec.check_spec` refuses them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..outputs import Outputs
from .step import Step
from .election import _jsonable

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..spec import JobSpec

__all__ = ["STEP"]


def _run(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from ...federation.protocol import FederationError, set_step_dp
    from fedtab.federation.workflows.score_test.server import run_pooled_score_test

    e = spec.election
    assert e is not None
    set_step_dp(federation, None)  # no DP mode (check_spec refuses it); secure sums: the run's options
    st = run_pooled_score_test(federation, alpha=e.score_test_alpha, features=out.features, one_vs_rest=True,
                               fdr=e.fdr, fdr_method=e.fdr_method)
    if spec.training is not None and not st.selected_names:
        level = (f"false discovery rate {e.fdr:g} ({e.fdr_method.upper()})" if e.fdr is not None
                 else f"alpha {e.score_test_alpha:g}")
        raise FederationError(f"the score test at {level} selected no column")
    out.outcomes["election"] = st
    out.result["election"] = {
        "method": "score-test", "alpha": e.score_test_alpha, "selected": list(st.selected_names),
        "fdr": None if e.fdr is None else {"q": e.fdr, "method": e.fdr_method},
        "fdr_method": e.fdr_method,
        "kept": len(st.selected_names), "entered": list(st.selected), "feature_names": list(st.feature_names),
        "mask": [bool(m) for m in st.mask], "p": _jsonable(st.p), "stopped": _jsonable(st.stopped),
        "exchanges": int(st.exchanges), "stats": {"features": len(st.feature_names), "kept": len(st.selected_names)},
    }
    out.features = list(st.selected_names)


STEP = Step("election", lambda spec, out: spec.election is not None and spec.election.method == "score-test", _run)
