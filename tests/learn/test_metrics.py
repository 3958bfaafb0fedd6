import numpy as np
from sklearn.metrics import accuracy_score, f1_score

from fedtab.learn.metrics import confusion, scores_from_confusion
from fedtab.learn.models import LogisticRegressionModel, fedavg


def test_pooled_confusion_equals_sklearn_on_pooled_rows():
    rng = np.random.default_rng(0)
    parts = [(rng.integers(0, 3, 50), rng.integers(0, 3, 50)) for _ in range(3)]
    parts.append((np.array([2, 2]), np.array([2, 1])))
    total = sum(confusion(t, p, 3) for t, p in parts)
    yt = np.concatenate([t for t, _ in parts])
    yp = np.concatenate([p for _, p in parts])
    s = scores_from_confusion(total)
    assert np.isclose(s["weighted_f1"], f1_score(yt, yp, average="weighted"))
    assert np.isclose(s["macro_f1"], f1_score(yt, yp, average="macro"))
    assert np.isclose(s["accuracy"], accuracy_score(yt, yp))


def test_fedavg_is_sample_weighted():
    out = fedavg([({"w": np.array([0.0, 2.0])}, 1), ({"w": np.array([4.0, 2.0])}, 3)])
    np.testing.assert_allclose(out["w"], [3.0, 2.0])


def test_logistic_local_update_learns_binary_and_multiclass():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    for k in (2, 3):
        y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5][: k - 1])
        m = LogisticRegressionModel()
        p = m.local_update(m.init(4, k), X, y, epochs=50)
        assert (m.predict(p, X) == y).mean() > 0.9
        assert m.n_params(4, k) == (5 if k == 2 else 15)
