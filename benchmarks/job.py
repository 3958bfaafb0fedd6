"""The consortium job end to end against a centralised pipeline and local-only models.

Data: UCI Adult (``adult.data``), a seeded random sample of ``--rows`` rows (default
1,000), split 40/35/25 % into three site CSVs that each lack different columns
(``ADULT_SITES``; ``?`` = missing). ``--dataset heart`` uses the three UCI Heart
(Cleveland) site files of :func:`fedtab.data.example_sites.write_heart_sites` instead
(303 rows, one site in Parquet, a few rows without a label). Each site holds out 20 % of
its rows as its test split (the job's ``[run] test_size``, stratified, seeded).

Federated: :func:`fedtab.run_job` on the in-process engine with the job of
:func:`job_document` — schema and federated categories, FedHF-Impute (the job's own
``[impute]`` defaults; ``--impute-rounds N`` sets its rounds, ``--no-impute`` skips it), Lasso election at freedom degree 1 (every column some site
selects; ``--tune`` tunes it by grid on validation rows instead), logistic regression by
FedAvg (10 rounds × 5 local epochs) and the baselines (majority class, each site's
local-only model); wall time and traffic per step from ``result.json``, and the job's
CPU time (``time.process_time``: on a shared machine the wall time mostly measures the
other processes).

Centralised reference: a scikit-learn pipeline (mean imputation + scaling of numeric
columns, most-frequent imputation + one-hot encoding of categorical ones,
``LogisticRegression``) fitted on the pooled training rows of all sites (every column)
and scored on the pooled test rows — the same rows as the job's, rebuilt from the same
site configs (:func:`fedtab.job.run.site_configs`, :func:`fedtab.engines.site_config.build_site`).

Small heterogeneous sites THROUGH THE JOB (issue 22): ``--small-sites`` runs, per case
(``--cases heart adult icu``, the consortia of :mod:`benchmarks.small_sites`: unequal sites lacking
different columns, 25 % test rows per site, ``min_rows = 5``) and seed, two jobs with FedHF-Impute
(the job's ``[impute]`` defaults, or ``--impute-rounds``) and 10 FedAvg rounds × 5 local epochs: ``tuned`` (``[election] tune = "cv"``, L2 grid
of :data:`benchmarks.small_sites.L2_GRID`) and ``no_election`` (no ``[election]``). Every model is
scored from its model file's predictions on every site's raw test rows (the model file's imputer
fills them, as ``fedtab predict`` would): ``tuned`` with each site's personalised model (``predict
--site``), ``tuned_global`` the pooled model, ``no_election``; against each site's own scikit-learn
pipeline (``local_only``) and the centralised pipeline on the pooled training rows
(:func:`benchmarks.small_sites.references`), and each job's exchanges. Writes
``small_sites_job.json`` / ``small_sites_job.md`` and prints issue 22's done-when verdict.

Run: ``python -m benchmarks.job`` (``--seeds 0 1 2`` for several samples; ``--quick`` for
tests: 150 Heart rows, 3 rounds, no tuning and no imputation); writes ``job.json`` and
``job.md`` (``--out``; the job's own ``result.json``, ``report.html`` and model file go
to ``<work>/seed<N>/job-run``, ``--work``, by default a temporary folder removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from fedtab.data.election_datasets import load_adult
from fedtab.data.synthetic import split_rows
from fedtab.report.html import site_summaries

RESULTS = Path(__file__).resolve().parent / "results"

#: site -> Adult columns it does not hold
ADULT_SITES: dict[str, list[str]] = {
    "north": [],
    "south": ["education", "capital-loss", "native-country"],
    "east": ["occupation", "hours-per-week", "fnlwgt"],
}
SHARES = [0.40, 0.35, 0.25]
#: issue 31's done-when: the default heart-style job (impute + election + logistic) in at most this many exchanges
MAX_EXCHANGES = 12


def adult_site_files(directory: Path, rows: int, seed: int) -> tuple[list[Path], str]:
    """Write the Adult site CSVs (``?`` = missing) into ``directory``; return their paths and the target."""
    data = load_adult(include_test=False)
    frame = data.table.sample(n=rows, random_state=seed).reset_index(drop=True)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for (name, drop), part in zip(ADULT_SITES.items(), split_rows(frame, SHARES, stratify=data.target, seed=seed)):
        path = directory / f"{name}.csv"
        part.drop(columns=drop).to_csv(path, index=False, na_rep="?")
        paths.append(path)
    return paths, data.target


def job_document(paths: list[Path], target: str, *, seed: int, impute: bool, impute_rounds: int | None, rounds: int,
                 tune: bool, out: Path, tolerance: float = 0.01, freedom_degree: float = 0.5,
                 min_rows: int | None = None) -> dict[str, Any]:
    """The job (as the dict form of a job file) the benchmark runs (``min_rows``: every site's
    disclosure floor, default the sites' own: 10; ``impute_rounds``: ``None`` = the job's default)."""
    floor = {} if min_rows is None else {"min_rows": min_rows}
    job: dict[str, Any] = {
        "target": target, "na_values": ["?"],
        "sites": {p.stem: {"path": str(p), **floor} for p in paths},
        "election": {"selector": "lasso", **({"tune": "grid", "tolerance": tolerance} if tune else {"freedom_degree": freedom_degree})},
        "training": {"model": "logistic", "rounds": rounds, "local_epochs": 5},
        "run": {"seed": seed, "out": str(out)},
    }
    if impute:
        job["impute"] = {} if impute_rounds is None else {"rounds": impute_rounds}
    return job


def _pooled_rows(job: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pooled training and test rows of the job's sites, split exactly as the job splits them."""
    from fedtab.engines.site_config import build_site
    from fedtab.job import load_job
    from fedtab.job.run import site_configs

    sites = [build_site(c) for c in site_configs(load_job(job))]
    return (pd.concat([s.rows("train") for s in sites], ignore_index=True),
            pd.concat([s.rows("test") for s in sites], ignore_index=True))


