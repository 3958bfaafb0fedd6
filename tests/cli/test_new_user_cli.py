"""Issue 24 as a new user meets it: predict that checks its table, runs as records, a CLI that behaves.

One tiny job (three 40-row sites: two numeric columns and a text column ``color`` whose
``purple`` occurs once, so the job merges it into ``(other)``; FedAvg logistic regression, two
rounds) is run once in this process; the tests score tables against its model file, rerun it into
its output folder, interrupt a run in a subprocess and read its MLflow run back.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from fedtab.cli import LONG_COMMANDS, app, command_output
from fedtab.job.model_file import PredictionError, PredictionWarning, load_model
from fedtab.job.run import OutputsExist, run_job

SRC = Path(__file__).resolve().parents[2] / "src"
runner = CliRunner()
SITES = ("north", "south", "east")
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def _site_table(rng: np.random.Generator, n: int, rare: bool) -> pd.DataFrame:
    color = rng.choice(np.array(["red", "green", "blue"], dtype=object), size=n)
    if rare:
        color[0] = "purple"  # one row: below the site's floor of 4, merged into "(other)" by the job
    age, dose = rng.normal(50, 10, n), rng.normal(size=n)
    y = ((age - 50) / 10 + (color == "red") + rng.normal(scale=0.5, size=n) > 0.5).astype(int)
    return pd.DataFrame({"age": age, "dose": dose, "color": color, "y": y})


def _job(d: Path, out: Path, **run) -> dict:
    return {"target": "y", "sites": {n: {"path": str(d / f"{n}.csv"), "min_rows": 4} for n in SITES},
            "training": {"rounds": run.pop("rounds", 2), "local_epochs": 1}, "run": {"out": str(out), **run}}


def _toml(doc: dict, table: str = "") -> str:
    """The job as a TOML file (strings, numbers and tables are all it holds)."""
    flat = [f"{k} = {json.dumps(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    text = (f"[{table}]\n" if table and flat else "") + "".join(line + "\n" for line in flat)
    for k, v in doc.items():
        if isinstance(v, dict):
            text += _toml(v, f"{table}.{k}" if table else k)
    return text


def _job_file(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(_toml(doc))
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("new_user_sites")
    rng = np.random.default_rng(24)
    for i, name in enumerate(SITES):
        _site_table(rng, 40, rare=i == 0).to_csv(d / f"{name}.csv", index=False)
    return d


@pytest.fixture(scope="module")
def run(sites, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("new_user_run")
    return run_job(_job(sites, out), out=out), out


@pytest.fixture()
def table(sites) -> pd.DataFrame:
    return pd.read_csv(sites / "south.csv").drop(columns=["y"]).head(12)


def _predict(model: Path, table: pd.DataFrame, tmp_path: Path, *args: str):
    path = tmp_path / "new.csv"
    table.to_csv(path, index=False)
    return runner.invoke(app, ["predict", str(model), str(path), "--out", str(tmp_path / "p.csv"), *args])


# ----------------------------------------------------------------------------- predict checks its input
def test_missing_and_renamed_columns_are_an_error_listing_them_with_did_you_mean(run, table, tmp_path):
    model = run[1] / "model.fedtab"
    renamed = table.rename(columns={"age": "Age"}).drop(columns=["dose"])
    res = _predict(model, renamed, tmp_path)
    assert res.exit_code == 2 and not (tmp_path / "p.csv").exists()
    assert "lacks 2 column(s) the model reads: 'age', 'dose'" in res.stderr
    assert "'Age' (did you mean 'age'?)" in res.stderr and "--allow-missing" in res.stderr


def test_allow_missing_fills_and_warns_how_many_cells_per_column(run, table, tmp_path):
    model = run[1] / "model.fedtab"
    gaps = table.rename(columns={"age": "Age"}).astype({"dose": float})
    gaps.loc[[1, 4, 7], "dose"] = np.nan
    res = _predict(model, gaps, tmp_path, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert "filled 15 missing cell(s) of 12 row(s) with the federation's mean: age 12 (absent), dose 3" in res.stderr
    assert "'Age' (did you mean 'age'?)" in res.stderr
    preds = pd.read_csv(tmp_path / "p.csv")
    assert len(preds) == 12 and preds[["probability_0", "probability_1"]].notna().all().all()
    # the API: the same findings as warnings; without allow_missing the same error
    m = load_model(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PredictionWarning)
        m.predict_proba(gaps, allow_missing=True)
    said = [str(w.message) for w in caught if issubclass(w.category, PredictionWarning)]
    assert len(said) == 2 and any("age 12 (absent), dose 3" in w for w in said)
    with pytest.raises(PredictionError, match="lacks 1 column"):
        m.predict_proba(gaps)


def test_rare_and_new_categories_score_as_the_models_other_level(run, table, tmp_path):
    model = run[1] / "model.fedtab"
    m = load_model(model)
    assert "(other)" in m.schema["categories"]["color"] and "purple" not in m.schema["categories"]["color"]
    odd = table.copy()
    odd.loc[0, "color"], odd.loc[3, "color"], odd.loc[5, "color"] = "purple", "Never-worked", "Never-worked"
    res = _predict(model, odd, tmp_path)
    assert res.exit_code == 0, res.output
    assert ("column 'color': 3 row(s) with a category rare in training or new ('Never-worked', 'purple') encoded "
            "as its '(other)' level") in res.stderr
    preds = pd.read_csv(tmp_path / "p.csv")
    assert "encoded as no category" not in res.stderr  # no categorical cell was missing
    as_other = odd.replace({"color": {"purple": "(other)", "Never-worked": "(other)"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PredictionWarning)
        expected = m.predict_proba(as_other)
    np.testing.assert_allclose(preds[["probability_0", "probability_1"]].to_numpy(), expected, atol=1e-12)
    assert not np.allclose(expected[[0, 3, 5]], m.predict_proba(table)[[0, 3, 5]])  # the level is used, not zeros


def test_a_missing_categorical_cell_is_encoded_as_no_category_as_in_training(run, table):
    m = load_model(run[1] / "model.fedtab")
    gaps = table.copy()
    gaps.loc[[2, 9], "color"] = np.nan
    found = m.check(gaps)
    assert found.uncoded == {"color": 2} and found.filled == {} and found.missing == []
    assert "2 missing cell(s) of categorical column(s) encoded as no category, as in training: color 2" in \
        found.warnings()


def test_predict_of_a_model_without_a_neural_part_imports_no_torch(run, table, tmp_path):
    path = tmp_path / "t.csv"
    table.to_csv(path, index=False)
    probe = ("import atexit, sys; atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, "
             "file=sys.stderr)); from fedtab.cli import app; app()")
    res = subprocess.run([sys.executable, "-c", probe, "predict", str(run[1] / "model.fedtab"), str(path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert res.returncode == 0, res.stderr
    assert "torch loaded: False" in res.stderr
    assert len(pd.read_csv(io.StringIO(res.stdout))) == len(table)


def test_to_sklearn_reads_the_table_itself_and_scores_like_the_model(run, table):
    m = load_model(run[1] / "model.fedtab")
    gaps = table.astype({"dose": float})
    gaps.loc[2, "dose"], gaps.loc[6, "color"] = np.nan, "Never-worked"
    pipe = m.to_sklearn()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PredictionWarning)
        np.testing.assert_allclose(pipe.predict_proba(gaps), m.predict_proba(gaps), atol=1e-10)
        assert list(pipe.predict(gaps)) == list(m.predict(gaps))


# ----------------------------------------------------------------------------- runs as records
def test_every_run_has_an_id_in_result_model_and_stdout(run):
    result, out = run
    assert RUN_ID.fullmatch(result["run_id"])
    assert json.loads((out / "result.json").read_text())["run_id"] == result["run_id"]
    assert load_model(out / "model.fedtab").provenance["run_id"] == result["run_id"]


def test_an_existing_output_folder_is_kept_without_force(run, sites, tmp_path):
    result, out = run
    before = {f: (out / f).read_bytes() for f in ("model.fedtab", "result.json", "report.html")}
    with pytest.raises(OutputsExist, match="already holds a run's outputs"):
        run_job(_job(sites, out), out=out, overwrite=False)
    job = _job_file(tmp_path, _job(sites, out))
    res = runner.invoke(app, ["run", str(job), "--out", str(out), "--quiet"])
    assert res.exit_code == 2 and "--force" in res.stderr and "overwrite=True" not in res.stderr
    assert {f: (out / f).read_bytes() for f in before} == before
    # --force replaces them; --quiet leaves stdout the outcome line alone, no colour codes
    res = runner.invoke(app, ["run", str(job), "--out", str(out), "--force", "--quiet"])
    assert res.exit_code == 0, res.output
    new_id = json.loads((out / "result.json").read_text())["run_id"]
    assert new_id != result["run_id"]
    assert res.stdout.splitlines() == [res.stdout.strip()] and res.stdout.startswith(f"run {new_id}: wrote ")
    assert "\x1b[" not in res.output
    assert not [p for p in out.iterdir() if p.name.startswith(".fedtab-partial")]


def test_log_file_gets_the_engine_logs_and_the_progress_not_the_terminal(run, sites, tmp_path, capsys):
    log = tmp_path / "logs" / "run.log"
    with command_output(quiet=True, log_file=log):
        logging.getLogger("flwr").info("\x1b[32mINFO\x1b[0m: a flower line")
        logging.getLogger("nvflare.app").warning("a flare line")
    logging.getLogger("flwr").warning("after: not in the file")
    text = log.read_text()
    assert "flwr: \x1b[32mINFO" in text and "nvflare.app: a flare line" in text and "after" not in text
    assert "a flower line" not in capsys.readouterr().err
    job = _job_file(tmp_path, _job(sites, tmp_path / "out"))
    res = runner.invoke(app, ["run", str(job), "--out", str(tmp_path / "out"), "--log-file", str(log)])
    assert res.exit_code == 0, res.output
    run_id = json.loads((tmp_path / "out" / "result.json").read_text())["run_id"]
    assert f"run {run_id}: 3 sites on the local engine" in log.read_text() and "training" in log.read_text()
    assert f"run {run_id}" in res.stdout and "\x1b[" not in res.output  # not a terminal: no colour codes


def test_an_engine_that_catches_the_ctrl_c_itself_still_ends_interrupted(capsys):
    """FLARE's simulator catches the KeyboardInterrupt and returns -9; the run then fails with that."""
    from fedtab.cli import fail

    with pytest.raises(typer.Exit) as stopped:
        with command_output():
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass  # swallowed by the engine
            fail("FLARE simulator returned -9")
    assert stopped.value.exit_code == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "-9" not in err
    with pytest.raises(typer.Exit) as failed:  # the next command starts afresh
        with command_output():
            fail("a real error")
    assert failed.value.exit_code == 2 and "a real error" in capsys.readouterr().err


