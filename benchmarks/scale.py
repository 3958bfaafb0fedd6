"""Scale and non-IID: many sites, many features, skewed data (issue 15).

One process, in-process engine (:class:`~fedtab.engines.local.LocalFederation`), wire
format on (every message is serialised and decoded, so byte counts are real).

1. **Grid** — election (ANOVA ballots, default top half, ``fd = 0.5``) then FedAvg
   logistic training for K sites × d features (``make_classification``, 2 %
   informative, site sizes log-normal so small sites exist, at least
   ``MIN_ROWS`` rows each). Per step (``"election"`` = ballot + set_mask/describe,
   ``"fedavg_round"`` = one training round after the first): server and site wall
   seconds, peak server memory, bytes per site. Site seconds = time spent decoding
   the request, in the handler and encoding the reply, summed over sites
   (``LocalFederation.site_seconds``); server seconds = wall − site seconds (CPU
   seconds likewise, robust to other load on a shared machine). Peak server memory =
   tracemalloc peak of the server's side of the step (encoding requests, decoding each
   reply as it is taken, validating and reducing), replayed untimed from the replies
   recorded in the timed run.
2. **Non-IID** (K = 30) — label skew (Dirichlet α ∈ {∞, 1, 0.1}), quantity skew
   and covariate shift. The elected mask (ANOVA F with FDR control, ``fd`` =
   ``NONIID_FD``; sites with one class abstain) is scored by signal recall, noise kept
   and Jaccard agreement with the same selector on the pooled rows (also per ``fd``); F1 of FedAvg on the elected mask against
   centralised training (pooled rows, pooled ANOVA mask, same logistic model) and
   local-only training (each site alone, its own mask), all scored on the union of
   the sites' test rows. Next to the elections, the pooled forward selection by score
   tests (:func:`~fedtab.federation.workflows.score_test.server.run_pooled_score_test`), compared
   with the same procedure on the stacked training rows.
3. **Imputation** — FedHF-Impute for F columns × K sites, 60 % column availability
   (:func:`~fedtab.data.impute_datasets.heterogeneous_split`), few rounds: end-to-end
   seconds, seconds per round and validation RMSE (z-space, held-out cells).

Run: ``python -m benchmarks.scale`` (``--quick`` for a small run, ``--out DIR``, ``--threads N`` BLAS
threads, default 1: on a shared 2-core machine a second BLAS thread mostly waits for the first);
writes ``scale.json``, ``scale.md`` and ``scale.png`` to ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tracemalloc
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from fedtab.election.agreement import jaccard, pooled_agreement, pooled_mask
from fedtab.election.rule import RuleSettings
from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.election.server import run_election
from fedtab.federation.protocol.messages import Message
from fedtab.federation.workflows.pooled_anova.server import run_pooled_anova
from fedtab.federation.workflows.score_test.server import run_pooled_score_test
from fedtab.election.score_test import pooled_table_selection
from fedtab.federation.protocol import Federation
from fedtab.federation.site.core import Site
from fedtab.federation.workflows.training import run_training
from fedtab.privacy import DisclosurePolicy

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = "target"
MIN_ROWS = 12  # the smallest site: a handful of rows, as in a real network
FD = 0.5
NONIID_FD = 0.5
#: the election's consensus rules compared on every partition: the plain rule (default) and
#: ``consensus="stouffer"`` (combined p-values, :mod:`fedtab.election.evidence`)
CONSENSUS = ("intersection", "stouffer")
#: every row of the non-IID table: the two consensus rules, then the pooled forward selection by
#: score tests (``run_pooled_score_test``: no election, a multivariate test on the pooled sums)
METHODS = (*CONSENSUS, "score_test")


def noniid_selector() -> Any:
    """ANOVA F test with Benjamini-Hochberg FDR control at 5 % (scikit-learn's ``SelectFdr``):
    keeps what the data supports, so the pooled mask is the signal, not a fixed top k."""
    from sklearn.feature_selection import SelectFdr, f_classif

    from fedtab.election.selectors import SklearnSelector

    return SklearnSelector(SelectFdr(f_classif, alpha=0.05))


PARTITIONS = [("label_skew", math.inf), ("label_skew", 1.0), ("label_skew", 0.1), ("quantity_skew", None),
              ("covariate_shift", None)]

FULL = {
    "grid_sites": [3, 10, 30, 100, 300], "grid_features": [100, 1000, 10000], "grid_rounds": 3,
    "noniid_sites": 30, "noniid_features": 1000, "noniid_rows": 9000, "noniid_rounds": 20,
    "impute_columns": [13, 100, 446, 1000], "impute_sites": [4, 20], "impute_rows": 1200, "impute_rounds": 3,
}
QUICK = {
    "grid_sites": [3, 10], "grid_features": [100], "grid_rounds": 3,
    "noniid_sites": 6, "noniid_features": 60, "noniid_rows": 900, "noniid_rounds": 3,
    "impute_columns": [13], "impute_sites": [4], "impute_rows": 300, "impute_rounds": 1,
}


# ----------------------------------------------------------------------------- data
def signal_table(n_rows: int, n_features: int, seed: int) -> tuple[pd.DataFrame, int]:
    """make_classification with 2 % informative columns (the first ones), float32 to save memory."""
    from sklearn.datasets import make_classification

    n_inf = max(2, round(0.02 * n_features))
    X, y = make_classification(n_samples=n_rows, n_features=n_features, n_informative=n_inf, n_redundant=0,
                               n_repeated=0, class_sep=1.0, flip_y=0.01, shuffle=False, random_state=seed)
    width = len(str(n_features - 1))
    frame = pd.DataFrame(X.astype(np.float32), columns=[f"f{i:0{width}d}" for i in range(n_features)])
    del X
    frame[TARGET] = y
    return frame, n_inf


def lognormal_sizes(k: int, n_rows: int, rng: np.random.Generator, sigma: float = 1.0) -> np.ndarray:
    """Site row counts: log-normal shares, each at least ``MIN_ROWS``, summing to ``n_rows``."""
    share = rng.lognormal(0.0, sigma, size=k)
    extra = n_rows - MIN_ROWS * k
    if extra < 0:
        raise ValueError(f"{n_rows} rows cannot give {k} sites {MIN_ROWS} rows each")
    sizes = MIN_ROWS + np.floor(share / share.sum() * extra).astype(int)
    sizes[np.argmax(sizes)] += n_rows - sizes.sum()
    return sizes


def split_by_sizes(order: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return [np.sort(p) for p in np.split(order, np.cumsum(sizes)[:-1])]


def label_skew(y: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Dirichlet(α) class proportions per site (α = ∞: IID); every site gets ≥ ``MIN_ROWS`` rows."""
    if math.isinf(alpha):
        return split_by_sizes(rng.permutation(len(y)), np.diff(np.round(np.linspace(0, len(y), k + 1)).astype(int)))
    parts: list[list[int]] = [[] for _ in range(k)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(k, alpha)))[:-1] * len(idx)).astype(int)
        for i, chunk in enumerate(np.split(idx, cuts)):
            parts[i].extend(chunk.tolist())
    # top up sites below MIN_ROWS from the largest site (keeps every site able to split train/test)
    for i in range(k):
        while len(parts[i]) < MIN_ROWS:
            donor = max(range(k), key=lambda j: len(parts[j]))
            parts[i].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=int)) for p in parts]


