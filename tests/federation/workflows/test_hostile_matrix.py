"""Hostile-site matrix (issue 10, item 7): every protocol step x every garbage/poison attack.

Five sites, four honest (``honest-1`` ... ``honest-4``) and ``mallory``, whose replies to one
step are rewritten after its honest handler (:class:`fedtab.testing.HostileSite`), so the
wire format, the validators and the reducers all see the attack. A case passes when the
run either rejects mallory by name (an error naming it and no honest site) or keeps the
honest sites' results within 0.05 F1 / 15 % RMSE of the all-honest run — measured on the
honest sites' own held-out rows with the returned model, not on what the sites report
(plus, for the training workflow, the reported pooled F1). Garbage must be handled in both
modes; poison with ``robust=True``. ``test_poison_hurts_without_robust`` shows the
tolerances bite: the same poison without robust mode moves the result past them.

Issue 20 item 7 extends it: sums whose squares overflow float64 (``overflow``, every step;
in the description, the score test's sums, the imputation statistics and the pooled ANOVA's
class moments the forger is named and, under a quorum, dropped -- every honest site stays
and the result equals the run without it), malformed class moments, and careless users'
files: every broken model file and job file (:func:`fedtab.testing.hostile_model_files`,
:func:`fedtab.testing.hostile_job_files`) is one line and exit code 2 on the CLI.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol import set_options

from fedtab.data import classification_table, split_rows
from fedtab.data.impute_datasets import heterogeneous_split
from fedtab.engines.local import LocalFederation
from fedtab.federation import FederationError, Site, gather_ballots, run_election, run_training
from fedtab.federation.site.matrices import label_key, site_matrix
from fedtab.learn.metrics import confusion, scores_from_confusion
from fedtab.learn.models import make_model
from fedtab.testing import GARBAGE, MALFORMED_CLASS_MOMENTS, POISON, HostileSite
from fedtab.testing.hostile import JOB_FILE_ATTACKS, MODEL_FILE_ATTACKS

HONEST = [f"honest-{i}" for i in range(1, 5)]
HOSTILE = "mallory"
F1_TOL = 0.05
RMSE_TOL = 0.15
TRAINING_STEPS = ("ballot", "describe", "fit", "evaluate")
IMPUTE_STEPS = ("impute_stats", "impute_fit")
LASSO = {"name": "lasso", "params": {"C": 0.1}}


def _rejected(exc: BaseException) -> None:
    """A rejection must name mallory, and only mallory."""
    text = str(exc)
    assert HOSTILE in text, f"the error does not name the hostile site: {text[:300]}"
    assert "honest-" not in text, f"the error blames an honest site: {text[:300]}"


# ----------------------------------------------------------------------------- training
def _training_sites(step: str | None = None, attack: str | None = None) -> list[Site]:
    table = classification_table(1000, 24, 6, 4, seed=3)
    parts = split_rows(table, [0.2] * 5, stratify="target", seed=3)
    sites: list[Site] = []
    for name, part in zip(HONEST + [HOSTILE], parts):
        if name == HOSTILE and step is not None:
            sites.append(HostileSite(name, part, "target", step=step, attack=attack, selector=LASSO))
        else:
            sites.append(Site(name, part, "target", selector=LASSO))
    return sites


def _honest_f1(outcome, sites: list[Site]) -> float:
    """Weighted F1 of the returned model on the honest sites' test rows (ground truth)."""
    model = make_model(outcome.model)
    index = {c: i for i, c in enumerate(outcome.classes)}
    total = np.zeros((len(index), len(index)), dtype=np.int64)
    for site in sites:
        if site.name == HOSTILE:
            continue
        X, y_raw = site_matrix(site, outcome.features, "test")
        Z = (X - outcome.mean) / outcome.std
        Z[np.isnan(Z)] = 0.0
        total += confusion([index[label_key(v)] for v in y_raw], model.predict(outcome.params, Z), len(index))
    return scores_from_confusion(total)["weighted_f1"]


def _train(sites: list[Site], robust: bool, ballots=None) -> tuple[float, float]:
    fed = LocalFederation(sites)
    set_options(fed, robust=robust)
    run_election(fed, 0.5, ballots=ballots)
    outcome = run_training(fed, rounds=2, local_epochs=3)
    return _honest_f1(outcome, sites), outcome.pooled["weighted_f1"]