@pytest.mark.slow  # imports Flower and runs its ServerApp and ClientApps in this process
def test_flowers_own_log_lines_go_to_the_log_file_without_colour_codes(sites, tmp_path):
    pytest.importorskip("flwr")
    job, log = _job_file(tmp_path, _job(sites, tmp_path / "out")), tmp_path / "flower.log"
    res = runner.invoke(app, ["run", str(job), "--engine", "flower", "--out", str(tmp_path / "out"),
                              "--log-file", str(log)])
    assert res.exit_code == 0, res.output
    text = log.read_text()
    assert " INFO flwr: " in text and "\x1b[" not in text  # Flower set its logger up inside the run
    assert "flwr" not in res.stderr and "INFO" not in res.output


@pytest.mark.slow  # a fresh interpreter that imports fedtab and reads three tables before it can be interrupted
def test_sigint_to_a_running_job_exits_130_blames_no_site_and_keeps_earlier_outputs(run, sites, tmp_path):
    _, earlier = run
    before = {f: (earlier / f).read_bytes() for f in ("model.fedtab", "result.json", "report.html")}
    job = _job_file(tmp_path, _job(sites, earlier, rounds=100_000))  # far longer than the test waits
    cmd = [sys.executable, "-c", "from fedtab.cli import app; app()", "run", str(job), "--out", str(earlier),
           "--force"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    try:
        for line in proc.stdout:  # progress lines: interrupt once training has started
            if line.rstrip().endswith("training"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "site" not in err and "Traceback" not in err
    assert {f: (earlier / f).read_bytes() for f in before} == before
    assert not [p for p in earlier.iterdir() if p.name.startswith(".fedtab-partial")]


# ----------------------------------------------------------------------------- MLflow
def test_mlflow_tracking_is_read_back_with_mlflows_client(sites, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    result = run_job(_job(sites, tmp_path / "out", mlflow=uri), out=tmp_path / "out")
    client = MlflowClient(tracking_uri=uri)
    got = client.get_run(result["mlflow"]["run_id"])
    assert got.info.status == "FINISHED" and got.data.tags["fedtab.run_id"] == result["run_id"]
    assert got.data.params["training.rounds"] == "2" and got.data.params["sites"] == "north, south, east"
    pooled = result["training"]["metrics"]["pooled"]
    assert got.data.metrics["pooled.accuracy"] == pytest.approx(pooled["accuracy"], abs=1e-12)
    assert "step.training.seconds" in got.data.metrics and "site.north.accuracy" in got.data.metrics
    figures = {p.name for p in (tmp_path / "out").glob("report-*.png")}
    assert figures and all(open(tmp_path / "out" / f, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert {a.path for a in client.list_artifacts(got.info.run_id)} == {"model.fedtab", "result.json", "report.html",
                                                                         *figures}
    png = sorted(figures)[0]  # read back from MLflow's store: the same bytes as beside the report
    local = client.download_artifacts(got.info.run_id, png, str(tmp_path / "back"))
    assert Path(local).read_bytes() == (tmp_path / "out" / png).read_bytes()
    assert json.loads((tmp_path / "out" / "result.json").read_text())["mlflow"] == result["mlflow"]


class _FakeMlflowClient:
    """MLflow's client as far as fedtab uses it, recording the calls (the real one: the test above)."""

    calls: list[tuple] = []

    def __init__(self, tracking_uri=None):
        self.uri = tracking_uri

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name):
        self.calls.append(("experiment", name))
        return "7"

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        self.calls.append(("run", experiment_id, run_name, dict(tags)))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="mlrun1"))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.calls += [("param", p.key, p.value) for p in params] + [("metric", m.key, m.value, m.step) for m in metrics]

    def log_artifact(self, run_id, local_path, artifact_path=None):
        self.calls.append(("artifact", Path(local_path).name, Path(local_path).is_file()))

    def set_terminated(self, run_id, status=None, end_time=None):
        self.calls.append(("end", run_id, status))


@pytest.fixture()
def fake_mlflow(monkeypatch):
    entities = types.ModuleType("mlflow.entities")
    entities.Param = lambda key, value: types.SimpleNamespace(key=key, value=value)
    entities.Metric = lambda key, value, timestamp, step: types.SimpleNamespace(key=key, value=value, step=step)
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = _FakeMlflowClient
    for name, mod in (("mlflow", types.ModuleType("mlflow")), ("mlflow.tracking", tracking),
                      ("mlflow.entities", entities)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(_FakeMlflowClient, "calls", [])
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # restored (unset) after the test
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    return _FakeMlflowClient.calls


def test_a_tracked_run_is_one_mlflow_run_with_settings_numbers_and_files(sites, tmp_path, fake_mlflow):
    result = run_job(_job(sites, tmp_path / "out", mlflow="file:./mlruns"), out=tmp_path / "out")
    assert result["mlflow"] == {"tracking_uri": "file:./mlruns", "experiment_id": "7", "run_id": "mlrun1"}
    assert json.loads((tmp_path / "out" / "result.json").read_text())["mlflow"] == result["mlflow"]
    assert fake_mlflow[1] == ("run", "7", result["run_id"], {"fedtab.run_id": result["run_id"]})
    params = {c[1]: c[2] for c in fake_mlflow if c[0] == "param"}
    assert params["training.rounds"] == "2" and params["engine"] == "local"
    metrics = {c[1]: c[2] for c in fake_mlflow if c[0] == "metric"}
    assert metrics["pooled.accuracy"] == result["training"]["metrics"]["pooled"]["accuracy"]
    figures = sorted(p.name for p in (tmp_path / "out").glob("report-*.png"))
    assert figures and [c for c in fake_mlflow if c[0] == "artifact"] == [
        ("artifact", f, True) for f in ("model.fedtab", "result.json", "report.html", *figures)]
    assert fake_mlflow[-1] == ("end", "mlrun1", "FINISHED")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # the job named MLflow's file store: opted in


@pytest.mark.parametrize("raised, status", [(KeyboardInterrupt, "KILLED"), (RuntimeError, "FAILED")])
def test_a_tracked_run_that_stops_ends_its_mlflow_run_so(sites, tmp_path, fake_mlflow, monkeypatch, raised, status):
    import fedtab.job.run as job_run

    def stop(*args, **kwargs):
        raise raised("stopped")

    monkeypatch.setattr(job_run, "_run_engine", stop)
    with pytest.raises(raised):
        run_job(_job(sites, tmp_path / "out", mlflow="file:./mlruns"), out=tmp_path / "out")
    assert fake_mlflow[-1] == ("end", "mlrun1", status) and not (tmp_path / "out" / "result.json").exists()


def test_mlflow_tracking_without_mlflow_fails_before_the_run(sites, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(Exception, match=r"pip install 'fedtab\[mlflow\]'"):
        run_job(_job(sites, tmp_path / "out", mlflow="file:./mlruns"), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_mlflow_params_and_metrics_hold_settings_and_numbers_never_site_paths(run):
    from fedtab.job.tracking import flat_params, run_metrics

    result, _ = run
    params = flat_params(result["job"])
    assert params["training.rounds"] == "2" and params["sites"] == "north, south, east"
    assert not any("north.csv" in v for v in params.values())
    keys = {k for k, _, _ in run_metrics(result)}
    assert {"pooled.accuracy", "site.south.accuracy", "step.training.seconds"} <= keys
    assert any(k.startswith("baseline.") for k in keys)


# ----------------------------------------------------------------------------- help and options
def test_help_keeps_every_option_name_whole_at_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    cli = typer.main.get_command(app)
    for name, cmd in cli.commands.items():
        res = runner.invoke(app, [name, "--help"])
        assert res.exit_code == 0, name
        opts = [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
        cut = [o for o in opts if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", res.output)]
        assert not cut, (name, cut)
        assert max(map(len, res.output.splitlines())) <= 80 and "…" not in res.output, name
        if name in LONG_COMMANDS:
            assert "--quiet" in opts and "--log-file" in opts, name
