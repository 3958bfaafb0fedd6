"""Settings objects with keyword overrides (:mod:`fedtab._settings`): the public functions that group
their options in a frozen dataclass keep their documented keyword arguments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedtab._settings import settings_with
from fedtab.federation.site.core import RowSplit, Site
from fedtab.federation.workflows.training.server import TrainingSettings, run_training


def test_keywords_override_the_settings_fields_and_leave_the_rest():
    base = TrainingSettings(model="gnb", rounds=3)
    out = settings_with(TrainingSettings, base, {"rounds": 7}, "run_training")
    assert (out.model, out.rounds, out.local_epochs) == ("gnb", 7, 5)
    assert base.rounds == 3  # frozen: the caller's settings are not changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.rounds = 1  # type: ignore[misc]


def test_an_unknown_keyword_is_refused_as_python_refuses_it():
    with pytest.raises(TypeError, match=r"^run_training\(\) got an unexpected keyword argument 'round'$"):
        settings_with(TrainingSettings, None, {"round": 3}, "run_training")
    with pytest.raises(TypeError, match="settings must be a TrainingSettings"):
        settings_with(TrainingSettings, RowSplit(), {}, "run_training")


def test_site_split_keywords_and_row_split_draw_the_same_parts():
    rng = np.random.default_rng(0)
    import pandas as pd

    table = pd.DataFrame({"a": rng.normal(size=400), "target": np.tile([0, 1], 200)})
    by_keywords = Site("s", table, "target", test_size=0.3, seed=4, folds=2)
    by_split = Site("s", table, "target", split=RowSplit(test_size=0.3, seed=4, folds=2))
    assert (by_split.test_size, by_split.seed, by_split.folds) == (0.3, 4, 2)
    assert by_keywords.n_rows("test") == by_split.n_rows("test") > 0
    assert by_keywords.n_rows("train") == by_split.n_rows("train")
    with pytest.raises(TypeError, match="unexpected keyword argument 'test_sise'"):
        Site("s", table, "target", test_sise=0.3)
    with pytest.raises(ValueError, match="test_size must be in"):
        Site("s", table, "target", split=RowSplit(test_size=1.0))


def test_run_training_by_keywords_equals_run_training_by_settings():
    from fedtab import LocalFederation
    from tests.builders import classification_parts

    parts = classification_parts(200, 4, 2, 2, [0.5, 0.5], seed=3)[1]

    def fed():
        return LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(parts)])

    a = run_training(fed(), model="gnb", seed=1)
    b = run_training(fed(), settings=TrainingSettings(model="gnb", seed=7), seed=1)
    assert a.model == b.model == "gnb" and a.seed == b.seed == 1
    for k in a.params:
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=1e-12)
    assert a.pooled == pytest.approx(b.pooled)