def covariate_shift(X: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sites hold contiguous slices of the rows sorted by a noisy random projection:
    each sees a different region of feature space (P(x) differs, P(y | x) does not)."""
    proj = X @ rng.normal(size=X.shape[1]) / math.sqrt(X.shape[1])
    order = np.argsort(proj + 0.3 * proj.std() * rng.normal(size=len(proj)))
    return split_by_sizes(order, np.diff(np.round(np.linspace(0, len(order), k + 1)).astype(int)))


def make_sites(frame: pd.DataFrame, parts: list[np.ndarray], selector: Any) -> list[Site]:
    # non-IID splits give some sites a handful of rows on purpose: they answer under an explicit
    # permissive disclosure policy (the default min_rows=10 would refuse them)
    return [Site(f"site-{i:03d}", frame.iloc[p].reset_index(drop=True), TARGET, selector=selector, seed=i,
                 policy=DisclosurePolicy.permissive())
            for i, p in enumerate(parts)]


# ----------------------------------------------------------------------------- measuring
def _mark(fed: LocalFederation) -> tuple[float, float, float, float, int]:
    """(wall, process CPU, site wall, site CPU, traffic records) now."""
    return (time.perf_counter(), time.process_time(), float(sum(fed.site_seconds.values())),
            float(sum(fed.site_cpu_seconds.values())), len(fed.traffic.records))


def _step(fed: LocalFederation, a: tuple, b: tuple, k: int, kinds: set[str] | None = None) -> dict[str, float]:
    """Server/site wall and CPU seconds and bytes per site between two marks."""
    moved = sum(r.bytes_down + r.bytes_up for r in fed.traffic.records[a[4]:b[4]] if kinds is None or r.kind in kinds)
    return {"server_seconds": (b[0] - a[0]) - (b[2] - a[2]), "site_seconds": b[2] - a[2],
            "server_cpu_seconds": (b[1] - a[1]) - (b[3] - a[3]), "bytes_per_site": moved / k}


def _bytes_by_kind(fed: LocalFederation, a: tuple, b: tuple, k: int) -> dict[str, dict[str, float]]:
    """``{kind: {"down": bytes, "up": bytes}}`` per site between two marks (where the bytes go)."""
    out: dict[str, dict[str, float]] = {}
    for r in fed.traffic.records[a[4]:b[4]]:
        row = out.setdefault(r.kind, {"down": 0.0, "up": 0.0})
        row["down"] += r.bytes_down / k
        row["up"] += r.bytes_up / k
    return out


class Recording(LocalFederation):
    """A LocalFederation that keeps the last reply of each kind from each site."""

    def __init__(self, sites: list[Site]) -> None:
        super().__init__(sites)
        self.recorded: dict[str, dict[str, Message]] = {}

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        replies = super().ask(requests)
        for name, reply in replies.items():
            self.recorded.setdefault(requests[name].kind, {})[name] = reply
        return replies


class Replay(Federation):
    """Answers every request with the reply recorded in the timed run: the server's work
    (encoding requests, decoding replies, reducing) without the sites', for tracemalloc."""

    def __init__(self, recorded: Mapping[str, Mapping[str, Message]]) -> None:
        super().__init__()
        self._recorded = recorded
        self._raw: dict[str, dict[str, bytes]] = {}
        self._names = list(next(iter(recorded.values())))
        self.refresh()

    def refresh(self) -> None:
        """Encode replies recorded since (outside any measurement)."""
        for kind, by_site in self._recorded.items():
            self._raw[kind] = {n: m.to_bytes() for n, m in by_site.items()}

    @property
    def sites(self) -> list[str]:
        return list(self._names)

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        return dict(self.ask_each(requests))

    def ask_each(self, requests: Mapping[str, Message]) -> Iterator[tuple[str, Message]]:
        """Decode each recorded reply only when the server takes it (as a streaming engine does)."""
        encoded = {id(r): r.to_bytes() for r in requests.values()}  # a broadcast is encoded once
        assert encoded
        for n, r in requests.items():
            yield n, Message.from_bytes(self._raw[r.kind][n])


def peak_mb(fn: Callable[[], Any]) -> float:
    """tracemalloc peak (MB) of what ``fn`` allocates."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


#: the training rows measure a FedAvg round (the logistic default is Newton–Raphson, whose reply
#: carries a (d+1)² Hessian: at thousands of kept features a different scale question)
FEDAVG = {"name": "logistic", "params": {"solver": "fedavg"}}


def grid_point(k: int, d: int, rounds: int, seed: int = 0) -> list[dict[str, Any]]:
    """Election + FedAvg rows for ``k`` sites × ``d`` features."""
    n_rows = int(min(max(40 * k, 2000), max(40_000_000 // d, MIN_ROWS * k * 2)))
    frame, _ = signal_table(n_rows, d, seed)
    sizes = lognormal_sizes(k, n_rows, np.random.default_rng(seed))
    sites = make_sites(frame, split_by_sizes(np.random.default_rng(seed + 1).permutation(n_rows), sizes), "anova")
    del frame
    fed = Recording(sites)

    a = _mark(fed)
    outcome = run_election(fed, FD, describe="train")
    b = _mark(fed)
    election = _step(fed, a, b, k)
    election["bytes_by_kind"] = _bytes_by_kind(fed, a, b, k)
    replay = Replay(fed.recorded)
    election["peak_server_mb"] = peak_mb(lambda: run_election(replay, FD, describe="train"))

    features = outcome.result.selected_names
    marks = [_mark(fed)]
    run_training(fed, features, model=FEDAVG, rounds=rounds, local_epochs=1, described=outcome.described,
                 on_round=lambda r, m: marks.append(_mark(fed)))
    later = [_step(fed, a, b, k, {"fit"}) for a, b in zip(marks[1:-1], marks[2:])]  # rounds 2..R
    fedavg = {key: float(np.mean([x[key] for x in later])) for key in later[0]}
    # the same replay as the election's (the schema the sites declared there still holds)
    replay.refresh()
    fedavg["peak_server_mb"] = peak_mb(lambda: run_training(replay, features, model=FEDAVG, rounds=1, local_epochs=1,
                                                            described=outcome.described))
    common = {"sites": k, "features": d, "rows": n_rows, "min_site_rows": int(sizes.min()), "kept": len(features)}
    return [{"step": "election", **common, **election}, {"step": "fedavg_round", **common, **fedavg}]


# ----------------------------------------------------------------------------- non-IID
def _weighted_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y_true, y_pred, average="weighted"))


def _fit_predict(train: pd.DataFrame, test: pd.DataFrame, features: list[str]) -> np.ndarray:
    """The training workflow's logistic model on one table (centralised or one site alone)."""
    from fedtab.learn.models import make_model

    y = train[TARGET].to_numpy()
    classes = np.unique(y)
    if classes.size < 2 or not features:  # a site that saw one class predicts it
        return np.full(len(test), classes[0] if classes.size else 0)
    X = train[features].to_numpy(np.float64)
    mean, std = X.mean(0), X.std(0)
    std[std < 1e-12] = 1.0
    model = make_model("logistic")
    params = model.local_update(model.init(len(features), classes.size), (X - mean) / std,
                                np.searchsorted(classes, y), epochs=200)
    pred = model.predict(params, (test[features].to_numpy(np.float64) - mean) / std)
    return classes[pred]


def noniid_point(partition: str, alpha: float | None, cfg: dict[str, Any], seed: int = 0) -> list[dict[str, Any]]:
    """One row per method (:data:`METHODS`: each consensus rule, then the pooled score test) for
    one partition; the first row also holds ``pooled_anova`` (the pooled F test from per-class
    sums, for reference)."""
    k, d, n = cfg["noniid_sites"], cfg["noniid_features"], cfg["noniid_rows"]
    frame, n_inf = signal_table(n, d, seed)
    rng = np.random.default_rng(seed + 7)
    y = frame[TARGET].to_numpy()
    if partition == "label_skew":
        parts = label_skew(y, k, float(alpha), rng)
    elif partition == "quantity_skew":
        parts = split_by_sizes(rng.permutation(n), lognormal_sizes(k, n, rng, sigma=1.5))
    elif partition == "covariate_shift":
        parts = covariate_shift(frame.drop(columns=TARGET).to_numpy(np.float64), k, rng)
    else:
        raise ValueError(partition)
    sites = make_sites(frame, parts, noniid_selector())
    fed = LocalFederation(sites)
    names = sites[0].feature_names
    signal = np.arange(d) < n_inf

    train_tables = [s.rows("train") for s in sites]
    ref = pooled_mask(train_tables, TARGET, noniid_selector(), names)
    pooled_train = pd.concat(train_tables, ignore_index=True)
    test = pd.concat([s.rows("test") for s in sites], ignore_index=True)
    y_test = test[TARGET].to_numpy()
    central = _weighted_f1(y_test, _fit_predict(pooled_train, test, [f for f, m in zip(names, ref) if m]))
    one_class = sum(len(np.unique(s.rows("train")[TARGET])) < 2 for s in sites)
    common = {"partition": partition, "alpha": None if alpha is None or math.isinf(alpha) else alpha,
              "iid": alpha is not None and math.isinf(alpha), "one_class_sites": int(one_class),
              "min_site_rows": int(min(len(p) for p in parts)), "pooled_recall": float(ref[signal].mean()),
              "pooled_kept": int(ref.sum()), "f1_central": central}

    rows = []
    local: float | None = None
    for consensus in CONSENSUS:
        outcome = run_election(fed, NONIID_FD, describe="train", consensus=consensus)
        mask = outcome.result.mask
        curve = pooled_agreement(outcome.ballots, ref, feature_names=names,
                                 rule=RuleSettings(consensus=consensus, min_holders=outcome.result.min_holders))
        trained = run_training(fed, outcome.result.selected_names, rounds=cfg["noniid_rounds"], local_epochs=2,
                               described=outcome.described)
        if local is None:  # each site alone with its own mask (the same whatever the consensus)
            scores, weights = [], []
            for s, b in zip(sites, outcome.ballots):
                own = [f for f, m in zip(b.feature_names or names, b.mask) if m]
                scores.append(_weighted_f1(y_test, _fit_predict(s.rows("train"), test, own)))
                weights.append(b.n_samples)
            local = float(np.average(scores, weights=weights))
        rows.append({**common, "method": consensus, "consensus": consensus,
                     "signal_recall": float(mask[signal].mean()),
                     "noise_kept": float(mask[~signal].mean()), "jaccard_pooled": jaccard(mask, ref),
                     "f1": float(trained.pooled["weighted_f1"]), "f1_local": local, "kept": int(mask.sum()),
                     "jaccard_by_fd": curve})
    # the pooled forward selection by score tests: exact pooled sums, so its own pooled reference is
    # the same procedure on the stacked training rows (Jaccard 1 up to float rounding)
    before = len(fed.traffic.records)
    with _timed() as took:
        score = run_pooled_score_test(fed, alpha=0.05)
    moved = fed.traffic.records[before:]
    at = {n: i for i, n in enumerate(score.feature_names)}
    score_mask = np.asarray([score.mask[at[n]] for n in names], dtype=bool)
    own = pooled_table_selection(train_tables, TARGET, names, positive=1, alpha=0.05).mask
    score_f1 = run_training(fed, score.selected_names, rounds=cfg["noniid_rounds"], local_epochs=2).pooled["weighted_f1"]
    central_own = _weighted_f1(y_test, _fit_predict(pooled_train, test, [f for f, m in zip(names, own) if m]))
    rows.append({**common, "method": "score_test", "pooled_recall": float(own[signal].mean()),
                 "pooled_kept": int(own.sum()), "signal_recall": float(score_mask[signal].mean()),
                 "noise_kept": float(score_mask[~signal].mean()), "jaccard_pooled": jaccard(score_mask, own),
                 "f1": float(score_f1), "f1_central_own_mask": central_own, "f1_local": local, "kept": int(score_mask.sum()),
                 "steps": [len(st["added"]) for st in score.steps], "exchanges": score.exchanges,
                 "seconds": took[0], "cpu_seconds": took[1],
                 "bytes_per_site": sum(r.bytes_up + r.bytes_down for r in moved) / k})
    # for reference: the pooled ANOVA F test from per-class sums (same FDR level) instead of an election
    anova = run_pooled_anova(fed, alpha=0.05)
    at = {n: i for i, n in enumerate(anova.feature_names)}
    anova_mask = np.asarray([anova.mask[at[n]] for n in names], dtype=bool)
    anova_f1 = run_training(fed, anova.selected_names, rounds=cfg["noniid_rounds"], local_epochs=2).pooled["weighted_f1"]
    rows[0]["pooled_anova"] = {"signal_recall": float(anova_mask[signal].mean()),
                               "noise_kept": float(anova_mask[~signal].mean()),
                               "jaccard_pooled": jaccard(anova_mask, ref), "f1": float(anova_f1)}
    return rows


# ----------------------------------------------------------------------------- imputation
def impute_point(f: int, k: int, cfg: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    from benchmarks.impute import synthetic
    from fedtab.data.impute_datasets import heterogeneous_split
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    x = synthetic("rank4", n=cfg["impute_rows"], f=f, seed=seed)
    cols = [str(c) for c in x.columns]
    split = heterogeneous_split(cols, len(x), n_sites=k, keep_fraction=0.6, seed=seed)
    sites = [Site(f"site-{i:02d}", x.iloc[r][c].reset_index(drop=True), None, seed=i,
                  policy=DisclosurePolicy.permissive())
             for i, (r, c) in enumerate(zip(split.rows, split.columns))]
    rounds = cfg["impute_rounds"]
    config = ImputeConfig(rounds=rounds, local_epochs=1, max_steps_per_round=20, seed=seed)
    t0 = time.perf_counter()
    result = run_imputation(LocalFederation(sites), config)
    seconds = time.perf_counter() - t0
    overall = result.validation.get("overall")
    return {"columns": f, "sites": k, "seconds": seconds, "rmse": None if overall is None else float(overall),
            "rounds": rounds, "seconds_per_round": seconds / max(rounds, 1), "rows": cfg["impute_rows"]}


# ----------------------------------------------------------------------------- report
def _slope(rows: list[dict[str, Any]], d: int, step: str, key: str = "server_seconds") -> float | None:
    """Least-squares exponent b of ``seconds ∝ K^b`` at fixed d (1 = linear)."""
    pts = [(r["sites"], r[key]) for r in rows if r["features"] == d and r["step"] == step and r[key] > 0]
    if len(pts) < 2:
        return None
    k, s = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(k, s, 1)[0])


def goals(result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(goal, measured, met) — ``met`` is ``None`` when the run did not measure it."""
    out: list[tuple[str, str, bool | None]] = []
    meta = result.get("meta") or {}
    if not meta.get("quick") and meta.get("complete") and not meta.get("noniid_from") and "--sections" not in meta.get(
            "command", ""):
        out.append(("full run (`python -m benchmarks.scale`) ≤ 20 minutes on 2 cores",
                    f"{meta['seconds']:.0f} s wall, {meta['cpu_seconds']:.0f} s CPU, load average "
                    f"{meta['load_average_start'][0]:.1f} at the start", meta["seconds"] <= 1200))
    el = [r for r in result["election"] if r["step"] == "election" and r["sites"] == 300 and r["features"] == 10000]
    if el:
        s, c = el[0]["server_seconds"], el[0]["server_cpu_seconds"]
        out.append(("election, 300 sites × 10,000 features: server < 5 s (judged on CPU: the machine is shared)",
                    f"{c:.2f} s CPU, {s:.2f} s wall", c < 5))
        mb, sent = el[0].get("peak_server_mb"), el[0]["bytes_per_site"]
        out.append(("… issue 31: server < 1 CPU-s, peak server memory < 50 MB, ≤ 120 kB per site both ways",
                    f"{c:.2f} CPU-s, {mb:.1f} MB, {sent:,.0f} B", c < 1 and mb is not None and mb < 50 and sent <= 120_000))
    else:
        out.append(("election, 300 sites × 10,000 features: server < 5 s", "not run", None))
    ds = sorted({r["features"] for r in result["election"]})
    slopes = {d: _slope(result["election"], d, "fedavg_round", "server_cpu_seconds") for d in ds}
    walls = {d: _slope(result["election"], d, "fedavg_round", "server_seconds") for d in ds}
    text = ", ".join(f"d={d}: CPU K^{slopes[d]:.2f} (wall K^{walls[d]:.2f})" for d in ds if slopes[d] is not None)
    lin = [v for v in slopes.values() if v is not None]
    out.append(("FedAvg round server time linear in K (exponent of CPU s vs K ≤ 1.15)", text or "not run",
                all(v <= 1.15 for v in lin) if lin else None))
    for r in [r for r in result["noniid"] if r["partition"] == "label_skew" and r["alpha"] == 0.1]:
        how = _method_label(r)
        ceiling = ("the same procedure on the pooled rows" if _method(r) == "score_test" else "the pooled selector itself")
        out.append((f"K = 30, label skew α = 0.1 ({how}): signal recall ≥ 0.90",
                    f"{r['signal_recall']:.3f} ({ceiling}: {r['pooled_recall']:.3f}; "
                    f"{r['signal_recall'] / max(r['pooled_recall'], 1e-12):.0%} of it), noise kept {r['noise_kept']:.4f}, "
                    f"Jaccard pooled {r['jaccard_pooled']:.3f}", r["signal_recall"] >= 0.9))
        gap = r["f1_central"] - r["f1"]
        own = (f"; centralised on its own pooled mask {r['f1_central_own_mask']:.3f}"
               if r.get("f1_central_own_mask") is not None else "")
        out.append((f"… ({how}) F1 within 0.02 of centralised",
                    f"F1 {r['f1']:.3f} vs {r['f1_central']:.3f} (gap {gap:+.3f}){own}; local-only {r['f1_local']:.3f}",
                    gap <= 0.02))
    imp = [r for r in result["imputation"] if r["columns"] == 1000 and r["sites"] == 20]
    if imp:
        out.append(("imputation, 1,000 columns × 20 sites < 10 min end to end", f"{imp[0]['seconds']:.1f} s",
                    imp[0]["seconds"] < 600))
    else:
        out.append(("imputation, 1,000 columns × 20 sites < 10 min end to end", "not run", None))
    return out


def _method(r: Mapping[str, Any]) -> str:
    """The row's method (:data:`METHODS`; rows of older results only name their consensus)."""
    return str(r.get("method", r.get("consensus", "intersection")))


def _method_label(r: Mapping[str, Any]) -> str:
    m = _method(r)
    return {"intersection": "plain rule", "score_test": "pooled score test"}.get(m, f"consensus={m!r}")


def _fmt(v: Any, p: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{p}f}"
    return str(v)


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [f"# Scale and non-IID ({'quick' if meta['quick'] else 'full'} run)", "",
             f"Command: `{meta['command']}`; {meta['cpus']} CPU(s) shared with other jobs; total {meta['seconds']:.0f} s wall, "
             f"{meta['cpu_seconds']:.0f} s CPU of this process"
             + (f", {meta['blas_threads']} BLAS thread(s)" if meta.get("blas_threads") else "") + "." + (
                 f" Non-IID section from `{meta['noniid_from']}`." if meta.get("noniid_from") else ""), ""]
    if meta.get("load_average_start"):
        lines += [f"Load average of the machine (1, 5, 15 min) at the start: "
                  f"{', '.join(f'{x:.1f}' for x in meta['load_average_start'])}; at the end: "
                  f"{', '.join(f'{x:.1f}' for x in meta['load_average_end'])}.", ""]
    spent = []
    for key in ("election", "noniid", "imputation"):
        pts = [r for r in result[key] if "point_seconds" in r]
        if pts:
            spent.append(f"{key} {sum(r['point_seconds'] for r in pts):.0f} s wall / "
                         f"{sum(r['point_cpu_seconds'] for r in pts):.0f} s CPU")
    if spent:
        lines += ["Time per study: " + "; ".join(spent) + ".", ""]
    lines += ["## Goals", "", "| goal | measured | met |", "|---|---|---|"]
    for g, m, ok in goals(result):
        lines.append(f"| {g} | {m} | {'–' if ok is None else ('yes' if ok else 'NO')} |")
    lines += ["", "## Election and FedAvg by sites × features", "",
              "ANOVA ballots (top half), fd = 0.5; logistic FedAvg (`solver = \"fedavg\"`), 1 local epoch. Seconds are wall time of the step "
              "(a FedAvg round: mean of rounds 2..R); site seconds summed over all sites; bytes per site both ways.", "",
              "| step | sites | features | rows (smallest site) | server s | server CPU s | site s | peak server MB | bytes/site |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["election"]:
        lines.append(f"| {r['step']} | {r['sites']} | {r['features']} | {r['rows']} ({r['min_site_rows']}) | "
                     f"{r['server_seconds']:.3f} | {r['server_cpu_seconds']:.3f} | {r['site_seconds']:.3f} | "
                     f"{r['peak_server_mb']:.1f} | "
                     f"{r['bytes_per_site']:,.0f} |")
    biggest = max((r for r in result["election"] if "bytes_by_kind" in r), default=None,
                  key=lambda r: (r["sites"] * r["features"], r["sites"]))
    if biggest is not None:
        lines += ["", f"Where the election's bytes go at {biggest['sites']} sites × {biggest['features']:,} features "
                  "(per site, request down / reply up): " + "; ".join(
                      f"`{kind}` {v['down']:,.0f} / {v['up']:,.0f}" for kind, v in biggest["bytes_by_kind"].items()) + "."]
    lines += ["", f"## Non-IID, K = {meta['config']['noniid_sites']} sites, "
              f"d = {meta['config']['noniid_features']}", "",
              f"ANOVA F with 5 % FDR (SelectFdr) per site, fd = {NONIID_FD}, one-class sites abstain; pooled = the same "
              "selector on all training rows; F1 is weighted F1 on the union of the sites' test rows (local = each site "
              "alone with its own mask, sample-weighted mean). Method `intersection` is the plain rule (the default); "
              "`stouffer` is `run_election(..., consensus=\"stouffer\")`: the consensus is the features whose combined "
              "p-value over the sites passes Benjamini-Hochberg at 5 % (`fedtab.election.evidence`). `score_test` is no "
              "election: `run_pooled_score_test(fed, alpha=0.05)`, forward selection by score tests in a logistic model "
              "from the sites' summed gradients and information matrices (`fedtab.election.score_test`); its *pooled* "
              "columns (recall, Jaccard, F1 central own mask) compare it with the same procedure run on the stacked "
              "training rows, which it equals up to float rounding, not with the ANOVA selector. `F1 central` is always "
              "centralised training on the pooled ANOVA mask (the issue's reference); `F1 central own` is centralised "
              "training on the method's own pooled mask. Signal recall is over the 2 % informative columns; the pooled "
              "ANOVA selector's recall is the ceiling of any election with this selector (make_classification's "
              "informative columns are not all marginally separable).", "",
              "| partition | α | method | signal recall | pooled recall | noise kept | Jaccard pooled | F1 fed | "
              "F1 central | F1 central own | F1 local | one-class sites | smallest site |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["noniid"]:
        alpha = "∞" if r["iid"] else _fmt(r["alpha"], 1)
        own = r.get("f1_central_own_mask", r["f1_central"])
        lines.append(f"| {r['partition']} | {alpha} | {_method(r)} | {_fmt(r['signal_recall'])} | "
                     f"{_fmt(r.get('pooled_recall'))} | {_fmt(r['noise_kept'], 4)} | "
                     f"{_fmt(r['jaccard_pooled'])} | {_fmt(r['f1'])} | {_fmt(r['f1_central'])} | {_fmt(own)} | "
                     f"{_fmt(r['f1_local'])} | {r['one_class_sites']} | {r['min_site_rows']} |")
    score_rows = [r for r in result["noniid"] if _method(r) == "score_test"]
    if score_rows:
        lines += ["", "Cost of the pooled score test (in-process, wire format on): features admitted per step, "
                  "exchanges (1 describe + Newton iterations + 1 score exchange per step), wall and CPU seconds of "
                  "`run_pooled_score_test`, bytes per site both ways:", "",
                  "| partition | α | per step | exchanges | seconds | CPU s | bytes/site |", "|---|---|---|---|---|---|---|"]
        for r in score_rows:
            alpha = "∞" if r["iid"] else _fmt(r["alpha"], 1)
            lines.append(f"| {r['partition']} | {alpha} | {' + '.join(map(str, r['steps'])) or '–'} | {r['exchanges']} | "
                         f"{r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['bytes_per_site']:,.0f} |")
    anova_rows = [r for r in result["noniid"] if "pooled_anova" in r]
    if anova_rows:
        lines += ["", "For reference, the pooled ANOVA F test from per-class sums (`run_pooled_anova`, same 5 % FDR) in "
                  "place of the election, then the same FedAvg:", "",
                  "| partition | α | signal recall | noise kept | Jaccard pooled | F1 fed | F1 central |",
                  "|---|---|---|---|---|---|---|"]
        for r in anova_rows:
            a = r["pooled_anova"]
            alpha = "∞" if r["iid"] else _fmt(r["alpha"], 1)
            lines.append(f"| {r['partition']} | {alpha} | {_fmt(a['signal_recall'])} | {_fmt(a['noise_kept'], 4)} | "
                         f"{_fmt(a['jaccard_pooled'])} | {_fmt(a['f1'])} | {_fmt(r['f1_central'])} |")
    by_fd = [r for r in result["noniid"] if "jaccard_by_fd" in r]
    fds = [c["freedom_degree"] for c in by_fd[0]["jaccard_by_fd"]] if by_fd else []
    if fds:
        lines += ["", "Jaccard agreement with the pooled selector by freedom degree (elections only):", "",
                  "| partition | α | consensus | " + " | ".join(f"fd {fd:g}" for fd in fds) + " |",
                  "|---|---|---|" + "---|" * len(fds)]
        for r in by_fd:
            alpha = "∞" if r["iid"] else _fmt(r["alpha"], 1)
            lines.append(f"| {r['partition']} | {alpha} | {_method(r)} | "
                         + " | ".join(f"{c['jaccard']:.3f}" for c in r["jaccard_by_fd"]) + " |")
    lines += ["", "## Imputation, 60 % column availability", "",
              "| columns | sites | rounds | seconds | s/round | RMSE (z, validation) |", "|---|---|---|---|---|---|"]
    for r in result["imputation"]:
        lines.append(f"| {r['columns']} | {r['sites']} | {r['rounds']} | {r['seconds']:.1f} | {r['seconds_per_round']:.1f} | "
                     f"{_fmt(r['rmse'], 4)} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    from fedtab.report.plots import plt, save_figure

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    rows = result["election"]
    for ax, step in zip(axes[:2], ("election", "fedavg_round")):
        for d in sorted({r["features"] for r in rows}):
            pts = sorted((r["sites"], r["server_cpu_seconds"]) for r in rows if r["step"] == step and r["features"] == d)
            ax.plot([p[0] for p in pts], [max(p[1], 1e-5) for p in pts], "o-", label=f"d = {d}")
        ax.plot([3, 300], [1e-3, 1e-1], "k:", label="∝ K")
        ax.set(xscale="log", yscale="log", xlabel="sites K", ylabel="server CPU seconds", title=step)
        ax.legend()
    ni = [r for r in result["noniid"] if _method(r) == "intersection"]
    by = {m: {(r["partition"], r["alpha"]): r for r in result["noniid"] if _method(r) == m} for m in METHODS}
    labels = [f"{r['partition']}\nα={'∞' if r['iid'] else _fmt(r['alpha'], 1)}" if r["partition"] == "label_skew"
              else r["partition"] for r in ni]
    xs = np.arange(len(ni))

    def of(method: str, key: str, missing: float = 0.0) -> list[float]:
        return [by[method].get((r["partition"], r["alpha"]), {}).get(key, missing) for r in ni]

    bars = [("F1 plain rule", of("intersection", "f1")), ("F1 stouffer", of("stouffer", "f1")),
            ("F1 score test", of("score_test", "f1")), ("F1 central", [r["f1_central"] for r in ni]),
            ("F1 local", [r["f1_local"] for r in ni])]
    for i, (key, vals) in enumerate(bars):
        axes[2].bar(xs + (i - 2) * 0.16, vals, 0.16, label=key)
    axes[2].plot(xs, of("intersection", "signal_recall", np.nan), "kD", label="signal recall (plain)")
    axes[2].plot(xs, of("stouffer", "signal_recall", np.nan), "r*", label="signal recall (stouffer)")
    axes[2].plot(xs, of("score_test", "signal_recall", np.nan), "g^", label="signal recall (score test)")
    axes[2].set_xticks(xs, labels, fontsize=7)
    axes[2].set(ylim=(0, 1.05), title=f"non-IID (K = {result['meta']['config']['noniid_sites'] if 'meta' in result else 30})")
    axes[2].legend(fontsize=6)
    save_figure(fig, path)


@contextmanager
def _timed() -> Iterator[list[float]]:
    """Yields a list that holds [wall s, process CPU s] of the block once it has run."""
    out: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield out
    finally:
        out += [time.perf_counter() - t0, time.process_time() - c0]


def run(cfg: dict[str, Any], log: Callable[[str], None] = print,
        partial: Callable[[dict[str, Any]], None] | None = None,
        sections: set[str] = frozenset({"election", "noniid", "imputation"})) -> dict[str, Any]:
    """All three studies; ``partial(result so far)`` after every point (a long run keeps what it measured)."""
    election: list[dict[str, Any]] = []
    noniid: list[dict[str, Any]] = []
    imputation: list[dict[str, Any]] = []
    result = {"election": election, "noniid": noniid, "imputation": imputation}
    for d in cfg["grid_features"] if "election" in sections else []:
        for k in cfg["grid_sites"]:
            with _timed() as took:
                rows = grid_point(k, d, cfg["grid_rounds"])
            rows[0]["point_seconds"], rows[0]["point_cpu_seconds"] = took
            election += rows
            if partial:
                partial(result)
            log(f"K={k:4d} d={d:6d}  election server {rows[0]['server_seconds']:.3f}s sites {rows[0]['site_seconds']:.3f}s "
                f"peak {rows[0]['peak_server_mb']:.1f}MB | round server {rows[1]['server_seconds']:.4f}s "
                f"sites {rows[1]['site_seconds']:.3f}s")
    for partition, alpha in PARTITIONS if "noniid" in sections else []:
        with _timed() as took:
            rows = noniid_point(partition, alpha, cfg)
        rows[0]["point_seconds"], rows[0]["point_cpu_seconds"] = took
        for r in rows:
            noniid.append(r)
            log(f"{partition:16s} α={r['alpha']} {_method(r):12s} recall {r['signal_recall']:.3f} "
                f"noise {r['noise_kept']:.3f} jaccard {r['jaccard_pooled']:.3f}  F1 {r['f1']:.3f} "
                f"central {r['f1_central']:.3f} local {r['f1_local']:.3f}")
        if partial:
            partial(result)
    for f in cfg["impute_columns"] if "imputation" in sections else []:
        for k in cfg["impute_sites"]:
            with _timed() as took:
                r = impute_point(f, k, cfg)
            r["point_seconds"], r["point_cpu_seconds"] = took
            imputation.append(r)
            if partial:
                partial(result)
            log(f"impute F={f:5d} K={k:3d}  {r['seconds']:.1f}s rmse {_fmt(r['rmse'], 4)}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds, used by the tests)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for scale.{json,md,png}")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS/OpenMP threads (threadpoolctl; PyTorch's are 1 already): on a shared 2-core box "
                         "2 threads made the imputation points 10x slower in wall time than 1")
    ap.add_argument("--sections", default="election,noniid,imputation",
                    help="comma-separated studies to run; the others are kept from an existing scale.json in --out")
    args = ap.parse_args(argv)
    sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    if not sections <= {"election", "noniid", "imputation"}:
        ap.error(f"unknown sections {sorted(sections - {'election', 'noniid', 'imputation'})}")
    import os

    cfg = QUICK if args.quick else FULL
    t0, c0 = time.perf_counter(), time.process_time()
    load_start = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)

    def save(result: dict[str, Any], done: bool = False) -> None:
        result["meta"] = {"quick": bool(args.quick), "config": cfg, "seconds": time.perf_counter() - t0,
                          "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
                          "blas_threads": max(1, args.threads),
                          "cpu_seconds": time.process_time() - c0, "complete": done, "cpus": os.cpu_count(),
                          "command": "python -m benchmarks.scale" + (" --quick" if args.quick else "")
                          + (f" --sections {args.sections}" if sections != {"election", "noniid", "imputation"} else "")
                          + (f" --threads {args.threads}" if args.threads != 1 else "")}
        (args.out / "scale.json").write_text(json.dumps(result, indent=1, default=float) + "\n")

    kept: dict[str, Any] = {}
    if sections != {"election", "noniid", "imputation"} and (args.out / "scale.json").exists():
        kept = json.loads((args.out / "scale.json").read_text())

    def merged(result: dict[str, Any]) -> dict[str, Any]:
        return {key: (result[key] if key in sections else kept.get(key, [])) for key in ("election", "noniid", "imputation")}

    from threadpoolctl import threadpool_limits

    with threadpool_limits(max(1, args.threads)):
        result = merged(run(cfg, partial=lambda r: save(merged(r)), sections=sections))
    save(result, done=True)
    (args.out / "scale.md").write_text(markdown(result))
    plot(result, args.out / "scale.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
