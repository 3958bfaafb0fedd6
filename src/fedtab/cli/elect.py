"""``fedtab elect``: Feature Election on real site tables (one file per site).

A thin command: its options build a :class:`~fedtab.job.spec.JobSpec` (:func:`elect_spec`),
the site files become sites as in ``fedtab run`` (:func:`fedtab.job.run.site_configs`), and
the job's step loop runs them in this process. The output folder holds ``result.json`` (the
election in this command's vocabulary, plus the job's ``privacy``, ``trust`` and
``participation``), ``report.html`` and ``elected_columns.txt``.

``--fdr Q`` (or ``--method score-test``) chooses the columns by the pooled score test instead of
the vote (:func:`selection_method`): the job's ``[election] method = "score-test"`` with ``fdr``,
whose record (``result["election"]``: ``method``, ``fdr``, ``p``, ``mask``...) ``result.json``
then holds at its top and as ``election``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from . import PlainHelp, console, fail, finite_number, outcome

__all__ = ["elect_command", "elect_spec", "max_site_share_option", "option_text", "selection_method"]

#: how the command is registered: its 30 options print as plain text, readable at 80 columns
COMMAND_SETTINGS = {"cls": PlainHelp}

#: job keys -> the options that set them, for error messages in this command's words
OPTIONS = {"[election] freedom_degree": "--freedom-degree", "[election] tune": "--tune",
           "[election] aggregation": "--aggregation", "[election] normalization": "--normalization",
           "[election] compat": "--compat", "[election] consensus_alpha": "--consensus-alpha",
           "[election] consensus": "--consensus", "[training] rounds": "--rounds",
           "[training] local_epochs": "--local-epochs", "[training] model": "--model", "[run] test_size": "--test-size",
           "[privacy] secure_aggregation": "--secure-aggregation", "[trust] min_sites": "--min-sites",
           "[trust] min_holders": "--min-holders", "[trust] timeout": "--timeout", "[trust] robust": "--robust",
           "[trust] max_site_share": "--max-site-share", "[columns] categorical": "--categorical",
           "[columns] ignore": "--ignore", "[columns] keep": "--categorical",
           "na_values = [...] in the job": "--na-value"}


def option_text(message: str, options: dict[str, str] = OPTIONS) -> str:
    """``message`` (a :class:`~fedtab.job.spec.JobError`) with job keys replaced by the options."""
    for key, option in options.items():
        message = message.replace(key, option)
    return message


def max_site_share_option(value: float) -> float:
    """Typer callback of ``--max-site-share``: a number in (0, 1], NaN refused at parse time."""
    from fedtab.federation.protocol.reduce import check_max_site_share

    try:
        return check_max_site_share(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("max_site_share", "--max-site-share")) from None


#: the command's options the vote uses and the score test does not, beyond the estimator's (their defaults)
_VOTE_OPTIONS = {"robust": False, "min_holders": None}


def selection_method(method: str | None, fdr: str | None, fdr_method: str, options: dict[str, Any]
                     ) -> tuple[str, float | None]:
    """``(method, q)`` from ``--method``, ``--fdr`` and ``--fdr-method``: ``--fdr`` implies the
    score test, ``q`` is ``None`` without it. ``options`` are the command's (the vote's settings
    must stay at their defaults with the score test).

    Raises:
        ValueError: one line in the command's words: an unknown method or correction, a ``q``
            that is not a number in (0, 1), ``--fdr`` / ``--fdr-method`` with ``--method vote``,
            a vote option with the score test.
    """
    from ..election.score_test import check_fdr
    from ..estimators.election import vote_settings

    if method not in (None, "vote", "score-test"):
        raise ValueError(f"--method must be 'vote' or 'score-test', got {method!r}")
    try:
        check_fdr(0.05, fdr_method)
    except ValueError:
        raise ValueError(f"--fdr-method must be 'bh' or 'by', got {fdr_method!r}") from None
    q = None
    if fdr is not None:
        try:
            q = float(fdr)
            check_fdr(q, fdr_method)
        except ValueError:
            raise ValueError(f"--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got {fdr!r}") from None
    method = method or ("score-test" if q is not None else "vote")
    if method == "vote":
        if q is not None or fdr_method != "bh":
            raise ValueError("--fdr and --fdr-method select by the pooled score test (--method score-test), "
                             "not by the vote")
        return method, q
    sel = options.get("selector") or ["lasso"]
    given = vote_settings({**options, "selector": sel[0] if len(set(sel)) == 1 else sel})
    given += [k for k, d in _VOTE_OPTIONS.items() if options.get(k, d) != d]
    if given:
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{'--fdr' if q is not None else '--method score-test'} selects by the pooled score test, "
                         f"without a vote: {names} {'applies' if len(given) == 1 else 'apply'} to the vote")
    return method, q


def elect_spec(tables: list[Path], names: list[str], selectors: list[str], target: str, *, options: dict[str, Any]
               ) -> Any:
    """The validated :class:`~fedtab.job.spec.JobSpec` of ``fedtab elect`` (``options``: the command's).

    Raises:
        JobError: an invalid option, naming its job key.
    """
    from ..job.spec import (ColumnsSpec, ElectionSpec, EvaluationSpec, JobSpec, PrivacySpec, RunSpec, SiteSpec,
                            TrainingSpec, TrustSpec, check_spec)

    o = options
    tuned = o["tune"] != "none"
    score_test = o.get("method") == "score-test"
    return check_spec(JobSpec(
        target=target,
        sites=[SiteSpec(n, p, na_values=list(o["na_value"] or []), selector=s, min_rows=o["min_rows"])
               for n, p, s in zip(names, tables, selectors)],
        election=ElectionSpec(selector=selectors[0], freedom_degree=None if tuned or score_test else o["freedom_degree"],
                              tune=o["tune"], aggregation=o["aggregation"], normalization=o["normalization"],
                              compat=o["compat"], tolerance=o["tolerance"], consensus=o["consensus"],
                              consensus_alpha=o["consensus_alpha"], method=o.get("method", "vote"),
                              fdr=o.get("fdr"), fdr_method=o.get("fdr_method", "bh")),
        training=TrainingSpec(o["model"], o["rounds"], o["local_epochs"]) if o["train"] or tuned else None,
        run=RunSpec(seed=o["seed"], out=o["out"], test_size=o["test_size"]),
        privacy=PrivacySpec(secure_aggregation=o["secure_aggregation"]),
        trust=TrustSpec(robust=o["robust"], max_site_share=o["max_site_share"], min_sites=o["min_sites"],
                        timeout=o["timeout"], min_holders=o["min_holders"]),
        evaluation=EvaluationSpec(baselines=False, all_columns=True),
        columns=ColumnsSpec(categorical=list(o.get("categorical") or []), ignore=list(o.get("ignore") or [])),
        source="fedtab elect"))


def _site_names(tables: list[Path]) -> list[str]:
    """File stems, made unique (``a``, ``a-2``...)."""
    names: list[str] = []
    for p in tables:
        stem = p.name.split(".")[0] or "site"
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


#: what the spinner says while each step of the job runs
_STATUS = {"schema": "reading the sites' column profiles (names, kinds, coarse ranges; no rows)",
           "categories": "agreeing categories of the text columns (sites send category sets, no rows)",
           "tuning": "tuning the freedom degree on validation rows", "election": "sites are voting",
           "training": "training on the elected columns (FedAvg)", "all_columns": "training on all columns (FedAvg)"}


def _vote_part(outputs: Any, selectors: list[str], tables: list[Path]) -> dict[str, Any]:
    """The vote's part of ``result.json``: its sites (ballots) and result, also as ``election``."""
    outcome = outputs.outcomes["election"]
    result = outcome.result
    return {"sites": [dict(s, selector=sel, file=str(p)) for s, sel, p in zip(outcome.site_summary(), selectors, tables)],
            **result.to_dict(), "min_holders": result.min_holders,
            "election": {**result.to_dict(), "features": result.explain_records()}}


def _score_test_part(outputs: Any, spec: Any, tables: list[Path]) -> dict[str, Any]:
    """The score test's part of ``result.json``: its sites (training rows) and the record the job's
    score-test step wrote (``result["election"]``), also as ``election``."""
    record, info = outputs.result["election"], outputs.result["sites"] or {}
    sites = [{"name": s.name, "file": str(p), "n_samples": (info.get(s.name) or {}).get("n_train")}
             for s, p in zip(spec.sites, tables)]
    return {"sites": sites, **record, "election": record}


def _document(outputs: Any, spec: Any, selectors: list[str], tables: list[Path]) -> dict[str, Any]:
    """``result.json`` of ``fedtab elect`` from the job's outputs."""
    r = outputs.result
    part = (_score_test_part(outputs, spec, tables) if spec.election.method == "score-test"
            else _vote_part(outputs, selectors, tables))
    doc: dict[str, Any] = {"categorical_columns": list((r["schema"] or {}).get("categorical", [])), **part}
    if r["tuning"] is not None:
        doc["tuning"] = r["tuning"]
    trained, full = outputs.outcomes.get("training"), outputs.outcomes.get("all_columns")
    if full is not None:
        doc["training"] = {
            "model": trained.model, "robust": trained.robust, "left_out": {**full.left_out, **trained.left_out},
            "rounds": spec.training.rounds, "features": trained.features, "classes": trained.classes,
            "metrics": trained.metrics, "all_features": {"f1": full.pooled["weighted_f1"], "n_params": full.n_params},
            "elected": {"f1": trained.pooled["weighted_f1"], "n_params": trained.n_params,
                        "per_site_f1": {k: v["weighted_f1"] for k, v in trained.per_site.items()}}}
    for key in ("privacy", "trust", "participation", "steps"):
        doc[key] = r[key]
    doc["dropped"] = r["participation"]["dropped"]
    doc["ignored_columns"] = dict((r["schema"] or {}).get("ignored") or {})
    doc["one_class_sites"] = [s for s, info in (r["sites"] or {}).items() if info.get("one_class")]
    return doc


def _write_outputs(out: Path, doc: dict[str, Any], outputs: Any, spec: Any) -> None:
    """Write ``result.json`` (``doc``), ``elected_columns.txt`` (one selected column a line) and
    ``report.html`` (the run's ``outputs`` with the election of ``doc`` and the job ``spec``) into
    ``out``, all at once or none (:func:`~fedtab.report.output.atomic_dir`).

    Raises:
        typer.Exit: the folder cannot be written (a one-line error, :func:`~fedtab.cli.fail`).
    """
    from ..report.output import atomic_dir

    try:
        with atomic_dir(out) as tmp:
            (tmp / "result.json").write_text(json.dumps(doc, indent=2))
            selected = doc["selected"]
            (tmp / "elected_columns.txt").write_text("\n".join(selected) + ("\n" if selected else ""))
            from ..report import write_report

            write_report({**outputs.result, "election": doc["election"], "job": spec.to_dict()}, tmp / "report.html",
                         command="elect")
    except OSError as exc:
        fail(f"cannot write to {out}: {exc}")


def _print_left_out(doc: dict[str, Any], spec: Any) -> None:
    """Print (yellow) the sites left out of the run, the columns left out and the one-class sites
    of ``doc`` (with what their rows did under the ``spec``'s election method)."""
    for name, why in doc["dropped"].items():
        console.print(f"site {name!r} was left out: {why}", style="yellow", markup=False, highlight=False)
    for col, why in doc["ignored_columns"].items():
        console.print(f"column {col!r} left out: {why}", style="yellow", markup=False, highlight=False)
    for name in doc["one_class_sites"]:
        role = ("its rows count in the pooled score test" if spec.election.method == "score-test"
                else "it abstains from the vote")
        console.print(f"site {name!r} holds one class only ({role})", style="yellow", markup=False, highlight=False)


def elect_command(
    tables: Annotated[list[Path], typer.Argument(help="One CSV/Parquet file per site (at least one).")],
    target: Annotated[str, typer.Option("--target", "-t", help="Label column, present at every site.")],
    selector: Annotated[Optional[list[str]], typer.Option(
        "--selector", "-s", help="Selector for all sites, or repeat once per site in file order: lasso, "
                                 "elastic_net, random_forest, mutual_info, anova, chi2 (or any registered).")] = None,
    freedom_degree: Annotated[float, typer.Option(
        "--freedom-degree", "--fd", min=0.0, max=1.0, callback=finite_number,
        help="Share of disputed features admitted by vote (0 = intersection, 1 = union).")] = 0.5,
    aggregation: Annotated[str, typer.Option(help="Site weights: 'weighted' (by rows) or 'uniform'.")] = "weighted",
    normalization: Annotated[str, typer.Option(
        help="'all' (fedtab) or 'selected' (NVIDIA FLARE's normalisation only).")] = "all",
    compat: Annotated[Optional[str], typer.Option(
        help="Elect with a peer's whole server rule, exactly: 'nvflare', 'flash' or 'flower' (default: "
             "fedtab's rule).")] = None,
    tune: Annotated[str, typer.Option(
        help="Choose fd on validation rows: 'none' (use --freedom-degree), 'grid' (smallest mask within "
             "--tolerance of the best) or 'hill-climb' (the peers' search).")] = "none",
    model: Annotated[str, typer.Option(help="Model trained by the federation: logistic, sgd, gnb (exact) or "
                                            "mlp.")] = "logistic",
    tolerance: Annotated[float, typer.Option(min=0.0, help="Grid tuning: F1 slack within which the smallest "
                                                           "mask wins.")] = 0.01,
    train: Annotated[bool, typer.Option(help="Train the model on all and on the elected columns (always on with "
                                             "--tune).")] = True,
    rounds: Annotated[int, typer.Option(min=1, help="FedAvg rounds when training.")] = 10,
    local_epochs: Annotated[int, typer.Option(min=1, help="Local epochs per FedAvg round.")] = 5,
    test_size: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of each site's rows held out for "
                                                                    "testing.")] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the train/test splits and selectors.")] = 0,
    min_rows: Annotated[int, typer.Option(min=1, help="Every site's disclosure floor: no number computed over "
                                                      "fewer rows leaves a site.")] = 10,
    robust: Annotated[bool, typer.Option("--robust", help="Robust reducers: median vote, screened and capped "
                                                          "moments, median FedAvg and scores (docs/trust.md).")] = False,
    max_site_share: Annotated[float, typer.Option(callback=max_site_share_option,
                                                  help="With --robust: most of a pooled sum one site may carry.")] = 0.5,
    out: Annotated[Path, typer.Option(help="Output directory: result.json, report.html and "
                                           "elected_columns.txt.")] = Path("fedtab-elect"),
    na_value: Annotated[Optional[list[str]], typer.Option(help="Extra strings read as missing (repeatable), e.g. "
                                                               "'?'.")] = None,
    min_holders: Annotated[Optional[int], typer.Option(min=1, help="Sites that must hold a feature for it to be "
                                                       "consensus (default 2 with two or more sites).")] = None,
    min_sites: Annotated[Optional[int], typer.Option(min=1, help="Quorum: a site that fails or sends a rejected "
                                                     "reply is dropped (named) while this many remain (default: "
                                                     "all).")] = None,
    timeout: Annotated[Optional[float], typer.Option(min=0.001, callback=finite_number,
                                                     help="Seconds each site may take per exchange (default: no "
                                                          "limit).")] = None,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Sums the server needs (descriptions, updates, evaluation counts) travel "
                                     "masked: it learns no single site's. Not with --tune.")] = False,
    consensus: Annotated[str, typer.Option(
        help="'intersection' (the rule) or 'stouffer': consensus = features whose combined p-value passes "
             "Benjamini-Hochberg (label-skewed sites; needs a test-based selector such as anova).")
    ] = "intersection",
    consensus_alpha: Annotated[float, typer.Option(min=0.0, max=1.0, callback=finite_number,
                                                   help="False discovery rate of --consensus stouffer.")] = 0.05,
    categorical: Annotated[Optional[list[str]], typer.Option(
        "--categorical", help="Column to treat as categories, e.g. codes (repeatable).")] = None,
    ignore: Annotated[Optional[list[str]], typer.Option(
        "--ignore", help="Column to leave out at every site (repeatable).")] = None,
    pooled_comparison: Annotated[bool, typer.Option(
        "--pooled-comparison", help="Simulation (all files here): also run the selector on all sites' training "
                                    "rows stacked; Jaccard agreement per freedom degree.")] = False,
    method: Annotated[Optional[str], typer.Option(
        help="How the columns are chosen: 'vote' (Feature Election) or 'score-test' (score tests on the sites' "
             "pooled rows: forward selection, or with --fdr one correction over every column; binary or class "
             "targets) (default: score-test with --fdr, else vote).")] = None,
    fdr: Annotated[Optional[str], typer.Option(
        "--fdr", metavar="Q", help="Select with error control: every column's pooled score test, one correction "
                                   "at false discovery rate Q in (0, 1), e.g. 0.05 (at most that share of the "
                                   "kept columns is expected to carry no signal). Implies --method score-test; "
                                   "not with the vote's options.")] = None,
    fdr_method: Annotated[str, typer.Option(
        help="The --fdr correction: 'bh' (Benjamini-Hochberg; independent or positively dependent columns) or "
             "'by' (Benjamini-Yekutieli; any dependence, more conservative).")] = "bh",
) -> None:
    """Feature Election on real tables: one file per site, each site votes with its own selector (or, with
    --fdr, selection at a false discovery rate by the sites' pooled score tests)."""
    from ..data.tables import TableError, read_table
    from ..engines.local import LocalFederation
    from ..engines.site_config import build_site
    from ..federation import FederationError
    from ..job.run import site_configs
    from ..job.workflow import run_workflow
    from ..report.output import OutputError, check_writable

    options = dict(locals())
    if tune == "cv":
        fail("--tune cv is the job's model selection ([election] tune = \"cv\" with fedtab run); fedtab elect "
             "tunes with 'grid' or 'hill-climb'")
    try:
        check_writable(out)
        sel_names = selector or ["lasso"]
        if len(sel_names) not in (1, len(tables)):
            fail(f"give one --selector for all sites or one per site ({len(tables)}), got {len(sel_names)}")
        sel_names = sel_names * len(tables) if len(sel_names) == 1 else sel_names
        options["method"], options["fdr"] = selection_method(method, fdr, fdr_method, options)
        if pooled_comparison and len(set(sel_names)) > 1:
            fail("--pooled-comparison needs one --selector shared by every site")
        if min_sites is not None and min_sites > len(tables):
            fail(f"--min-sites {min_sites} is more than the {len(tables)} site file(s)")
        frames = [read_table(p, na_values=na_value) for p in tables]
        lacking = [str(p) for p, f in zip(tables, frames) if target not in f.columns]
        if lacking:
            fail(f"target column {target!r} is missing at: {', '.join(lacking)} (the sites need a common target)")
        spec = elect_spec(tables, _site_names(tables), sel_names, target, options=options)
        fed = LocalFederation([build_site(c) for c in site_configs(spec)])
        with console.status("starting") as status:
            outputs = run_workflow(fed, spec, progress=lambda step: status.update(_STATUS.get(step, step)))
            doc = _document(outputs, spec, sel_names, tables)
            if pooled_comparison:
                status.update("running the selector on the pooled training rows (simulation)")
                doc["election"]["pooled_agreement"] = _pooled_agreement(fed, outputs, spec, sel_names[0])
    except (TableError, FederationError, ValueError, OutputError) as exc:
        fail(option_text(str(exc)))
        return
    if spec.election.method == "score-test":
        _print_score_test(doc)
    else:
        _print_summary(doc, outputs.outcomes["election"].result, freedom_degree=doc["freedom_degree"], tuned=tune)
    _print_training(doc, model)
    _write_outputs(out, doc, outputs, spec)
    _print_left_out(doc, spec)
    outcome(f"wrote {out / 'result.json'}, {out / 'report.html'} and {out / 'elected_columns.txt'}")


