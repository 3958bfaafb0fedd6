"""Speed and memory of the election rule.

1. ``fedtab.election.elect`` (which validates every ballot) against a plain numpy
   formulation of the same rule written here, on 18 sites × 20,000 features and
   200 sites × 100,000 features, in the same process, best of ``--repeats`` runs.
   Goal: time ratio ≤ 1.5.
2. One site's ballot (``site.handle`` of a ``ballot`` request, ANOVA, the site's training
   part) at 10,000 columns and 60 rows (a site of the 30-site × 10,000-feature scale run) and
   300 rows, 5 % of the cells missing: best of ``--repeats`` after a first call (which draws the
   site's parts). Goal: ≤ 0.1 s; most of it used to be reading which cells were measured, one
   pandas call per column (``federation/site/observed.py``).
3. Peak memory (tracemalloc) of ``ElectionTally`` while 30 and then 300 sites
   report over 200,000 features, each ballot generated on arrival and dropped after
   counting. Goal: peak independent of the number of sites.

Run: ``python -m benchmarks.election_speed`` (``--quick`` for small sizes); writes
``benchmarks/results/election_speed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import tracemalloc
from pathlib import Path

import numpy as np

from fedtab.election import ElectionTally, elect

RESULTS = Path(__file__).resolve().parent / "results"


def plain_numpy_rule(masks: np.ndarray, scores: np.ndarray, n: np.ndarray, fd: float) -> np.ndarray:
    """The rule in a few vectorised lines, no validation (the reference)."""
    a = np.abs(scores)
    lo = a.min(axis=1, keepdims=True)
    span = a.max(axis=1, keepdims=True) - lo
    norm = np.divide(a - lo, span, out=np.zeros_like(a), where=span > 0)
    votes = (n / n.sum()) @ norm
    inter = masks.all(axis=0)
    disputed = masks.any(axis=0) & ~inter
    idx = np.flatnonzero(disputed)
    order = idx[np.lexsort((idx, -votes[idx]))]
    keep = inter.copy()
    keep[order[: math.ceil(round(fd * idx.size, 9))]] = True
    return keep


def ballots(k: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((k, d)) < 0.3, rng.normal(size=(k, d)), rng.integers(50, 5000, size=k)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def speed(k: int, d: int, repeats: int) -> dict:
    masks, scores, n = ballots(k, d)
    ref = plain_numpy_rule(masks, scores, n, 0.5)
    got = elect(masks, scores, n, 0.5)
    assert np.array_equal(ref, got.mask), "fedtab and the plain formulation disagree"
    t_plain = best_of(lambda: plain_numpy_rule(masks, scores, n, 0.5), repeats)
    t_fedtab = best_of(lambda: elect(masks, scores, n, 0.5), repeats)
    return {"sites": k, "features": d, "plain_numpy_s": t_plain, "fedtab_elect_s": t_fedtab,
            "ratio": t_fedtab / t_plain, "masks_equal": True}


def tally_peak(k: int, d: int) -> dict:
    rng = np.random.default_rng(1)
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    tally = ElectionTally(d)
    for _ in range(k):
        tally.add(rng.random(d) < 0.3, rng.normal(size=d), int(rng.integers(50, 5000)))
    tally.result(0.5)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {"sites": k, "features": d, "peak_mib": peak / 2**20}


def site_ballot(n: int, d: int, repeats: int) -> dict:
    """Seconds of one ballot at one site of ``n`` rows × ``d`` columns (see the module docstring)."""
    import pandas as pd

    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.site.core import Site

    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    X[rng.random((n, d)) < 0.05] = np.nan
    site = Site("s", pd.DataFrame(X, columns=[f"f{j}" for j in range(d)]).assign(y=np.arange(n) % 2), "y", seed=0)
    request = Message("ballot", {}, {"selector": "anova"})
    site.handle(request)  # the first message draws the parts
    return {"rows": n, "features": d, "ballot_s": best_of(lambda: site.handle(request), repeats)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (for the test suite)")
    ap.add_argument("--repeats", type=int, default=5, help="timing repeats (best is kept)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = ap.parse_args(argv)
    sizes = [(18, 2_000), (20, 10_000)] if args.quick else [(18, 20_000), (200, 100_000)]
    mem = [(3, 20_000), (30, 20_000)] if args.quick else [(30, 200_000), (300, 200_000)]
    rows = [speed(k, d, args.repeats) for k, d in sizes]
    memory = [tally_peak(k, d) for k, d in mem]
    ballot = [site_ballot(n, 2_000 if args.quick else 10_000, args.repeats) for n in (60, 300)]
    doc = {"speed": rows, "tally_memory": memory, "site_ballot": ballot,
           "memory_ratio": memory[1]["peak_mib"] / memory[0]["peak_mib"]}
    print(f"{'sites':>6} {'features':>9} {'numpy s':>9} {'fedtab s':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['sites']:>6} {r['features']:>9} {r['plain_numpy_s']:>9.4f} {r['fedtab_elect_s']:>9.4f} {r['ratio']:>6.2f}")
    for m in memory:
        print(f"tally peak memory, {m['sites']} sites × {m['features']} features: {m['peak_mib']:.1f} MiB")
    print(f"peak memory ratio (10× the sites): {doc['memory_ratio']:.2f}")
    for b in ballot:
        print(f"one site's ballot, {b['rows']} rows × {b['features']:,} columns: {b['ballot_s']:.3f} s")
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "election_speed.json").write_text(json.dumps(doc, indent=2))
        lines = ["| sites | features | plain numpy (s) | fedtab `elect` (s) | ratio |", "|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['sites']} | {r['features']:,} | {r['plain_numpy_s']:.4f} | {r['fedtab_elect_s']:.4f} | {r['ratio']:.2f} |" for r in rows]
        lines += ["", "| tally: sites | features | peak memory (MiB) |", "|---:|---:|---:|"]
        lines += [f"| {m['sites']} | {m['features']:,} | {m['peak_mib']:.1f} |" for m in memory]
        lines += ["", "| one site's ballot: rows | columns | seconds |", "|---:|---:|---:|"]
        lines += [f"| {b['rows']} | {b['features']:,} | {b['ballot_s']:.3f} |" for b in ballot]
        (args.out / "election_speed.md").write_text("\n".join(lines) + "\n")
    return doc


if __name__ == "__main__":
    main()
