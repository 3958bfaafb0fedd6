"""A model file whose model yields non-finite predictions (a coefficient of 1e308) is refused on
write and on load, in one line (issue 28 item 7, via issue 30)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pandas as pd
import pytest

from fedtab.job.model_file import ModelFileError, load_model, probe_rows, write_model
from fedtab.learn.models import make_model

FEATS = ["a", "b", "c", "d"]


def _section(coef=None, classes=("0", "1")):
    fm = make_model("logistic")
    params = {k: np.asarray(v, np.float64) for k, v in fm.init(len(FEATS), len(classes)).items()}
    params["coef"] = np.full(params["coef"].shape, 0.5) if coef is None else coef(params["coef"].shape)
    return {"mean": np.zeros(len(FEATS)), "std": np.ones(len(FEATS)), "params": params,
            "model": {"name": "logistic", "params": fm.get_params()}, "schema": {"columns": FEATS},
            "encoded_columns": FEATS, "features": FEATS, "classes": list(classes), "imputer": None}


def _alternating(shape):
    return np.where(np.indices(shape).sum(axis=0) % 2 == 0, 1e308, -1e308)


def test_a_sound_model_is_written_loaded_and_predicts(tmp_path):
    path = write_model(tmp_path / "ok.fedtab", _section(), {"fedtab": "test"})
    proba = load_model(path).predict_proba(pd.DataFrame({c: [1.0, -2.0] for c in FEATS}))
    assert np.isfinite(proba).all() and np.allclose(proba.sum(axis=1), 1.0)


@pytest.mark.parametrize("classes", [("0", "1"), ("a", "b", "c")])
def test_non_finite_predictions_are_refused_on_write(tmp_path, classes):
    path = tmp_path / "bad.fedtab"
    with pytest.raises(ModelFileError) as exc:
        write_model(path, _section(_alternating, classes), {"fedtab": "test"})
    text = str(exc.value)
    assert "\n" not in text and f"{path}: not written: the pooled model yields non-finite probabilities" in text
    assert "1e+308" in text and not path.exists()


def test_non_finite_predictions_are_refused_on_load(tmp_path):
    good = write_model(tmp_path / "ok.fedtab", _section(), {"fedtab": "test"})
    bad = tmp_path / "bad.fedtab"
    with zipfile.ZipFile(good) as zi, zipfile.ZipFile(bad, "w") as zo:  # a file written elsewhere, then altered
        for info in zi.infolist():
            data = zi.read(info)
            if info.filename == "arrays/model/coef.npy":
                buf = io.BytesIO()
                np.save(buf, _alternating(np.load(io.BytesIO(data)).shape))
                data = buf.getvalue()
            zo.writestr(info.filename, data)
    with pytest.raises(ModelFileError, match=r"bad.fedtab: the pooled model yields non-finite probabilities "
                                             r"\(largest parameter \|coef\| = 1e\+308\)$"):
        load_model(bad)


def test_probe_rows_reach_mixed_signs():
    rows = probe_rows(5)
    assert rows.shape == (1 + 2 * 2 * (5 + 2), 5) and not rows[0].any()
    assert any((r > 0).any() and (r < 0).any() for r in rows)  # where inf - inf shows up
    assert probe_rows(1000).shape[0] == 1 + 2 * 2 * (64 + 2)  # bounded for wide models