@pytest.fixture(scope="module")
def honest_ballots() -> list:
    """The honest ballots (every step but ``ballot`` reuses them: the selectors are the slow part)."""
    return gather_ballots(LocalFederation(_training_sites()))


@pytest.fixture(scope="module")
def training_baseline(honest_ballots) -> tuple[float, float]:
    return _train(_training_sites(), False, honest_ballots)


def _check_training(step: str, attack: str, robust: bool, baseline: tuple[float, float], ballots: list) -> None:
    try:
        honest, reported = _train(_training_sites(step, attack), robust, None if step == "ballot" else ballots)
    except (FederationError, ValueError) as exc:
        _rejected(exc)
        return
    assert abs(honest - baseline[0]) <= F1_TOL, f"honest sites' F1 {honest:.3f}, all-honest {baseline[0]:.3f}"
    assert abs(reported - baseline[1]) <= F1_TOL, f"reported pooled F1 {reported:.3f}, all-honest {baseline[1]:.3f}"


#: garbage that the decoder and validators must stop before any reducer runs: tried once (plain
#: mode); numeric garbage reaches the reducers and is tried in both modes.
WIRE_GARBAGE = ("deep_meta", "huge_shape", "huge_count")


def _garbage_cases(steps: tuple[str, ...]) -> list:
    cases = []
    for step in steps:
        for attack in GARBAGE:
            for robust in (False, True):
                if robust and attack in WIRE_GARBAGE:
                    continue
                cases.append(pytest.param(step, attack, robust, id=f"{step}-{attack}-{'robust' if robust else 'plain'}"))
    return cases


@pytest.mark.parametrize(("step", "attack", "robust"), _garbage_cases(TRAINING_STEPS))
def test_training_garbage(step: str, attack: str, robust: bool, training_baseline, honest_ballots) -> None:
    _check_training(step, attack, robust, training_baseline, honest_ballots)


@pytest.mark.parametrize("attack", POISON)
@pytest.mark.parametrize("step", TRAINING_STEPS)
def test_training_poison_robust(step: str, attack: str, training_baseline, honest_ballots) -> None:
    """Robust mode keeps the honest sites' model under every poison (logistic by Newton–Raphson: the
    median of the sites' own Newton steps, so a liar claiming 10⁶× its rows with a reversed gradient
    moves only its own step)."""
    _check_training(step, attack, True, training_baseline, honest_ballots)


# ----------------------------------------------------------------------------- imputation
def _impute_data():
    """Five sites' tables (6 of 8 columns each) and held-out rows to score the honest sites on."""
    rng = np.random.default_rng(11)
    n, f = 900, 8
    z = rng.normal(size=(n, 2))
    x = z @ rng.normal(size=(2, f)) + 0.3 * rng.normal(size=(n, f))
    x = x * rng.uniform(1, 20, size=f) + rng.uniform(-50, 50, size=f)  # real units, not z-scores
    x[rng.random(x.shape) < 0.1] = np.nan
    cols = [f"c{i}" for i in range(f)]
    table = pd.DataFrame(x, columns=cols)
    split = heterogeneous_split(cols, n, n_sites=5, keep_fraction=0.75, seed=2)
    tables, held_out = {}, {}
    for name, rows, keep in zip(HONEST + [HOSTILE], split.rows, split.columns):
        k = int(0.8 * len(rows))
        tables[name] = table.iloc[rows[:k]][keep].reset_index(drop=True)
        held_out[name] = (table.iloc[rows[k:]].reset_index(drop=True), keep)
    return tables, held_out


_IMPUTE = dict(rounds=3, local_epochs=1, hidden_dim=8, n_layers=1, batch_size=32, max_steps_per_round=4,
               k_neighbors=4, seed=0)


def _impute(step: str | None, attack: str | None, robust: bool) -> float:
    """Original-units RMSE on the honest sites' held-out rows: 30 % of their own observed
    cells hidden, plus the columns they do not hold."""
    from fedtab.imputer import FederatedImputer

    tables, held_out = _impute_data()
    sites = [HostileSite(n, t, step=step, attack=attack, test_size=0.2) if n == HOSTILE and step is not None
             else Site(n, t, test_size=0.2) for n, t in tables.items()]
    imp = FederatedImputer(robust=robust, **_IMPUTE).fit_federation(LocalFederation(sites))
    se, count = 0.0, 0
    for name in HONEST:
        truth, keep = held_out[name]
        query = truth[keep]
        hide = query.notna().to_numpy() & (np.random.default_rng(5).random(query.shape) < 0.3)
        pred = imp.transform(query.mask(hide))[truth.columns].to_numpy()
        target = truth.to_numpy()
        scored = ~np.isnan(target) & ~np.isin(truth.columns, keep)[None, :]
        scored[:, np.isin(truth.columns, keep)] |= hide
        se += float(((pred - target)[scored] ** 2).sum())
        count += int(scored.sum())
    return float(np.sqrt(se / count))