def _centralised(train: pd.DataFrame, test: pd.DataFrame, target: str, seed: int) -> dict[str, Any]:
    """scikit-learn on the pooled rows (every column; a column a site lacks is missing there)."""
    feats = [c for c in train.columns if c != target]
    cat = [c for c in feats if not pd.api.types.is_numeric_dtype(train[c])]
    num = [c for c in feats if c not in cat]
    prep = ColumnTransformer([
        ("num", make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()), num),
        ("cat", make_pipeline(SimpleImputer(strategy="most_frequent"), OneHotEncoder(handle_unknown="ignore")), cat),
    ])
    model = make_pipeline(prep, LogisticRegression(max_iter=2000, random_state=seed))
    t0 = time.perf_counter()
    y_train = train[target].astype(float).astype(int)
    model.fit(train[feats], y_train)
    p = model.predict_proba(test[feats])[:, list(model.classes_).index(1)]
    y = test[target].astype(float).astype(int)
    return {"auroc": float(roc_auc_score(y, p)), "pr_auc": float(average_precision_score(y, p)),
            "seconds": time.perf_counter() - t0, "n_train": len(train), "n_test": len(test)}


def run(dataset: str = "adult", rows: int | None = None, seed: int = 0, impute: bool = True, rounds: int = 10,
        impute_rounds: int | None = None, tune: bool = False, tolerance: float = 0.01, freedom_degree: float = 1.0,
        workdir: Path = Path("benchmark-job"), min_rows: int | None = None, newton: bool = False) -> dict[str, Any]:
    """One job, its baselines and the centralised reference; a JSON-able summary (``newton``: also
    :func:`newton_check`)."""
    from fedtab.job.run import run_job

    if dataset == "adult":
        paths, target = adult_site_files(workdir / "sites", rows or 1000, seed)
    elif dataset == "heart":
        from fedtab.data.example_sites import write_heart_sites

        paths, target = write_heart_sites(workdir / "sites", rows=rows, seed=seed), "disease"
    else:
        raise ValueError(f"unknown dataset {dataset!r}; expected 'adult' or 'heart'")
    job = job_document(paths, target, seed=seed, impute=impute, impute_rounds=impute_rounds, rounds=rounds,
                       tune=tune, out=workdir / "job-run", tolerance=tolerance,
                       freedom_degree=freedom_degree, min_rows=min_rows)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_job(job)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    train, test = _pooled_rows(job)
    central = _centralised(train, test, target, seed)
    metrics = (result.get("training") or {}).get("metrics") or result["evaluation"]  # docs/job.md
    base = result["baselines"]
    keys = ("auroc", "pr_auc", "brier", "accuracy")
    return {
        "dataset": dataset, "rows": int(len(train) + len(test)), "seed": seed,
        "sites": {s["name"]: {"columns": len(s["columns"]), "rows": s["rows"],
                              "unavailable": s.get("unavailable_columns") or []} for s in site_summaries(result)},
        "imputation": impute, "freedom_degree": (result.get("election") or {}).get("freedom_degree"),
        "kept": len(result["training"]["features"]),
        "federated": {k: metrics["pooled"].get(k) for k in (*keys, "auroc_error_bound", "n")},
        "federated_per_site": {s: m.get("auroc") for s, m in metrics["per_site"].items()},
        "local_only": {k: base["local_only"]["pooled"].get(k) for k in keys},
        "local_only_per_site": {s: m.get("auroc") for s, m in base["local_only"]["per_site"].items()},
        "majority": {k: base["majority"]["pooled"].get(k) for k in keys},
        "centralised": central,
        "steps": result["steps"],
        "exchanges": sum(st["exchanges"] for st in result["steps"]),
        "seconds": seconds,
        "cpu_seconds": cpu,
        **({"newton": newton_check(job)} if newton else {}),
    }


