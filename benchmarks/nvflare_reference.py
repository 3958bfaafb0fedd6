"""FLARE's own feature-election job, fed from files, for the side-by-side benchmark.

:class:`FileDataExecutor` is NVFlare's ``FeatureElectionExecutor`` that loads its
client's train/validation CSVs (``<data_dir>/<client name>_train.csv`` / ``_val.csv``)
on the first task, as the example's executor generates them in memory.
:class:`RecordingController` is the unmodified ``FeatureElectionController`` that also
writes the final global weights next to FLARE's ``feature_election_results.json``, so
the benchmark can score the model FLARE's job trains but never evaluates.

Only this benchmark imports this module (it is shipped into the FLARE job as custom code).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
from nvflare.app_opt.feature_election.controller import FeatureElectionController
from nvflare.app_opt.feature_election.executor import FeatureElectionExecutor


class FileDataExecutor(FeatureElectionExecutor):
    """``FeatureElectionExecutor`` whose data are ``<data_dir>/<site>_{train,val}.csv``."""

    def __init__(self, data_dir: str, fs_method: str = "lasso", eval_metric: str = "f1",
                 task_name: str = "feature_election", target: str = "target"):
        super().__init__(fs_method=fs_method, eval_metric=eval_metric, task_name=task_name)
        self.data_dir = data_dir
        self.target = target
        self._loaded = False

    def execute(self, task_name, shareable, fl_ctx, abort_signal):  # noqa: ANN001, ANN201
        if not self._loaded:
            site = fl_ctx.get_identity_name()
            train = pd.read_csv(os.path.join(self.data_dir, f"{site}_train.csv"))
            val = pd.read_csv(os.path.join(self.data_dir, f"{site}_val.csv"))
            names = [c for c in train.columns if c != self.target]
            self.set_data(train[names].to_numpy(), train[self.target].to_numpy(), val[names].to_numpy(),
                          val[self.target].to_numpy(), feature_names=names)
            self._loaded = True
        return super().execute(task_name, shareable, fl_ctx, abort_signal)


class RecordingController(FeatureElectionController):
    """``FeatureElectionController`` that also saves its final global weights."""

    def stop_controller(self, fl_ctx):  # noqa: ANN001, ANN201
        super().stop_controller(fl_ctx)
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        weights = {k: np.asarray(v).tolist() for k, v in (self.global_weights or {}).items()}
        with open(os.path.join(run_dir, "global_weights.json"), "w") as f:
            json.dump(weights, f)
