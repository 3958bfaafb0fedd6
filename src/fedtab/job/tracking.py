"""Optional MLflow tracking of a job run (``[run] mlflow = "file:./mlruns"`` or a tracking URI).

mlflow is an optional extra (``pip install 'fedtab[mlflow]'``), imported only here and only when
a job asks for it. One :class:`MlflowRecord` per run, through ``MlflowClient`` (no global
active run, so a library caller's own MLflow runs are left alone):

* created before the engine starts, in the experiment named after the job file, with the run
  name and tag ``fedtab.run_id`` = fedtab's run id; a run that fails ends ``FAILED``, one
  interrupted by Ctrl-C ends ``KILLED``;
* :meth:`MlflowRecord.log` after the outputs are written: the job's settings as parameters
  (``training.rounds``, ``election.freedom_degree``, ...; the sites by name, never their file
  paths), the per-step seconds and bytes (``step.<step>.seconds``), the model's pooled and
  per-site test metrics (``pooled.auroc``, ``site.<name>.accuracy``), the baselines'
  (``baseline.<name>.pooled.<metric>``) and the training history per round (``history.<metric>``
  at step = round), then ``model.fedtab``, ``result.json``, ``report.html`` and the report's
  figures (``report-<figure>.png``) as artifacts.

Only what ``result.json`` already holds is logged: the same aggregate numbers, no rows.

A ``file:`` URI (or a plain path) is MLflow's file store, which MLflow 3.13 and later open only
with ``MLFLOW_ALLOW_FILE_STORE=true``: a job that names one sets it (unless already set) for
this process. A database store (``sqlite:///mlflow.db``) needs the full ``mlflow`` package.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from .spec import JobError

__all__ = ["MlflowRecord", "flat_params", "run_metrics"]

log = logging.getLogger(__name__)

#: MLflow's limits: a parameter value's length, and entries per log_batch call
_MAX_VALUE = 6000
_BATCH = 100


def _key(name: str) -> str:
    """A metric/parameter key MLflow accepts (letters, digits, ``_-. /``; anything else ``_``)."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", str(name))[:250]


def flat_params(job: Mapping[str, Any]) -> dict[str, str]:
    """``{"section.key": value}`` of a job's settings (the plan of ``result["job"]``); sites by name only."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is not None:
            out[_key(prefix)] = str(value)[:_MAX_VALUE]

    for section, value in job.items():
        if section == "sites":  # where the sites keep their files is not a parameter of the run
            names = [s.get("name") for s in value] if isinstance(value, list) else list(value or {})
            out["sites"] = ", ".join(map(str, names))[:_MAX_VALUE]
        elif section != "source":
            walk(section, value)
    return out


def _numbers(prefix: str, metrics: Mapping[str, Any] | None) -> Iterator[tuple[str, float]]:
    for k, v in (metrics or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            yield _key(f"{prefix}.{k}"), float(v)


def run_metrics(result: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` of a run's numbers: steps, test metrics, baselines, history per round."""
    out: list[tuple[str, float, int]] = []
    for s in result.get("steps") or []:
        out += [(k, v, 0) for k, v in _numbers(f"step.{s.get('step')}", {x: s.get(x) for x in
                                                                        ("seconds", "bytes_up", "bytes_down")})]
    training = result.get("training") or {}
    metrics = training.get("metrics") or {}
    out += [(k, v, 0) for k, v in _numbers("pooled", metrics.get("pooled"))]
    for site, m in (metrics.get("per_site") or {}).items():
        out += [(k, v, 0) for k, v in _numbers(f"site.{site}", m)]
    for name, b in (result.get("baselines") or {}).items():
        if isinstance(b, Mapping):
            out += [(k, v, 0) for k, v in _numbers(f"baseline.{name}.pooled", b.get("pooled"))]
    for h in training.get("history") or []:
        step = int(h.get("round", 0))
        out += [(k, v, step) for k, v in _numbers("history", {x: y for x, y in h.items() if x != "round"})]
    return out


def _artifact_files(result: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """The run's output files in ``out_dir``: ``result["artifacts"]``, then the report's figures
    written beside it (``report-<figure>.png``, :func:`fedtab.report.write_report`)."""
    named = [out_dir / name for name in (result.get("artifacts") or {}).values()]
    report = (result.get("artifacts") or {}).get("report")
    figures = sorted(out_dir.glob(f"{glob.escape(Path(report).stem)}-*.png")) if report else []
    return [f for f in [*named, *figures] if f.is_file()]


class MlflowRecord:
    """One fedtab run as an MLflow run (see the module docstring).

    Raises:
        JobError: mlflow is not installed, or the tracking URI cannot be used (at construction).
    """

    def __init__(self, tracking_uri: str, run_id: str, *, experiment: str = "fedtab") -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise JobError("[run] mlflow needs the mlflow package: pip install 'fedtab[mlflow]'") from None
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            # the job asked for MLflow's file store, which MLflow >= 3.13 keeps behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=run_id, tags={"fedtab.run_id": run_id})
        except Exception as exc:  # noqa: BLE001 - any store error is one clear line before the run starts
            raise JobError(f"[run] mlflow = {tracking_uri!r}: {type(exc).__name__}: {str(exc)[:200]}") from None
        self.info = {"tracking_uri": tracking_uri, "experiment_id": experiment_id, "run_id": run.info.run_id}

    def log(self, result: Mapping[str, Any], out_dir: str | Path) -> None:
        """Parameters, metrics and the run's output files as artifacts; the run ends ``FINISHED``."""
        from mlflow.entities import Metric, Param

        rid = self.info["run_id"]
        try:
            params = [Param(k, v) for k, v in flat_params(result.get("job") or {}).items()]
            params.append(Param("engine", str(result.get("engine"))))
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v, step in run_metrics(result)]
            for i in range(0, len(params), _BATCH):
                self.client.log_batch(rid, params=params[i:i + _BATCH])
            for i in range(0, len(metrics), _BATCH):
                self.client.log_batch(rid, metrics=metrics[i:i + _BATCH])
            for file in _artifact_files(result, Path(out_dir)):
                self.client.log_artifact(rid, str(file))
        except BaseException:
            self.end("FAILED")
            raise
        self.end("FINISHED")

    def end(self, status: str) -> None:
        """End the MLflow run with ``status`` (``FINISHED``, ``FAILED``, ``KILLED``). A failure to
        record a failed or killed run is logged, not raised: the run's own error is the one to see."""
        try:
            self.client.set_terminated(self.info["run_id"], status=status)
        except Exception:  # noqa: BLE001
            if status == "FINISHED":
                raise
            log.warning("MLflow run %s could not be marked %s", self.info["run_id"], status, exc_info=True)
