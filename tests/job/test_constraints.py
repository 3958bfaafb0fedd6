"""The job's sections validate themselves from their constraint tables (fedtab.job.constraints), the
run's options are checked once by RunOptions, and the model file's shape checks are a table too."""

from __future__ import annotations

import json
import math
import re
import zipfile
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import pytest

from fedtab.federation.protocol.options import RunOptions
from fedtab.job.constraints import Checked, Interval, Items, Names, Options, validate_section
from fedtab.job.spec import _SECTIONS, RULES, ElectionSpec, JobError, JobSpec, SiteSpec, TrustSpec, check_spec

# ----------------------------------------------------------------------------- the tables
def test_every_table_names_only_fields_of_its_section():
    for name, cls in [*_SECTIONS.items(), ("sites", SiteSpec)]:
        table = getattr(cls, "_constraints", {})
        assert set(table) <= {f.name for f in fields(cls)}, name
        assert "_constraints" not in {f.name for f in fields(cls)}  # a class table, not a job key
    assert set(ElectionSpec._constraints) >= {"method", "tune", "freedom_degree", "grid", "score_test_alpha"}
    assert RULES, "the interaction rules are a table"


@dataclass
class _Toy:
    share: float = 0.5
    count: int = 1
    kind: str = "a"
    grid: list | None = None
    names: list = None  # type: ignore[assignment]
    checked: str = "ok"

    _constraints: ClassVar[dict] = {
        "share": Interval(0, 1, "right"), "count": Interval(1, None, integer=True, text="a positive integer"),
        "kind": Options(("a", "b")), "grid": Items(Interval(0, 1), text="numbers in [0, 1]"), "names": Names(),
        "checked": Checked(lambda v: None if v == "ok" else (_ for _ in ()).throw(ValueError(f"checked is bad: {v}"))),
    }


@pytest.mark.parametrize("change, message", [
    ({"share": 0.0}, "[toy] share must be in (0, 1], got 0.0"),
    ({"share": 1.0 + 1e-12}, "[toy] share must be in (0, 1], got"),
    ({"share": math.nan}, "[toy] share must be in (0, 1], got nan"),
    ({"share": True}, "[toy] share must be in (0, 1], got True"),  # a bool is no number
    ({"count": 0}, "[toy] count must be a positive integer, got 0"),
    ({"count": 2.0}, "[toy] count must be a positive integer, got 2.0"),
    ({"kind": "c"}, "[toy] kind must be one of ['a', 'b'], got 'c'"),
    ({"grid": []}, "[toy] grid must be numbers in [0, 1], got []"),
    ({"grid": [0.5, 2]}, "[toy] grid must be numbers in [0, 1], got [0.5, 2]"),
    ({"names": ["x", ""]}, "[toy] names must be a list of column names"),
    ({"checked": "no"}, "[toy] checked is bad: no"),  # the check's own message, keyed
])
def test_one_validator_reads_a_table_and_names_the_key(change, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        validate_section(_Toy(**change), "toy")
    assert "\n" not in str(err.value)


def test_none_and_good_values_pass_the_table():
    validate_section(_Toy(share=1.0, count=3, kind="b", grid=[0.0, 1.0], names=[], checked="ok"), "toy")
    validate_section(_Toy(grid=None, names=None), "toy")


# ----------------------------------------------------------------------------- a spec built in code
@pytest.mark.parametrize("spec_kwargs, message", [
    ({"trust": TrustSpec(min_sites=True)}, "[trust] min_sites must be a positive integer, got True"),
    ({"trust": TrustSpec(timeout=math.nan)}, "[trust] timeout must be a positive number of seconds"),
    ({"trust": TrustSpec(timeout=math.inf)}, "[trust] timeout must be a positive number of seconds"),
    ({"election": ElectionSpec(freedom_degree=math.nan)}, "[election] freedom_degree must be in [0, 1], got nan"),
    ({"election": ElectionSpec(l2_grid=[math.inf])}, "[election] l2_grid must be non-negative finite L2 strengths"),
    ({"sites": [SiteSpec("a", None, min_rows=0)]}, "[sites.a] min_rows must be a positive integer, got 0"),
    ({"sites": [SiteSpec("a", None, sep=",", decimal=",")]}, "[sites.a] sep and decimal must differ"),
])
def test_a_spec_built_in_code_meets_the_same_tables(spec_kwargs, message):
    """The estimators and commands build a JobSpec without a TOML file: the same tables hold it."""
    kwargs = {"target": "y", "sites": [SiteSpec("a", None), SiteSpec("b", None)], "source": "code", **spec_kwargs}
    with pytest.raises(JobError, match=re.escape(f"code: {message}")):
        check_spec(JobSpec(**kwargs))


# ----------------------------------------------------------------------------- RunOptions is the one check
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("robust", [False, True])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0, 1.5, math.nan])
@pytest.mark.parametrize("holders", [None, 0, 2, True])
def test_the_job_refuses_exactly_the_run_options_that_run_options_refuses(secure, robust, share, holders):
    """RunOptions (what every workflow is given) is the one check of these settings: a job is
    refused exactly when RunOptions refuses them, and the error names the job's keys."""
    try:
        RunOptions.of(secure_aggregation=secure, robust=robust, max_site_share=share, min_holders=holders)
        expected = None
    except ValueError as exc:
        expected = str(exc)
    spec = JobSpec(target="y", sites=[SiteSpec("a", None), SiteSpec("b", None)], source="code",
                   trust=TrustSpec(robust=robust, max_site_share=share, min_holders=holders))
    spec.privacy.secure_aggregation = secure
    if expected is None:
        assert check_spec(spec) is spec
        return
    with pytest.raises(JobError) as err:
        check_spec(spec)
    text = str(err.value)
    assert any(key in text for key in ("[trust] robust", "[trust] max_site_share", "[trust] min_holders"))
    assert "robust=True" not in text and "secure_aggregation=True" not in text