def _pooled_agreement(fed: Any, outputs: Any, spec: Any, selector: str) -> list[dict[str, Any]]:
    """The Jaccard agreement of the election with the selector on the pooled training rows."""
    from ..election.agreement import DEFAULT_FREEDOM_DEGREES, pooled_agreement, pooled_mask
    from ..election.rule import RuleSettings

    outcome, e = outputs.outcomes["election"], spec.election
    result = outcome.result
    names = list(result.feature_names)
    ref = pooled_mask([fed.site(s).rows("train") for s in fed.sites], spec.target, selector, names)
    return pooled_agreement(outcome.ballots, ref, feature_names=names,
                            freedom_degrees=sorted({*DEFAULT_FREEDOM_DEGREES, float(result.freedom_degree)}),
                            rule=RuleSettings(aggregation=e.aggregation, normalization=e.normalization,
                                              compat=e.compat, consensus=e.consensus,
                                              consensus_alpha=e.consensus_alpha, min_holders=result.min_holders))


def _print_summary(doc: dict[str, Any], result: Any, *, freedom_degree: float, tuned: str) -> None:
    from rich.table import Table

    rule = f"compat={result.compat}" if result.compat else f"normalization={result.normalization}"
    tab = Table(title=f"Feature Election (fd={freedom_degree:g}, {result.aggregation}, {rule})")
    for col in ("site", "selector", "rows (train)", "selected"):
        tab.add_column(col)
    for s in doc["sites"]:
        tab.add_row(s["name"], s["selector"], str(s["n_samples"]), str(s["selected"]))
    console.print(tab)
    st = result.stats
    console.print(f"intersection {st['intersection']}, union {st['union']}, disputed {st['disputed']} → "
                  f"[bold]{st['kept']}[/] of {st['features']} columns elected")
    if "tuning" in doc:
        console.print(f"tuned freedom degree ({tuned}): {freedom_degree:g}")