@pytest.fixture(scope="module")
def impute_baseline() -> float:
    pytest.importorskip("torch")
    return _impute(None, None, robust=False)


def _check_impute(step: str, attack: str, robust: bool, baseline: float) -> None:
    try:
        rmse = _impute(step, attack, robust)
    except (FederationError, ValueError) as exc:
        _rejected(exc)
        return
    assert abs(rmse - baseline) <= RMSE_TOL * baseline, f"honest sites' RMSE {rmse:.4g}, all-honest {baseline:.4g}"


@pytest.mark.parametrize(("step", "attack", "robust"), _garbage_cases(IMPUTE_STEPS))
def test_impute_garbage(step: str, attack: str, robust: bool, impute_baseline) -> None:
    _check_impute(step, attack, robust, impute_baseline)


@pytest.mark.parametrize("attack", POISON)
@pytest.mark.parametrize("step", IMPUTE_STEPS)
def test_impute_poison_robust(step: str, attack: str, impute_baseline) -> None:
    _check_impute(step, attack, True, impute_baseline)


@pytest.mark.parametrize("step", ["fit", "evaluate", "impute_stats"])
def test_poison_hurts_without_robust(step: str, training_baseline, honest_ballots, request) -> None:
    """The tolerances bite: the strongest poison (10⁶× the rows, reversed) passes validation and,
    without robust mode, moves the result past them (so the robust cases above are not vacuous).

    ``fit`` attacks the training exchanges of the run's solver: with logistic regression's default,
    Newton–Raphson, the ``"newton"`` replies (gradient reversed, gradient and Hessian sums and
    ``n_samples`` scaled as consistently as the declared rows — a liar whose ``n_samples`` did not
    match its declaration would simply be refused by the Newton checker)."""
    if step == "impute_stats":
        baseline = request.getfixturevalue("impute_baseline")
        assert abs(_impute(step, "rows_reversed", False) - baseline) > RMSE_TOL * baseline
        return
    honest, reported = _train(_training_sites(step, "rows_reversed"), False, honest_ballots)
    assert abs(honest - training_baseline[0]) > F1_TOL or abs(reported - training_baseline[1]) > F1_TOL


# ----------------------------------------------------------------------------- overflowing sums, malformed moments
# (issue 20 item 7). Sums of 1e250 (``overflow``): their squares overflow float64, which once turned a
# moments check into ``inf - inf`` that passed. Now the forger is rejected by name; under a quorum it is
# dropped, every honest site stays, and the result equals the run without it.
QUORUM = 3


def _honest_sites() -> list[Site]:
    return [s for s in _training_sites() if s.name != HOSTILE]


def _only_mallory_dropped(fed: LocalFederation) -> None:
    assert set(fed.dropped) == {HOSTILE}, fed.dropped
    assert "honest-" not in fed.dropped[HOSTILE]
    assert all(set(p["sites"]) >= set(HONEST) for p in fed.participation), fed.participation


def _close(a, b) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-9, atol=1e-12)


def _training_run(sites: list[Site], min_sites: int | None = None):
    fed = LocalFederation(sites)
    return fed, run_training(fed, rounds=2, local_epochs=3, min_sites=min_sites)


def _score_run(sites: list[Site], min_sites: int | None = None):
    from fedtab.federation.workflows.score_test.server import run_pooled_score_test

    fed = LocalFederation(sites)
    return fed, run_pooled_score_test(fed, 0.05, max_steps=3, min_sites=min_sites)


def _anova_run(sites: list[Site], min_sites: int | None = None):
    from fedtab.federation import run_pooled_anova

    fed = LocalFederation(sites)
    return fed, run_pooled_anova(fed, 0.05, min_sites=min_sites)