# ----------------------------------------------------------------------------- the model file's table
def _model_section(d: int = 3) -> dict:
    feats = [f"x{i}" for i in range(d)]
    return {"mean": np.zeros(d), "std": np.ones(d), "model": {"name": "logistic"},
            "params": {"coef": np.full((1, d), 0.1), "intercept": np.zeros(1)},
            "schema": {"columns": feats, "categories": {}}, "encoded_columns": feats, "features": feats,
            "classes": ["0", "1"]}


def _rewrite(path, out, edit):
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    m = json.loads(members["manifest.json"])
    edit(m)
    members["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(features=["x0", "x0", "x2"]), "features must be a non-empty list of unique names"),
    (lambda m: m.update(classes=["0"]), "classes must be a list of at least two labels"),
    (lambda m: m["schema"].update(categories={"x0": [1]}), "schema categories must map column names"),
    (lambda m: m.update(encoded_columns="x0"), "encoded_columns must be a list of names"),
    (lambda m: m.update(imputer=[]), "imputer must be an object or null"),
    (lambda m: m.update(features=["x0", "x1", "z"]), "features ['z'] are not in the schema"),
    (lambda m: m.update(model={"name": "gnb"}), "do not match a gnb model over 3 features and 2 classes"),
    (lambda m: m.update(personalisation={"mode": "intercept", "sites": ["a"]}), "personalisation 'intercept' of 1 sites"),
    (lambda m: m.update(version=2), "model file version '2' is not supported"),
    (lambda m: m.pop("classes"), "manifest.json lacks 'classes'"),
])
def test_the_model_file_checks_are_a_table_run_in_order(tmp_path, edit, message):
    from fedtab.job.model_file import ModelFileError, load_model, write_model

    good = write_model(tmp_path / "good.fedtab", _model_section(), {"job": {}})
    model = load_model(good)
    assert model.predict_proba(__import__("pandas").DataFrame({"x0": [0.0], "x1": [1.0], "x2": [2.0]})).shape == (1, 2)
    with pytest.raises(ModelFileError, match=re.escape(message)) as err:
        load_model(_rewrite(good, tmp_path / "bad.fedtab", edit))
    assert str(err.value).startswith(str(tmp_path / "bad.fedtab")) and "\n" not in str(err.value)


def test_every_public_name_of_the_model_file_module_is_still_there():
    import fedtab.job.model_file as mf

    for name in ("FORMAT", "FedtabModel", "InputCheck", "ModelFileError", "PredictionError", "PredictionWarning",
                 "load_model", "probe_rows", "write_model"):
        assert hasattr(mf, name), name
    assert mf.FedtabModel.__module__ == "fedtab.job.model_file.model"
    assert mf.load_model.__module__ == "fedtab.job.model_file.read"
    assert mf.write_model.__module__ == "fedtab.job.model_file.write"
