"""The schema step's pure parts: label vocabularies, column roles, row-identifier names, [columns] keys."""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.job import JobError, load_job
from fedtab.job.steps.schema import ID_NAME, column_roles, label_conflict


def test_label_conflict():
    assert label_conflict({"a": ["0", "1"], "b": ["1"], "c": ["0", "1"]}, "y") is None  # one-class site: fine
    text = label_conflict({"a": ["0", "1"], "b": ["no", "yes"]}, "y")
    assert "a ['0', '1']; b ['no', 'yes']" in text and "[labels] map = { no = ..., yes = ... }" in text
    assert label_conflict({"a": ["No", "Yes"], "b": ["no", "yes"]}, "y") is not None  # disjoint text vocabularies
    assert label_conflict({"a": ["x", "y"], "b": ["y", "z"]}, "y") is None  # overlap: a site may lack a class
    assert label_conflict({"a": ["0", "1"], "b": ["2", "3"]}, "y") is None  # label skew: disjoint numeric classes


@pytest.mark.parametrize("name, is_id", [("id", True), ("ID", True), ("patient_id", True), ("record id", True),
                                         ("uuid", True), ("id_code", True), ("Unnamed: 0", True), ("MRN", True),
                                         ("fluid", False), ("valid", False), ("idle", False), ("age", False),
                                         ("thalach", False)])
def test_id_names(name, is_id):
    assert bool(ID_NAME.match(name)) is is_id


def _profile(columns, unique):
    return {"columns": columns, "unique": np.asarray(unique, bool)}


def test_column_roles(tmp_path):
    spec = load_job({"target": "y", "sites": {"a": {"path": "a.csv"}, "b": {"path": "b.csv"}},
                     "columns": {"keep": ["sid"], "categorical": ["code"], "ignore": ["noise"]}})
    profiles = {"a": _profile(["sid", "code", "x", "noise", "serial"], [1, 1, 0, 0, 1]),
                "b": _profile(["x", "serial", "patientId"], [0, 0, 0])}
    ignored, categorical = column_roles(spec, profiles)
    assert ignored == {"noise": "[columns] ignore", "serial": "unique per row at site(s) a (a row identifier)",
                       "patientId": "named like a row identifier"}
    assert categorical == ["code"]
    spec.columns.ignore = ["nosie"]
    with pytest.raises(JobError, match=r"\[columns\] ignore names 'nosie', a column none of the sites a, b holds; "
                                       r"did you mean 'noise'\?"):
        column_roles(spec, profiles)


def test_columns_keys_are_checked():
    base = {"target": "y", "sites": {"a": {"path": "a.csv"}}}
    with pytest.raises(JobError, match=r"unknown key \[columns\] 'ignor' \(did you mean 'ignore'\?\)"):
        load_job({**base, "columns": {"ignor": ["x"]}})
    with pytest.raises(JobError, match=r"\[columns\] ignore and categorical/keep both name \['x'\]"):
        load_job({**base, "columns": {"ignore": ["x"], "keep": ["x"]}})
    with pytest.raises(JobError, match=r"\[columns\] categorical, ignore and keep need the column profile"):
        load_job({**base, "columns": {"ignore": ["x"]}, "privacy": {"secure_aggregation": True}})
    with pytest.raises(JobError, match=r"\[labels\] map must map labels to labels"):
        load_job({**base, "labels": {"map": {"yes": [1]}}})
    with pytest.raises(JobError, match=r"\[sites.a\] sep and decimal must differ"):
        load_job({**base, "sites": {"a": {"path": "a.csv", "sep": ",", "decimal": ","}}})
    spec = load_job({**base, "columns": {"categorical": ["c"]}, "labels": {"map": {"yes": 1}}})
    assert spec.plan()["columns"]["categorical"] == ["c"] and spec.plan()["labels"] == {"map": {"yes": 1}}


# ----------------------------------------------------------------------------- adversaries
import pandas as pd  # noqa: E402

from fedtab.engines.local import LocalFederation  # noqa: E402
from fedtab.federation.protocol.messages import Message  # noqa: E402
from fedtab.federation.steps.profile import profile_sites  # noqa: E402
from fedtab.federation.protocol import FederationError  # noqa: E402
from fedtab.federation.site.core import Site  # noqa: E402


def _table(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    thal = rng.choice([3.0, 6.0, 7.0], n)
    thal[:2] = 5.0  # a code held by 2 rows: below the floor, never released
    return pd.DataFrame({"pid": np.arange(n) + 100 * seed, "thal": thal, "x": rng.normal(size=n),
                         "y": rng.integers(0, 2, n)})


def test_a_curious_server_learns_flags_and_frequent_codes_only():
    site = Site("a", _table(), "y", policy={"min_rows": 5})
    reply = site.handle(Message("job_profile"))
    cols = reply.meta["columns"]
    assert reply.arrays["unique"].dtype == bool and reply.arrays["unique"].tolist() == [True, False, False]
    assert reply.meta["levels"] == {"thal": ["3.0", "6.0", "7.0"]}  # not 5.0 (2 rows), not pid (60 values)
    assert cols == ["pid", "thal", "x"]
    # the column_roles request changes only the table's columns and answers with its width
    ack = site.handle(Message("column_roles", meta={"drop": ["pid"], "categorical": ["thal"]}))
    assert ack.meta == {"n_columns": 3} and not ack.arrays and site.table["thal"].iloc[0] in ("3", "6", "7", "5")
    assert site.handle(Message("column_roles", meta={"drop": "pid", "categorical": []})).is_error


class _Liar(Site):
    """An honest site whose profile claims value sets it may not send."""

    def __init__(self, *args, levels, **kw):
        super().__init__(*args, **kw)
        self._levels = levels

    def handle(self, request):
        reply = super().handle(request)
        if request.kind == "job_profile" and not reply.is_error:
            reply = Message(reply.kind, reply.arrays, {**reply.meta, "levels": self._levels})
        return reply


@pytest.mark.parametrize("levels", [{"thal": ["3.0", "nan"]}, {"thal": [str(i) for i in range(50)]},
                                    {"other": ["1"]}, {"thal": "3,6,7"}])
def test_a_hostile_sites_value_sets_are_rejected_naming_it(levels):
    honest = Site("honest", _table(seed=1), "y", policy={"min_rows": 5})
    liar = _Liar("liar", _table(seed=2), "y", policy={"min_rows": 5}, levels=levels)
    with pytest.raises(FederationError) as exc:
        profile_sites(LocalFederation([honest, liar]))
    assert "liar" in str(exc.value) and "honest" not in str(exc.value)
