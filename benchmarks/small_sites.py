"""Small heterogeneous sites from real data: does honest model selection beat training alone?

Issue 22's benchmark. Two consortia, rebuilt per seed from the real tables in
``../shared/datasets/`` (read, never copied):

* ``heart`` — UCI Heart (Cleveland, 303 rows) shuffled and split 35/27/22/16 % into four
  "hospitals" that each lack different columns (:data:`HEART_SITES`; one column,
  ``thal``, is measured at two of them only, ``ca`` at two);
* ``adult`` — UCI Adult, 1,200 rows sampled per seed and split into five small sites
  (30/25/20/15/10 %) over its six numeric columns plus ``sex`` and a married flag (both
  fixed row-wise transforms), each site lacking different columns (:data:`ADULT_SITES`);
* ``icu`` — PhysioNet/CinC 2012 set A (4,000 ICU stays) as four hospitals by ICU type
  (:data:`ICU_TYPES`: coronary care, cardiac surgery recovery, medical, surgical), one row per
  stay: ``Age``, ``Gender``, ``Height``, ever ventilated (``MechVent``, 0/1) and, for each of
  the 36 other parameters, its last and its mean value over the stay (``<p>_last``,
  ``<p>_mean``; missing when never measured) — 76 columns; target ``In-hospital_death``. The
  sites differ in case mix and in what they measure (a cardiac surgery unit hardly ever
  measures troponin). Rows are shuffled per seed; the sites are the ICU types themselves.

The four-hospital UCI heart-disease consortium (Cleveland, Hungarian, Switzerland, VA) of
issue 30 is not in ``../shared/datasets`` (only Cleveland is); ``heart`` splits Cleveland.

Every site holds out 25 % of its rows (its own stratified ``test`` part, from its seed) and
draws 5 folds of the rest; the disclosure floor is ``min_rows = 5`` (small sites).

Per seed and consortium, on the same held-out rows:

* **tuned** — FedHF-Impute (the job's defaults, :class:`ImputeConfig`; ``--impute-rounds``,
  ``--impute-epochs`` and ``--impute-params KEY=VALUE`` change them), then :func:`fedtab.federation.workflows.selection.select_model`
  (Lasso ballots on measured cells, fd grid + all columns, 5-fold federated CV by pooled
  log-loss, one-SE rule, L2 strength in :data:`L2_GRID` and personalisation chosen by the
  same CV, refit on all training rows, 10 FedAvg rounds × 5 local epochs) — ``tuned`` is the shipped model (its chosen
  personalisation), ``tuned_global`` the same columns without personalisation;
* **no_election** — the same imputation and FedAvg on all columns (the refit chain of the
  "all columns" candidate: the same job without the election);
* **local_only** — each site's own scikit-learn pipeline (mean imputation + scaling +
  ``LogisticRegression``) on its own training rows and columns, scored on its test rows;
* **centralised** — the same pipeline on the pooled training rows of every site (every
  column, absent ones missing), scored on the pooled test rows;
* **exchanges** — the imputation's and the selection's.

AUROCs are pooled over every site's test rows (federated: from the sites' score histograms
and exact within-site rank pairs, error bound reported; local / centralised: from the
predictions). The done-when check of issue 22 is printed per consortium: tuned never more
than 0.005 below no_election, and within 0.01 of max(centralised, local_only) on average;
where not, the gaps per step.

Run: ``python -m benchmarks.small_sites`` (``--seeds 0 1 2 3 4``, ``--cases heart adult``,
``--quick`` for tests: one seed, heart only, 3 rounds, no imputation); writes
``results/small_sites.json`` and ``results/small_sites.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedtab.data.election_datasets import load_adult, load_heart
from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.selection import personalised_predict, select_model, site_contributions
from fedtab.federation.site.core import Site

RESULTS = Path(__file__).resolve().parent / "results"

#: site -> (share of rows, columns it does not measure)
HEART_SITES: dict[str, tuple[float, list[str]]] = {
    "h1": (0.35, []),
    "h2": (0.27, ["ca", "thal"]),
    "h3": (0.22, ["slope", "chol", "thal"]),
    "h4": (0.16, ["ca", "oldpeak", "fbs"]),
}
#: site -> (share of rows, columns it does not measure)
ADULT_SITES: dict[str, tuple[float, list[str]]] = {
    "a1": (0.30, []),
    "a2": (0.25, ["capital-loss"]),
    "a3": (0.20, ["education-num", "fnlwgt"]),
    "a4": (0.15, ["capital-gain", "married"]),
    "a5": (0.10, ["hours-per-week"]),
}
ADULT_ROWS = 1200
#: PhysioNet 2012 ICUType -> site name
ICU_TYPES = {1: "coronary", 2: "cardiac_surgery", 3: "medical", 4: "surgical"}
ICU_TARGET = "In-hospital_death"
POLICY = {"min_rows": 5}
TEST_SIZE = 0.25
#: the logistic model's L2 strengths the cross-validation compares (per row, as fedtab's ``l2``)
L2_GRID = (0.001, 0.01, 0.1)


def _adult(seed: int) -> tuple[pd.DataFrame, str]:
    data = load_adult(include_test=False)
    t = data.table.sample(n=ADULT_ROWS, random_state=seed).reset_index(drop=True)
    frame = t[["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]].copy()
    frame["sex"] = (t["sex"] == "Male").astype(np.float64)
    frame["married"] = t["marital-status"].astype(str).str.startswith("Married").astype(np.float64)
    frame["income"] = t["income"].to_numpy()
    return frame, "income"


def _heart(seed: int) -> tuple[pd.DataFrame, str]:
    data = load_heart()
    return data.table.sample(frac=1.0, random_state=seed).reset_index(drop=True), data.target


_ICU_CACHE: dict[str, pd.DataFrame] = {}


def icu_table() -> pd.DataFrame:
    """One row per PhysioNet 2012 set-A stay (see the module docstring), with ``ICUType`` and
    the target; read from ``../shared/datasets/impute`` (checked, never copied)."""
    if "t" in _ICU_CACHE:
        return _ICU_CACHE["t"].copy()
    from fedtab.data.impute_datasets import DatasetError, _file

    path, out_path = _file(None, "physionet2012_set_a.csv.gz"), _file(None, "physionet2012_outcomes_a.csv.gz")
    raw = pd.read_csv(path)
    if list(raw.columns) != ["RecordID", "Time", "Parameter", "Value"] or len(raw) != 1_757_980:
        raise DatasetError(f"{path.name} looks altered (columns {list(raw.columns)}, {len(raw)} rows)")
    raw = raw.dropna(subset=["Parameter"])
    raw = raw[raw["Parameter"] != "RecordID"]
    raw = raw.assign(Value=raw["Value"].mask(raw["Value"] == -1))  # -1 = unknown
    static = ["Age", "Gender", "Height", "ICUType"]
    g = raw.groupby(["RecordID", "Parameter"], sort=True)["Value"]
    last, mean = g.last().unstack("Parameter"), g.mean().unstack("Parameter")  # the file is in time order
    series = [c for c in last.columns if c not in static and c != "MechVent"]
    table = pd.concat([last[["Age", "Gender", "Height"]],
                       last["MechVent"].notna().astype(np.float64).rename("MechVent"),
                       last[series].add_suffix("_last"), mean[series].add_suffix("_mean")], axis=1)
    outcomes = pd.read_csv(out_path).set_index("RecordID")
    if len(outcomes) != 4000 or ICU_TARGET not in outcomes.columns or len(table) != 4000:
        raise DatasetError(f"{out_path.name} or {path.name} looks altered (4,000 stays expected)")
    table["ICUType"] = last["ICUType"]
    table[ICU_TARGET] = outcomes.loc[table.index, ICU_TARGET].astype(int)
    _ICU_CACHE["t"] = table.reset_index(drop=True).rename_axis(columns=None)
    return _ICU_CACHE["t"].copy()


def site_tables(case: str, seed: int) -> tuple[dict[str, pd.DataFrame], str]:
    """``({site: raw table}, target)`` of one consortium and seed (see the module docstring)."""
    if case == "icu":
        t = icu_table().sample(frac=1.0, random_state=seed).reset_index(drop=True)
        return ({name: t[t["ICUType"] == k].drop(columns=["ICUType"]).reset_index(drop=True)
                 for k, name in ICU_TYPES.items()}, ICU_TARGET)
    frame, target = (_heart if case == "heart" else _adult)(seed)
    layout = HEART_SITES if case == "heart" else ADULT_SITES
    cuts = np.cumsum([int(round(len(frame) * share)) for share, _ in layout.values()])[:-1]
    tables = {}
    for (name, (_, dropped)), idx in zip(layout.items(), np.split(np.arange(len(frame)), cuts)):
        tables[name] = frame.iloc[idx].drop(columns=dropped).reset_index(drop=True)
    return tables, target


def _sites(tables: dict[str, pd.DataFrame], target: str, seed: int) -> list[Site]:
    return [Site(name, t, target, test_size=TEST_SIZE, seed=seed * 100 + i, policy=POLICY, folds=5)
            for i, (name, t) in enumerate(tables.items())]


def _pipeline() -> Any:
    return make_pipeline(SimpleImputer(strategy="mean", keep_empty_features=True), StandardScaler(),
                         LogisticRegression(max_iter=2000))


def references(sites: list[Site], columns: list[str]) -> dict[str, Any]:
    """Local-only and centralised pipelines on the sites' own train/test parts (raw tables)."""
    y_all, p_local, p_central = [], [], []
    train_frames, test_frames = [], []
    per_site = {}
    for s in sites:
        tr, te = s.rows("train"), s.rows("test")
        cols = s.feature_names
        local = _pipeline().fit(tr[cols], tr[s.target])
        p = local.predict_proba(te[cols])[:, 1]
        p_local.append(p)
        y_all.append(te[s.target].to_numpy())
        per_site[s.name] = float(roc_auc_score(y_all[-1], p)) if len(set(y_all[-1])) > 1 else None
        train_frames.append(tr.reindex(columns=columns + [s.target]))
        test_frames.append(te.reindex(columns=columns + [s.target]))
    target = sites[0].target
    train, test = pd.concat(train_frames), pd.concat(test_frames)
    central = _pipeline().fit(train[columns], train[target])
    p_central = central.predict_proba(test[columns])[:, 1]
    y = np.concatenate(y_all)
    return {"local_only": float(roc_auc_score(y, np.concatenate(p_local))),
            "centralised": float(roc_auc_score(y, p_central)), "local_per_site": per_site, "test_rows": int(len(y))}