#: the corrections' names, as the report writes them
_CORRECTIONS = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli"}


def _print_score_test(doc: dict[str, Any]) -> None:
    """The score test's summary: sites and their training rows, the error control, the kept columns."""
    from rich.table import Table

    tab = Table(title="Pooled score test")
    for col in ("site", "rows (train)"):
        tab.add_column(col)
    for s in doc["sites"]:
        tab.add_row(s["name"], str(s["n_samples"]))
    console.print(tab)
    fdr = doc["fdr"]
    level = (f"false discovery rate q = {fdr['q']:g} ({_CORRECTIONS[fdr['method']]})" if fdr is not None
             else f"forward selection, {_CORRECTIONS[doc['fdr_method']]} at alpha {doc['alpha']:g} per step")
    console.print(f"{level} → [bold]{doc['kept']}[/] of {doc['stats']['features']} columns kept",
                  highlight=False)
    if doc["selected"]:
        p = dict(zip(doc["feature_names"], doc["p"]))
        console.print("kept (pooled p-value): " + ", ".join(f"{c} ({p[c]:.2g})" for c in doc["selected"]),
                      markup=False, highlight=False)


def _print_training(doc: dict[str, Any], model: str) -> None:
    """The training's summary line: weighted F1 on all and on the kept columns (when trained)."""
    if "training" in doc:
        t = doc["training"]
        console.print(f"{model} trained by the federation, weighted F1: all columns {t['all_features']['f1']:.3f} "
                      f"({t['all_features']['n_params']} params), elected {t['elected']['f1']:.3f} "
                      f"({t['elected']['n_params']} params)")