def _impute_run(step: str | None, attack: str | None, min_sites: int | None = None, honest_only: bool = False):
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    tables, _ = _impute_data()
    sites = [HostileSite(n, t, step=step, attack=attack, test_size=0.2) if n == HOSTILE and step is not None
             else Site(n, t, test_size=0.2) for n, t in tables.items() if not (honest_only and n == HOSTILE)]
    fed = LocalFederation(sites)
    cfg = ImputeConfig(**{k: v for k, v in _IMPUTE.items()})
    return fed, run_imputation(fed, cfg, min_sites=min_sites)


def _same_training(a, b) -> None:
    for k in a.params:
        _close(a.params[k], b.params[k])
    _close(a.mean, b.mean)
    _close(a.std, b.std)
    assert a.pooled == b.pooled


def _same_score_test(a, b) -> None:
    assert a.selected == b.selected
    _close(a.z, b.z)
    _close(a.coef, b.coef)
    _close(a.mean, b.mean)


def _same_anova(a, b) -> None:
    assert a.feature_names == b.feature_names and a.classes == b.classes and a.n_rows == b.n_rows
    _close(a.f, b.f)
    assert a.mask.tolist() == b.mask.tolist()


def _same_imputation(a, b) -> None:
    assert a.columns == b.columns
    _close(a.mean, b.mean)
    _close(a.std, b.std)
    for k in a.weights:
        np.testing.assert_allclose(a.weights[k], b.weights[k], rtol=1e-5, atol=1e-7)


#: (workflow, attacked step) -> the run, and how the result is compared with the run without the forger
OVERFLOW_CASES = {
    ("training", "describe"): (_training_run, _same_training),
    ("score_test", "describe"): (_score_run, _same_score_test),
    ("score_test", "score_sums"): (_score_run, _same_score_test),
    ("anova", "class_moments"): (_anova_run, _same_anova),
}


@pytest.mark.parametrize(("workflow", "step"), [*OVERFLOW_CASES, ("imputation", "impute_stats")],
                         ids=lambda v: str(v))
def test_overflowing_sums_are_rejected_by_name(workflow: str, step: str) -> None:
    with pytest.raises(FederationError) as info:
        if workflow == "imputation":
            pytest.importorskip("torch")
            _impute_run(step, "overflow")
        else:
            OVERFLOW_CASES[workflow, step][0](_training_sites(step, "overflow"))
    _rejected(info.value)


@pytest.mark.parametrize(("workflow", "step"), list(OVERFLOW_CASES), ids=lambda v: str(v))
def test_overflowing_sums_drop_the_forger_under_a_quorum(workflow: str, step: str) -> None:
    run, same = OVERFLOW_CASES[workflow, step]
    fed, out = run(_training_sites(step, "overflow"), QUORUM)
    _only_mallory_dropped(fed)
    if step == "score_sums":  # its description came first and is in both runs: compare with a reply rejected outright
        _, ref = run(_training_sites(step, "nan"), QUORUM)
    else:
        _, ref = run(_honest_sites())
    same(out, ref)


def test_overflowing_imputation_sums_drop_the_forger_under_a_quorum() -> None:
    pytest.importorskip("torch")
    fed, out = _impute_run("impute_stats", "overflow", QUORUM)
    _only_mallory_dropped(fed)
    _, ref = _impute_run(None, None, honest_only=True)
    _same_imputation(out, ref)


def test_overflowing_sums_leave_the_score_test_to_the_honest_sites() -> None:
    """The issue's case: forged 1e250 moments once made every *honest* score reply look bad."""
    fed, out = _score_run(_training_sites("describe", "overflow"), QUORUM)
    assert out.participation[-1]["sites"] == HONEST and len(out.selected) > 0


@pytest.mark.parametrize("attack", MALFORMED_CLASS_MOMENTS)
def test_malformed_class_moments_are_rejected_by_name(attack: str) -> None:
    with pytest.raises(FederationError) as info:
        _anova_run(_training_sites("class_moments", attack))
    _rejected(info.value)
    assert "invalid class moments" in str(info.value)
    fed, out = _anova_run(_training_sites("class_moments", attack), QUORUM)
    _only_mallory_dropped(fed)
    _same_anova(out, _anova_run(_honest_sites())[1])


# ----------------------------------------------------------------------------- careless users' files
# (issue 20 item 7): every model-file and job-file failure is one line and exit code 2, never a traceback.
#: checked when the imputer is first needed (building its network imports torch, which a complete table never needs)
LAZY_MODEL_FILE_ATTACKS = ("unknown_imputer_setting", "imputer_weights_renamed", "imputer_weight_reshaped")