def newton_check(job: dict[str, Any]) -> dict[str, Any]:
    """The job once more in-process (:func:`fedtab.job.workflow.run_workflow` on a
    :class:`~fedtab.engines.LocalFederation`), its exchanges counted, and its logistic model against
    scikit-learn's ``LogisticRegression`` (``C = 1/(l2·N)``, tol 1e-12) on the sites' own standardised
    training rows pooled: ``{"exchanges", "per_step", "newton_iterations", "max_abs_coef_diff"}``."""
    import numpy as np

    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job import load_job
    from fedtab.job.run import site_configs
    from fedtab.job.workflow import run_workflow
    from fedtab.learn.models import make_model

    spec = load_job(job)
    sites = [build_site(c) for c in site_configs(spec)]
    fed = LocalFederation(sites)
    out = run_workflow(fed, spec)
    tr = out.outcomes["training"]
    X, y = zip(*(s.state["train_setup"]["_cache"]["train"] for s in sites))
    X, y = np.vstack(X), np.concatenate(y)
    l2 = make_model(tr.model_spec).get_params()["l2"]
    sk = LogisticRegression(C=1 / (l2 * len(y)), tol=1e-12, max_iter=100_000).fit(X, y)
    diff = max(float(np.abs(tr.params["coef"] - sk.coef_).max()),
               float(np.abs(tr.params["intercept"] - sk.intercept_).max()))
    return {"exchanges": fed.exchange_count, "per_step": {st["step"]: st["exchanges"] for st in out.result["steps"]},
            "newton_iterations": tr.rounds, "max_abs_coef_diff": diff}


