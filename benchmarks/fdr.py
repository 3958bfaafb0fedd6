"""Selection with error control: the realised false discovery rate of ``[election] fdr = q``
against the vote, on synthetic data with known signal (issue 30 item 5).

Per seed: ``n`` rows of ``d`` independent standard-normal columns, the first ``k`` of which
drive a logistic label (coefficients ``±effect``); the other ``d − k`` are null marginally and
conditionally, so any of them kept is a false discovery. The rows are split into three sites
(40/35/25 %) and, in-process (:class:`~fedtab.engines.local.LocalFederation`):

* **score test, fdr = q** — :func:`~fedtab.federation.workflows.score_test.server.run_pooled_score_test`
  with ``fdr=q``: every column's score test on the pooled rows and one Benjamini-Hochberg
  (``bh``) or Benjamini-Yekutieli (``by``) correction at ``q``;
* **score test, forward** — the same sums, forward selection at ``alpha = q`` per step (the
  job's default ``method = "score-test"``; no FDR guarantee for the whole sequence);
* **vote** — Feature Election (:func:`~fedtab.federation.workflows.election.server.run_election`) at
  freedom degree 0.5 with each site's Lasso (the job's default) and with ANOVA ballots.

Reported per method, averaged over the seeds: the realised FDR (false kept / kept, 0 when
nothing is kept), the power (signal kept / k) and the columns kept. Two checks printed at the
end: the mean realised FDR is ≤ q (informative, but a mean over few seeds straddles q by chance),
and the sound one the exit status follows: ``mean − √(ln(1/0.01) / 2n) ≤ q`` (Hoeffding, each
seed's realised FDP in [0, 1]), which fails an FDR ≤ q with probability ≤ 0.01 at any number of
seeds ``n`` (:func:`hoeffding_slack`).

Run: ``python -m benchmarks.fdr`` (``--seeds 0 1 … 99``, default 100 seeds, ``--q 0.05 0.1``, ``--quick`` for
tests: five seeds, q = 0.1); writes ``results/fdr.json`` and ``results/fdr.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.election.server import run_election
from fedtab.federation.workflows.score_test.server import run_pooled_score_test
from fedtab.federation.site.core import Site

RESULTS = Path(__file__).resolve().parent / "results"
N_ROWS, N_COLUMNS, N_SIGNAL, EFFECT = 900, 40, 6, 0.35
SHARES = (0.40, 0.35, 0.25)


def known_signal(seed: int, n: int = N_ROWS, d: int = N_COLUMNS, k: int = N_SIGNAL, effect: float = EFFECT,
                 ) -> pd.DataFrame:
    """The table of one seed: columns ``s0..s{k-1}`` (signal) then ``n0..`` (null), ``target`` 0/1."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    beta = np.zeros(d)
    beta[:k] = effect * rng.choice([-1.0, 1.0], size=k)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(Z @ beta)))).astype(int)
    table = pd.DataFrame(Z, columns=[f"s{j}" for j in range(k)] + [f"n{j}" for j in range(d - k)])
    table["target"] = y
    return table


def _federation(table: pd.DataFrame, seed: int, selector: str = "lasso") -> LocalFederation:
    cuts = np.cumsum([int(len(table) * s) for s in SHARES[:-1]])
    parts = np.split(np.random.default_rng(seed + 1000).permutation(len(table)), cuts)
    return LocalFederation([Site(f"site{i}", table.iloc[p].reset_index(drop=True), "target", selector=selector,
                                 test_size=0, seed=seed * 10 + i) for i, p in enumerate(parts)])


def _score(kept: list[str]) -> dict[str, float]:
    false = sum(1 for c in kept if c.startswith("n"))
    return {"fdr": false / len(kept) if kept else 0.0, "power": sum(1 for c in kept if c.startswith("s")) / N_SIGNAL,
            "kept": float(len(kept))}