def direct_auroc(sites: list[Site], model: dict[str, Any], personalised: bool) -> float:
    """Pooled AUROC of a selection's model from its predictions on every site's test rows
    (the tables as the sites hold them, imputed), through :func:`personalised_predict`."""
    from fedtab.federation.site.matrices import class_indices

    ys, ps = [], []
    for s in sites:
        rows = s.rows("test")
        X = rows.reindex(columns=model["features"]).to_numpy(dtype=np.float64)
        ps.append(personalised_predict(model, X, s.name if personalised else None)[:, 1])
        ys.append(class_indices(rows[s.target].to_numpy(), model["classes"]))
    return float(roc_auc_score(np.concatenate(ys), np.concatenate(ps)))


def _impute(fed: LocalFederation, seed: int, settings: dict[str, Any] | None = None) -> None:
    """FedHF-Impute with the job's defaults (:class:`ImputeConfig`) except ``settings``, then fill."""
    from fedtab.federation.workflows.imputation import ImputeConfig, apply_imputation, run_imputation
    from fedtab.federation.steps.profile import pooled_ranges, profile_sites

    ranges = pooled_ranges(profile_sites(fed))
    im = run_imputation(fed, ImputeConfig(**{**(settings or {}), "seed": seed}))
    low = np.array([ranges[c]["low"] for c in im.columns])
    high = np.array([ranges[c]["high"] for c in im.columns])
    is_int = np.array([bool(ranges[c]["integer"]) for c in im.columns])
    apply_imputation(fed, im, low, high, is_int)