# ----------------------------------------------------------------------------- small sites, through the job
def _site_files(case: str, seed: int, directory: Path) -> tuple[list[Path], str]:
    """The consortium of :func:`benchmarks.small_sites.site_tables` as site CSVs (empty cell = missing)."""
    from .small_sites import site_tables

    tables, target = site_tables(case, seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in tables.items():
        paths.append(directory / f"{name}.csv")
        table.to_csv(paths[-1], index=False)
    return paths, target


def _small_job(paths: list[Path], target: str, seed: int, out: Path, *, tune: bool, rounds: int,
               impute_rounds: int | None) -> dict[str, Any]:
    from .small_sites import L2_GRID, POLICY, TEST_SIZE

    job: dict[str, Any] = {
        "target": target, "sites": {p.stem: {"path": str(p), "min_rows": POLICY["min_rows"]} for p in paths},
        "training": {"model": "logistic", "rounds": rounds, "local_epochs": 5},
        "run": {"seed": seed, "out": str(out), "test_size": TEST_SIZE},
    }
    # None: the job's default rounds; 0: the linear prior alone (it still fills absent columns)
    job["impute"] = {} if impute_rounds is None else {"rounds": impute_rounds}
    if tune:
        job["election"] = {"selector": "lasso", "tune": "cv", "l2_grid": list(L2_GRID)}
    return job


def _model_auroc(model_path: Path, sites: list[Any], personalised: bool) -> float:
    """Pooled AUROC of a model file's predictions on every site's raw test rows (``personalised``:
    each site's own model, as ``fedtab predict --site NAME``)."""
    import numpy as np

    from fedtab.job.model_file import load_model

    m = load_model(model_path)
    ys, ps = [], []
    for s in sites:
        rows = s.rows("test")
        proba = m.predict_proba(rows.drop(columns=[s.target]), s.name if personalised else None)
        ps.append(proba[:, 1])
        ys.append(np.array([str(v) == str(m.classes[1]) for v in rows[s.target]], dtype=int))
    return float(roc_auc_score(np.concatenate(ys), np.concatenate(ps)))


def small_sites_run(case: str, seed: int, workdir: Path, *, rounds: int = 10, impute_rounds: int | None = None
                    ) -> dict[str, Any]:
    """One consortium and seed through the job (see the module docstring)."""
    from fedtab.engines.site_config import build_site
    from fedtab.job import load_job
    from fedtab.job.run import run_job, site_configs

    from .small_sites import references

    paths, target = _site_files(case, seed, workdir / "sites")
    row: dict[str, Any] = {"case": case, "seed": seed}
    sites = None
    for name, tune in (("tuned", True), ("no_election", False)):
        job = _small_job(paths, target, seed, workdir / name, tune=tune, rounds=rounds, impute_rounds=impute_rounds)
        c0 = time.process_time()
        result = run_job(job)
        row[f"cpu_seconds_{name}"] = time.process_time() - c0
        row[f"exchanges_{name}"] = {st["step"]: st["exchanges"] for st in result["steps"]}
        if sites is None:
            sites = [build_site(c) for c in site_configs(load_job(job))]
        row[name] = _model_auroc(workdir / name / "model.fedtab", sites, personalised=tune)
        if tune:
            sel = result["selection"]
            row["tuned_global"] = _model_auroc(workdir / name / "model.fedtab", sites, personalised=False)
            row.update(kept=len(sel["features"]), columns=len(sel["all_columns"]["features"]),
                       freedom_degree=sel["freedom_degree"], personalisation=sel["personalisation"],
                       contributions=result["contributions"])
    assert sites is not None
    columns = list(dict.fromkeys(c for s in sites for c in s.feature_names))
    refs = references(sites, columns)
    row.update(local_only=refs["local_only"], centralised=refs["centralised"], test_rows=refs["test_rows"])
    row["reference"] = max(row["local_only"], row["centralised"])
    return row


def small_sites_markdown(rows: list[dict[str, Any]], command: str) -> str:
    """The per-seed table of each consortium and the done-when verdict (:func:`benchmarks.small_sites.verdict`)."""
    from .small_sites import SEED_HEADER, seed_cells, verdict

    out = [f"Command: `{command}` — the small-site consortia of `benchmarks.small_sites` through `fedtab.run_job` "
           "(local engine). Pooled test AUROC from each model file's predictions on every site's raw test rows. "
           "`tuned` = the `tune = \"cv\"` job's per-site models (`predict --site`), `tuned_global` = its pooled "
           "model, `no_election` = the same job without `[election]`. Exchanges: the whole job "
           "(schema + imputation + selection, or + training + baselines).", ""]
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        out += [f"### {case}", "", SEED_HEADER + " exchanges tuned | exchanges no_election |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            out.append(seed_cells(r) + f" {sum(r['exchanges_tuned'].values())} | "
                       f"{sum(r['exchanges_no_election'].values())} |")
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in ("tuned", "tuned_global", "no_election", "local_only",
                                                            "centralised")}
        out.append(f"| mean | {mean['tuned']:.4f} | {mean['tuned_global']:.4f} | {mean['no_election']:.4f} | "
                   f"{mean['local_only']:.4f} | {mean['centralised']:.4f} | | | | | |")
        out += [""] + [f"- {line}" for line in verdict(rs)] + [""]
    return "\n".join(out) + "\n"