def _one_line_exit_2(res) -> str:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output[-2000:]
    assert "Traceback" not in res.output and len(lines) == 1, res.output[-2000:]
    return lines[0]


def _model_section(feats: list[str]) -> dict:
    """A tiny mlp model with an imputer over ``feats``, as the job workflow hands it to write_model."""
    from fedtab.impute.model import GNNConfig, GNNImputer, state_to_numpy
    from fedtab.learn.mlp import MLPModel

    f = len(feats)
    cfg = GNNConfig(f, hidden_dim=4, n_layers=1)
    weights = state_to_numpy(GNNImputer(cfg))
    imputer = {"mean": np.zeros(f), "std": np.ones(f), "edge_index": np.array([[0, 1], [1, 0]]),
               "weight": np.array([0.5, 0.5]), "sign": np.ones(2), "low": np.full(f, -10.0), "high": np.full(f, 10.0),
               "integer": np.zeros(f, bool), "weights": weights, "weight_dtypes": {k: v.dtype.str for k, v in weights.items()},
               "columns": feats, "model_config": cfg.to_dict()}
    mlp = MLPModel(hidden=[4])
    return {"mean": np.zeros(f), "std": np.ones(f), "params": mlp.init(f, 2), "model": {"name": "mlp", "params":
            mlp.get_params()}, "schema": {"columns": feats}, "encoded_columns": feats, "features": feats,
            "classes": ["0", "1"], "imputer": imputer}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    pytest.importorskip("torch")
    from fedtab.job.model_file import write_model
    from fedtab.testing import hostile_model_files

    d = tmp_path_factory.mktemp("model_files")
    feats = ["a", "b", "c"]
    good = write_model(d / "good.fedtab", _model_section(feats), {"job": {"na_values": ["?"]}})
    table = d / "rows.csv"
    pd.DataFrame({"a": [1.0, 2.0], "b": [0.5, np.nan]}).to_csv(table, index=False)  # c absent: imputed
    return good, hostile_model_files(good, d / "bad"), table


def test_the_valid_model_file_predicts(model_files):
    from typer.testing import CliRunner

    from fedtab.cli import app

    good, files, table = model_files
    assert set(files) == set(MODEL_FILE_ATTACKS)
    res = CliRunner().invoke(app, ["predict", str(good), str(table), "--allow-missing"])
    assert res.exit_code == 0 and "probability_1" in res.output, res.output


@pytest.mark.parametrize("attack", MODEL_FILE_ATTACKS)
def test_a_broken_model_file_is_one_line_and_exit_2(attack, model_files):
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.job.model_file import ModelFileError, load_model

    _, files, table = model_files
    with pytest.raises(ModelFileError) as info:
        if attack in LAZY_MODEL_FILE_ATTACKS:  # the imputer's weights are checked when it is first needed
            load_model(files[attack]).predict_proba(pd.read_csv(table), allow_missing=True)
        load_model(files[attack])
    assert "\n" not in str(info.value) and str(files[attack]) in str(info.value)
    line = _one_line_exit_2(CliRunner().invoke(app, ["predict", str(files[attack]), str(table), "--allow-missing"]))
    assert line.startswith("error:") and files[attack].name in line


@pytest.mark.parametrize("attack", JOB_FILE_ATTACKS)
def test_a_broken_job_file_is_one_line_and_exit_2(attack, tmp_path):
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.job import JobError, load_job
    from fedtab.testing import hostile_job_files

    files = hostile_job_files(tmp_path / "job")
    pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]}).to_csv(tmp_path / "job" / "a.csv", index=False)
    with pytest.raises(JobError):
        load_job(files[attack])
    line = _one_line_exit_2(CliRunner().invoke(app, ["run", str(files[attack])]))
    assert line.startswith("error:") and files[attack].name in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]  # nothing written next to (or through) the folder
    assert not (tmp_path / "job-outside").exists()


def test_an_output_outside_the_job_folder_is_the_callers_choice(tmp_path):
    from fedtab.job import load_job
    from fedtab.testing import hostile_job_files

    files = hostile_job_files(tmp_path / "job")
    assert load_job(files["out_parent"], out_given=True).target == "y"  # --out given: the file's out is unused
    inside = tmp_path / "job" / "inside.toml"
    inside.write_text(files["out_parent"].read_text().replace("../escaped", "runs/../run-out"))
    assert load_job(inside).run.out.resolve() == (tmp_path / "job" / "run-out").resolve()
