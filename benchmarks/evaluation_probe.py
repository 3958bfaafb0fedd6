"""How many rows a curious server isolates with crafted evaluations inside the default caps
(issue 28 item 5; docs/privacy.md, "Evaluations of the server's models").

A default site (``min_rows = 10``, no opt-in) answers ``evaluate`` of a model the server sent in
the clear, at most ``plain_model_cap`` distinct models per part per run: the models it trained in the
run (``fit``/``newton`` rounds, boosting trees) + ``PLAIN_MODELS_EXTRA`` (3). The server sends
step-function models (``predict`` = ``z_x > t``: a logistic model with coefficient 1 on one standardised column and intercept ``−t``): the
confusion matrix counts the test rows above ``t`` per class, and two thresholds differenced count
the rows between them. It bisects, adaptively, for intervals holding exactly one test row, and
counts a row *isolated* when its interval is narrower than ``--width`` (standardised units) — its
value located that closely and its class read off the per-class counts.

Run: ``python -m benchmarks.evaluation_probe`` (a few seconds; ``--rounds`` = the honest training
rounds that widen the cap).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from fedtab.federation import Message, register_all
from fedtab.federation.site.core import Site
from fedtab.privacy.policy import plain_model_cap

D = 2


def _site(rows: int, rounds: int, seed: int) -> Site:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=rows)
    table = pd.DataFrame({"x": x, "z": rng.normal(size=rows), "target": (x + rng.normal(size=rows) > 0).astype(int)})
    site = Site("hospital", table, "target")  # the default policy
    setup = {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "part": "train"}
    for r in range(rounds):  # the honest run's training rounds (each one widens the distinct-model cap)
        fit = Message("fit", {"setup:mean": np.zeros(D), "setup:std": np.ones(D), "param:coef": np.zeros((1, D)),
                              "param:intercept": np.zeros(1)}, {"setup": setup, "epochs": 1})
        assert not site.handle(fit).is_refusal
    return site


class Probe:
    """The server's view: ``above(t)`` = test rows per class whose standardised ``x`` exceeds ``t``."""

    def __init__(self, site: Site) -> None:
        self.site, self.asked, self.refused, self.cache = site, 0, False, {}

    def above(self, t: float) -> np.ndarray | None:
        if t in self.cache:
            return self.cache[t]
        reply = self.site.handle(Message("evaluate", {"param:coef": np.array([[1.0, 0.0]]),
                                                      "param:intercept": np.array([-t])}, {"part": "test"}))
        if reply.is_refusal or reply.is_error:
            self.refused = True
            return None
        self.asked += 1
        cm = np.asarray(reply.arrays["confusion"], dtype=float)  # rows: true class, columns: predicted
        self.cache[t] = cm[:, 1]
        return self.cache[t]


def isolate(probe: Probe, width: float, lo: float = -4.0, hi: float = 4.0) -> list[tuple[float, float, int]]:
    """Bisect for one-row intervals narrower than ``width``: ``[(lo, hi, class)]`` isolated."""
    counts = {lo: None, hi: np.zeros(2)}
    total = probe.above(lo)  # every test row is above -4 (in practice); one model
    if total is None:
        return []
    counts[lo] = total
    stack, found = [(lo, hi)], []
    while stack and not probe.refused:
        a, b = stack.pop()
        diff = counts[a] - counts[b]
        k = int(round(diff.sum()))
        if k == 0:
            continue
        if k == 1 and b - a < width:
            found.append((a, b, int(np.argmax(diff))))
            continue
        m = 0.5 * (a + b)
        c = probe.above(m)
        if c is None:
            break
        counts[m] = c
        halves = sorted([(a, m), (m, b)], key=lambda ab: (counts[ab[0]] - counts[ab[1]]).sum())
        stack.extend(reversed(halves))  # the emptier half first: the shortest way to a lone row
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--width", type=float, default=0.01, help="standardised width that counts as located")
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args(argv)
    register_all()
    print("| training rounds | distinct models (cap) | answered | rows isolated (mean over seeds) | test rows |")
    print("|---|---|---|---|---|")
    for rounds in (1, 10, 100):
        got, asked, caps = [], [], []
        for seed in range(args.seeds):
            site = _site(args.rows, rounds, seed)
            caps.append(plain_model_cap(site, "evaluate"))
            probe = Probe(site)
            got.append(len(isolate(probe, args.width)))
            asked.append(probe.asked)
        print(f"| {rounds} | {caps[0]} | {np.mean(asked):.0f} | {np.mean(got):.1f} (max {max(got)}) | "
              f"{site.n_rows('test')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