def _details(r: dict[str, Any]) -> list[str]:
    """One run's tables: every model's metrics, AUROC per site, time and traffic per step."""
    f, c, lo, mj = r["federated"], r["centralised"], r["local_only"], r["majority"]
    bound = f["auroc_error_bound"]
    accuracy = (f"within {bound:.4f} of the exact value" if bound is not None else
                "the sites' histograms smoothed to runs of min_rows rows by their release gates, so without an "
                "error bound (each site's own AUROC is exact)")
    lines = [
        f"Seed {r['seed']}: the job took {r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU; metrics on the "
        f"pooled test rows of all sites ({f['n']} rows). AUROC from 1000-bin histograms, {accuracy}.",
        "",
        "| model | AUROC | PR-AUC | Brier | accuracy |",
        "|---|---:|---:|---:|---:|",
        f"| federated job (logistic, {r['kept']} elected columns, fd {r['freedom_degree']:g}"
        f"{', imputed' if r['imputation'] else ''}) | {f['auroc']:.3f} | {f['pr_auc']:.3f} | {f['brier']:.3f} | "
        f"{f['accuracy']:.3f} |",
        f"| centralised scikit-learn (pooled rows, all columns) | {c['auroc']:.3f} | {c['pr_auc']:.3f} | | |",
        f"| local-only (each site its own model) | {lo['auroc']:.3f} | {lo['pr_auc']:.3f} | {lo['brier']:.3f} | "
        f"{lo['accuracy']:.3f} |",
        f"| majority class | {mj['auroc']:.3f} | {mj['pr_auc']:.3f} | {mj['brier']:.3f} | {mj['accuracy']:.3f} |",
        "",
        "| site | columns | rows | lacks | federated AUROC | local-only AUROC |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for s, info in r["sites"].items():
        fa, la = r["federated_per_site"].get(s), r["local_only_per_site"].get(s)
        lacks = ", ".join(info["unavailable"]) or "—"
        cell = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731 (a site whose AUROC is not defined)
        lines.append(f"| {s} | {info['columns']} | {info['rows']} | {lacks} | {cell(fa)} | {cell(la)} |")
    verdict = "met" if r["exchanges"] <= MAX_EXCHANGES else "NOT met"
    lines += ["", f"Exchanges: {r['exchanges']} in all (issue 31: at most {MAX_EXCHANGES} for the heart job: {verdict}; "
              "requests that ride on another step's exchange cost none of their own).", "",
              "| step | exchanges | seconds (wall) | bytes down | bytes up |", "|---|---:|---:|---:|---:|"]
    for st in r["steps"]:
        lines.append(f"| {st.get('step', st.get('name'))} | {st['exchanges']} | {st['seconds']:.2f} | "
                     f"{st['bytes_down']:,} | {st['bytes_up']:,} |")
    nr = r.get("newton")
    if nr:
        lines += ["", f"Logistic by federated Newton–Raphson: {nr['newton_iterations']} iterations; largest "
                  f"|coefficient − pooled scikit-learn fit| = {nr['max_abs_coef_diff']:.1e} (in-process re-run: "
                  f"{nr['exchanges']} exchanges)."]
    return lines


def markdown(runs: list[dict[str, Any]], command: str) -> str:
    """The results as the tables in ``benchmarks/README.md``: one line per seed, then the first seed's details."""
    r0 = runs[0]
    lines = [
        f"Command: `{command}` — {r0['dataset']}, {r0['rows']:,} rows in {len(r0['sites'])} sites; "
        "`fedtab.run_job` on the local engine (in-process). Goals: federated ≥ centralised − 0.03 AUROC, "
        "federated > local-only.",
        "",
        "| seed | federated AUROC | centralised | local-only | majority | fed − central | fed − local | job CPU s |"
        " job wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        f, c, lo = r["federated"]["auroc"], r["centralised"]["auroc"], r["local_only"]["auroc"]
        lines.append(f"| {r['seed']} | {f:.3f} | {c:.3f} | {lo:.3f} | {r['majority']['auroc']:.3f} | {f - c:+.3f} | "
                     f"{f - lo:+.3f} | {r['cpu_seconds']:.1f} | {r['seconds']:.1f} |")
    return "\n".join([*lines, "", *_details(r0)]) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=["adult", "heart"], default="adult")
    ap.add_argument("--rows", type=int, default=None, help="rows sampled (adult: 1000; heart: all 303)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the sample, split and job")
    ap.add_argument("--no-impute", action="store_true", help="skip the imputation step")
    ap.add_argument("--freedom-degree", type=float, default=1.0, help="the election's freedom degree (default 1)")
    ap.add_argument("--tune", action="store_true", help="tune the freedom degree by grid instead")
    ap.add_argument("--tolerance", type=float, default=0.01,
                    help="with --tune: keep the smallest mask within this validation F1 of the best")
    ap.add_argument("--quick", action="store_true", help="heart, 150 rows, 3 rounds, no tuning, no imputation")
    ap.add_argument("--newton", action="store_true",
                    help="re-run the job in-process and compare its logistic model with the pooled scikit-learn fit")
    ap.add_argument("--impute-rounds", type=int, default=None,
                    help="FedHF-Impute rounds (default: the job's own [impute] rounds; 0: its linear prior alone)")
    ap.add_argument("--small-sites", action="store_true",
                    help="the small heterogeneous consortia of benchmarks.small_sites through the job (issue 22)")
    ap.add_argument("--cases", nargs="+", default=["heart", "adult"], choices=["heart", "adult", "icu"],
                    help="with --small-sites: the consortia")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the site files and each job's run folder (default: a temporary folder, removed)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="fedtab_job_bench_"))
    shown = [a for i, a in enumerate(argv) if a not in ("--out", "--work") and (i == 0 or argv[i - 1] not in ("--out", "--work"))]
    command = " ".join(["python -m benchmarks.job", *shown])
    try:
        if args.small_sites:
            return _small_sites_main(args, work, command)
        runs = _runs(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    (args.out / "job.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    md = markdown(runs, command)
    (args.out / "job.md").write_text(md)
    print(md)
    return runs


def _small_sites_main(args: argparse.Namespace, work: Path, command: str) -> list[dict[str, Any]]:
    rounds, impute_rounds = (3, 0) if args.quick else (10, args.impute_rounds)
    cases = ["heart"] if args.quick else args.cases
    rows = []
    for case in cases:
        for seed in args.seeds:
            rows.append(small_sites_run(case, seed, work / f"{case}{seed}", rounds=rounds, impute_rounds=impute_rounds))
            r = rows[-1]
            print(f"{case} seed {seed}: tuned {r['tuned']:.4f} global {r['tuned_global']:.4f} no_election "
                  f"{r['no_election']:.4f} local {r['local_only']:.4f} central {r['centralised']:.4f}", flush=True)
    (args.out / "small_sites_job.json").write_text(json.dumps({"command": command, "runs": rows}, indent=1,
                                                              default=float))
    md = small_sites_markdown(rows, command)
    (args.out / "small_sites_job.md").write_text(md)
    print(md)
    return rows


def _runs(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    runs = []
    for seed in args.seeds:
        workdir = work / f"seed{seed}"
        if args.quick:
            # 45-60 rows a site: a floor of 4 rows lets every site's test part be evaluated
            runs.append(run("heart", rows=args.rows or 150, seed=seed, impute=False, rounds=3, tune=False,
                            workdir=workdir, min_rows=4, newton=args.newton))
        else:
            runs.append(run(args.dataset, rows=args.rows, seed=seed, impute=not args.no_impute,
                            tolerance=args.tolerance, tune=args.tune, freedom_degree=args.freedom_degree,
                            workdir=workdir, newton=args.newton, impute_rounds=args.impute_rounds))
    return runs


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