def run_seed(seed: int, qs: list[float]) -> dict[str, dict[str, float]]:
    """``{method: {"fdr", "power", "kept"}}`` of one seed."""
    table = known_signal(seed)
    out: dict[str, dict[str, float]] = {}
    for q in qs:
        for method in ("bh", "by"):
            st = run_pooled_score_test(_federation(table, seed), fdr=q, fdr_method=method)
            out[f"score test, fdr = {q:g} ({method.upper()})"] = _score(st.selected_names)
        st = run_pooled_score_test(_federation(table, seed), alpha=q)
        out[f"score test, forward, alpha = {q:g}"] = _score(st.selected_names)
    for selector in ("lasso", "anova"):
        names = [c for c in table.columns if c != "target"]
        mask = run_election(_federation(table, seed, selector), 0.5).result.mask
        out[f"vote, fd = 0.5 ({selector})"] = _score([c for c, m in zip(names, mask) if m])
    return out


#: the sound check's level: it fails a true FDR ≤ q with probability at most this
CHECK_LEVEL = 0.01


def hoeffding_slack(n_seeds: int, level: float = CHECK_LEVEL) -> float:
    """``√(ln(1/level) / (2·n))``: each seed's realised FDP lies in ``[0, 1]`` and the seeds are
    independent, so (Hoeffding) their mean exceeds the true FDR by more than this with probability
    at most ``level``. The check ``mean − slack ≤ q`` therefore fails a procedure whose FDR is ≤ q
    with probability ≤ ``level``, however few the seeds (5 seeds: 0.68; 100: 0.068).

    Raises:
        ValueError: no seeds, or ``level`` outside (0, 1).
    """
    if n_seeds < 1 or not 0 < level < 1:
        raise ValueError("the FDR check needs at least one seed and a level in (0, 1)")
    return float(np.sqrt(np.log(1 / level) / (2 * n_seeds)))


def summarise(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean and standard error over the seeds of each method's FDR, power and columns kept."""
    out = {}
    for method in per_seed[0]:
        rows = {k: np.array([s[method][k] for s in per_seed]) for k in ("fdr", "power", "kept")}
        out[method] = {**{k: float(v.mean()) for k, v in rows.items()},
                       "fdr_se": float(rows["fdr"].std(ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0}
    return out


def markdown(summary: dict[str, dict[str, float]], seeds: list[int]) -> str:
    lines = [f"Known signal: {N_SIGNAL} of {N_COLUMNS} columns, {N_ROWS} rows in 3 sites, seeds {seeds[0]}–{seeds[-1]} "
             f"({len(seeds)}); means over the seeds.", "",
             "| method | realised FDR (± SE) | power | columns kept |", "|---|---|---|---|"]
    for method, r in summary.items():
        lines.append(f"| {method} | {r['fdr']:.3f} ± {r['fdr_se']:.3f} | {r['power']:.3f} | {r['kept']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(100)))
    ap.add_argument("--q", type=float, nargs="+", default=[0.05, 0.1])
    ap.add_argument("--quick", action="store_true", help="five seeds, q = 0.1 (tests)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    seeds, qs = (list(range(5)), [0.1]) if args.quick else (args.seeds, args.q)
    per_seed = [run_seed(s, qs) for s in seeds]
    summary = summarise(per_seed)
    text = markdown(summary, seeds)
    print(text)
    ok = all(r["fdr"] <= q for q in qs for m, r in summary.items() if f"fdr = {q:g}" in m)
    slack = hoeffding_slack(len(seeds))
    sound = all(r["fdr"] - slack <= q for q in qs for m, r in summary.items() if f"fdr = {q:g}" in m)
    print(f"\ncheck: mean realised FDR ≤ q for every fdr = q: {'yes' if ok else 'no'} (a mean over "
          f"{len(seeds)} seeds: noisy)")
    print(f"check: FDR ≤ q not rejected at level {CHECK_LEVEL:g} for every fdr = q (mean − {slack:.3f} ≤ q, "
          f"Hoeffding over {len(seeds)} seeds): {'yes' if sound else 'NO'}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"seeds": seeds, "q": qs, "n_rows": N_ROWS, "n_columns": N_COLUMNS, "n_signal": N_SIGNAL,
                           "effect": EFFECT, "summary": summary, "per_seed": per_seed, "fdr_at_most_q": ok,
                           "check_level": CHECK_LEVEL, "hoeffding_slack": slack, "fdr_bound_holds": sound}
    (args.out / "fdr.json").write_text(json.dumps(doc, indent=1))
    (args.out / "fdr.md").write_text(text + "\n")
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