def run_case(case: str, seed: int, *, rounds: int = 10, impute: bool = True,
             impute_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """One consortium and seed: every variant's pooled test AUROC, the exchanges and times.
    ``impute_settings``: :class:`ImputeConfig` fields other than the job's defaults."""
    tables, target = site_tables(case, seed)
    columns = list(dict.fromkeys(c for t in tables.values() for c in t.columns if c != target))
    sites = _sites(tables, target, seed)
    refs = references(sites, columns)
    fed = LocalFederation(sites)
    t0 = time.process_time()
    if impute:
        _impute(fed, seed, impute_settings)
    n_impute = fed.exchange_count
    t1 = time.process_time()
    out = select_model(fed, selector="lasso", rounds=rounds, local_epochs=5, seed=seed, l2_grid=L2_GRID)
    t2 = time.process_time()
    test = out.test
    shipped = test["modes"][out.personalisation]["pooled"]
    row = {
        "case": case, "seed": seed, "tuned": direct_auroc(sites, out.model, True),
        "tuned_global": direct_auroc(sites, out.model, False),
        "no_election": direct_auroc(sites, out.model_all_columns, False),
        "protocol_tuned": shipped["auroc"], "protocol_tuned_error_bound": shipped.get("auroc_error_bound"),
        "protocol_no_election": test["all_columns"]["pooled"]["auroc"],
        "protocol_local": test["modes"]["local"]["pooled"]["auroc"],
        "local_only": refs["local_only"], "centralised": refs["centralised"], "test_rows": refs["test_rows"],
        "kept": len(out.features), "columns": len(out.election["columns"]), "freedom_degree": out.freedom_degree,
        "personalisation": out.personalisation, "cv_logloss": out.chosen["logloss"],
        "cv_logloss_se": out.chosen["logloss_se"], "cv_logloss_all": out.all_columns["logloss"],
        "exchanges_imputation": n_impute, "exchanges_selection": out.exchanges["total"],
        "exchanges": n_impute + out.exchanges["total"],
        "selection_mb_up": out.exchanges["bytes_up"] / 1e6, "selection_mb_down": out.exchanges["bytes_down"] / 1e6,
        "cpu_seconds_imputation": t1 - t0, "cpu_seconds_selection": t2 - t1,
        "contributions": site_contributions(out) if out.loso else {},
        "must_impute": {s: m["must_impute"] for s, m in out.measured.items()},
    }
    return row


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The done-when check of issue 22 for one consortium's rows, and the gaps where it fails."""
    lines = []
    worst = min(r["tuned"] - r["no_election"] for r in rows)
    ref = _mean(rows, "reference")
    gap = _mean(rows, "tuned") - ref
    ok1, ok2 = worst >= -0.005, gap >= -0.01
    lines.append(f"tuned − no_election, worst seed: {worst:+.4f} ({'ok' if ok1 else 'FAILS'} the −0.005 floor)")
    lines.append(f"mean tuned − mean max(centralised, local_only): {gap:+.4f} ({'ok' if ok2 else 'FAILS'} the "
                 "−0.01 floor)")
    if not (ok1 and ok2):
        lines.append("where the AUROC goes (means over seeds): "
                     f"election {(_mean(rows, 'tuned_global') - _mean(rows, 'no_election')):+.4f} "
                     "(tuned_global − no_election), personalisation "
                     f"{(_mean(rows, 'tuned') - _mean(rows, 'tuned_global')):+.4f} (tuned − tuned_global), "
                     f"federation vs centralised {(_mean(rows, 'no_election') - _mean(rows, 'centralised')):+.4f}, "
                     f"vs local_only {(_mean(rows, 'no_election') - _mean(rows, 'local_only')):+.4f} "
                     "(no_election − each)")
    return lines


#: the columns both per-seed tables (this module's and ``benchmarks.job``'s) start with
SEED_HEADER = "| seed | tuned | tuned_global | no_election | local_only | centralised | kept | fd | personalisation |"


def seed_cells(r: dict[str, Any]) -> str:
    """The cells of :data:`SEED_HEADER` for one seed's row (the caller appends its exchange cells)."""
    fd = "all" if r["freedom_degree"] is None else f"{r['freedom_degree']:g}"
    return (f"| {r['seed']} | {r['tuned']:.4f} | {r['tuned_global']:.4f} | {r['no_election']:.4f} | "
            f"{r['local_only']:.4f} | {r['centralised']:.4f} | {r['kept']}/{r['columns']} | {fd} | "
            f"{r['personalisation']} |")


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    out = ["# Small heterogeneous sites (issue 22)", "", f"Command: `{command}`", "",
           "Pooled test AUROC over every site's held-out rows (same rows for every column). "
           "`tuned` = the shipped model (chosen columns + chosen personalisation); `tuned_global` = chosen "
           "columns without personalisation; `no_election` = all columns, same FedAvg; `reference` = "
           "max(centralised, local_only). Exchanges = imputation + selection.", ""]
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        out += [f"## {case}", "", SEED_HEADER + " exchanges |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            out.append(seed_cells(r) + f" {r['exchanges_imputation']}+{r['exchanges_selection']} |")
        out.append(f"| mean | {_mean(rs, 'tuned'):.4f} | {_mean(rs, 'tuned_global'):.4f} | "
                   f"{_mean(rs, 'no_election'):.4f} | {_mean(rs, 'local_only'):.4f} | {_mean(rs, 'centralised'):.4f} "
                   "| | | | |")
        out += [""] + [f"- {line}" for line in verdict(rs)] + [""]
    return "\n".join(out) + "\n"


def release_plans(case: str, seed: int) -> list[str]:
    """One line per site: the co-observation cells its imputation statistics suppress and the
    pair sums it replaces (:func:`fedtab.impute.stats.release_plan` on its training rows)."""
    from fedtab.impute.stats import release_plan

    tables, target = site_tables(case, seed)
    out = []
    for s in _sites(tables, target, seed):
        cols = s.feature_names
        values = s.rows("train")[cols].to_numpy(dtype=np.float64, na_value=np.nan)
        plan = release_plan(values, s.policy.min_rows)
        f = len(cols)
        missing = {cols[j]: int(k) for j, k in enumerate(np.isnan(values).sum(0)) if k}
        suppressed = [f"{cols[i]}×{cols[j]}" for i in range(f) for j in range(i + 1, f) if not plan.kept[i, j]]
        replaced = [f"Σ{cols[i]}|{cols[j]}" for i in range(f) for j in range(f)
                    if i != j and plan.kept[i, j] and not plan.exact[i, j]]
        out.append(f"{case} seed {seed} {s.name}: {len(values)} training rows, missing cells {missing}; "
                   f"suppressed {len(suppressed)} {suppressed}; replaced {len(replaced)} {replaced}")
    return out


def impute_settings(rounds: int | None, epochs: int | None, params: list[str]) -> dict[str, Any]:
    """The command line's imputation settings (``None`` = the job's default) as
    :class:`ImputeConfig` fields; raises ``ValueError`` naming a ``KEY=VALUE`` item that is not a
    number or ``None`` or names no setting."""
    from dataclasses import fields

    from benchmarks.impute import parse_params
    from fedtab.federation.workflows.imputation import ImputeConfig

    out = parse_params(params)
    known = {f.name for f in fields(ImputeConfig)} - {"seed"}
    unknown = sorted(set(out) - known)
    if unknown:
        raise ValueError(f"--impute-params: no imputation setting {', '.join(unknown)}")
    if rounds is not None:
        out["rounds"] = rounds
    if epochs is not None:
        out["local_epochs"] = epochs
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--cases", nargs="+", default=["heart", "adult"], choices=["heart", "adult", "icu"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-impute", action="store_true")
    ap.add_argument("--impute-rounds", type=int, default=None,
                    help="FedHF-Impute's FedAvg rounds (default: the job's, ImputeConfig.rounds)")
    ap.add_argument("--impute-epochs", type=int, default=None,
                    help="FedHF-Impute's local epochs per round (default: the job's, ImputeConfig.local_epochs)")
    ap.add_argument("--impute-params", nargs="*", default=[], metavar="KEY=VALUE",
                    help="other ImputeConfig settings, e.g. lr=0.01 patience=2 (numbers or None)")
    ap.add_argument("--quick", action="store_true", help="one seed, heart, 3 rounds, no imputation (tests)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plan", action="store_true",
                    help="only print each site's co-observation release plan (suppressed / replaced pair cells)")
    args = ap.parse_args(argv)
    if args.plan:
        for case in args.cases:
            for seed in args.seeds:
                print("\n".join(release_plans(case, seed)))
        return 0
    if args.quick:
        args.seeds, args.cases, args.rounds, args.no_impute = [0], ["heart"], 3, True
    settings = impute_settings(args.impute_rounds, args.impute_epochs, args.impute_params)
    rows = []
    for case in args.cases:
        for seed in args.seeds:
            row = run_case(case, seed, rounds=args.rounds, impute=not args.no_impute, impute_settings=settings)
            row["reference"] = max(row["centralised"], row["local_only"])
            rows.append(row)
            print(f"{case} seed {seed}: tuned {row['tuned']:.4f} (global {row['tuned_global']:.4f}, "
                  f"{row['personalisation']}, {row['kept']}/{row['columns']} columns) no_election "
                  f"{row['no_election']:.4f} local_only {row['local_only']:.4f} centralised {row['centralised']:.4f} "
                  f"exchanges {row['exchanges_imputation']}+{row['exchanges_selection']}", flush=True)
    command = "python -m benchmarks.small_sites " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "small_sites.json").write_text(json.dumps(rows, indent=1, default=float))
    (args.out / "small_sites.md").write_text(markdown(rows, command.strip()))
    for case in dict.fromkeys(r["case"] for r in rows):
        print(case + ":\n  " + "\n  ".join(verdict([r for r in rows if r["case"] == case])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
