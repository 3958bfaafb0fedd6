"""Bad input at the command line is refused before any work (issue 10, item 6)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.data.tables import TableError, read_table
from fedtab.report.output import OutputError, atomic_dir, check_writable
from tests.builders import classification_parts, write_csvs

runner = CliRunner()


@pytest.fixture
def files(tmp_path):
    return write_csvs(classification_parts(240, 6, 3, 1, [0.5, 0.5], seed=2, split_seed=0, class_sep=1.5)[1], tmp_path)


def _elect(args):
    return runner.invoke(app, ["elect", *map(str, args), "--target", "target", "--no-train"])


def _one_line_error(res, *fragments):
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    for f in fragments:
        assert f in text, text
    assert "Traceback" not in res.output


def test_unwritable_output_is_refused_before_computing(files, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = _elect([*files, "--out", blocker / "results"])
    _one_line_error(res, "not a directory")
    res = _elect([*files, "--out", blocker])
    _one_line_error(res, "is not a directory")


def test_mixed_numeric_and_text_column_names_the_column_and_a_value(files, tmp_path):
    bad = tmp_path / "mixed.csv"
    text = files[0].read_text().splitlines()
    header = text[0].split(",")
    row = text[3].split(",")
    row[header.index("f2")] = "oops"
    bad.write_text("\n".join([text[0], *text[1:3], ",".join(row), *text[4:]]) + "\n")
    res = _elect([bad, files[1], "--out", tmp_path / "o"])
    _one_line_error(res, "'f2'", "'oops'", "mixes numbers and text")
    ok = _elect([bad, files[1], "--na-value", "oops", "--out", tmp_path / "o"])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "o" / "result.json").read_text())["categorical_columns"] == []


def test_duplicate_column_names_are_found_before_pandas_renames_them(files, tmp_path):
    dup = tmp_path / "dup.csv"
    lines = files[0].read_text().splitlines()
    dup.write_text("\n".join([lines[0].replace("f1", "f0")] + lines[1:]) + "\n")
    res = _elect([dup, files[1], "--out", tmp_path / "o"])
    _one_line_error(res, "duplicate column names", "'f0'")
    with pytest.raises(TableError, match="duplicate"):
        read_table(dup)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_freedom_degree_is_a_parse_error(files, tmp_path, value):
    res = _elect([*files, "--fd", value, "--out", tmp_path / "o"])
    assert res.exit_code == 2 and ("finite" in res.output or "range" in res.output), res.output
    assert not (tmp_path / "o").exists()


def test_quorum_and_min_holders_reach_the_result(files, tmp_path):
    res = _elect([*files, "--min-sites", "2", "--min-holders", "2", "--out", tmp_path / "o"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "o" / "result.json").read_text())
    assert doc["min_holders"] == 2 and doc["dropped"] == {}
    assert doc["trust"]["min_sites"] == 2 and doc["trust"]["min_holders"] == 2
    election = next(p for p in doc["participation"]["steps"] if p["step"] == "election")
    assert election == {"step": "election", "sites": ["site0", "site1"], "dropped": {}}
    assert {"step": "ballot", "sites": ["site0", "site1"]} in doc["participation"]["exchanges"]
    _one_line_error(_elect([*files, "--min-sites", "3", "--out", tmp_path / "p"]), "--min-sites 3")


def test_tracebacks_never_show_local_variables():
    assert app.pretty_exceptions_show_locals is False


def test_output_is_replaced_atomically(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.json").write_text("1")
        assert not out.exists()  # nothing visible until the set is complete
    assert (out / "a.json").read_text() == "1"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a.json").write_text("2")
            (tmp / "b.json").write_text("half")
            raise RuntimeError("failed half-way")
    assert sorted(p.name for p in out.iterdir()) == ["a.json"] and (out / "a.json").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left behind
    with atomic_dir(out) as tmp:
        (tmp / "c.json").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == ["c.json"]
    with pytest.raises(OutputError):
        check_writable(out / "c.json")


def test_a_failed_elect_run_leaves_previous_results_intact(files, tmp_path, monkeypatch):
    out = tmp_path / "o"
    assert _elect([*files, "--out", out]).exit_code == 0
    before = (out / "result.json").read_text()
    import fedtab.federation.workflows.election.server as flow

    def boom(*a, **k):
        raise ValueError("election failed")

    monkeypatch.setattr(flow, "elect_from_ballots", boom)
    monkeypatch.setattr(flow, "election_reduction", boom)  # run_election elects through it
    import fedtab.federation as fed_pkg

    monkeypatch.setattr(fed_pkg, "run_election", lambda *a, **k: boom())
    res = _elect([*files, "--out", out])
    _one_line_error(res, "election failed")
    assert (out / "result.json").read_text() == before
    assert np.array_equal(sorted(p.name for p in tmp_path.iterdir()), sorted(["o", "site0.csv", "site1.csv"]))


def test_impute_min_sites_above_the_site_count_is_refused_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from fedtab.cli import app

    files = []
    for i in range(2):
        files.append(tmp_path / f"s{i}.csv")
        files[-1].write_text("a,b\n" + "".join(f"{j},{j * 2}\n" for j in range(12)))
    res = CliRunner().invoke(app, ["impute", *map(str, files), "--min-sites", "3", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--min-sites 3 is more than the 2 site file(s)" in res.output
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize("value, fragment", [
    ("9223372036854775807", "at most 31536000 (a year)"),  # overflowed the platform's wait: a traceback
    ("1e400", "at most 31536000 (a year), got inf"),
    ("nan", "must be a positive number of seconds"),
    ("0", "must be a positive number of seconds"),
    ("-5", "must be a positive number of seconds"),
    ('"soon"', "[trust] timeout must be a number, got 'soon'"),
    ("true", "[trust] timeout must be a number, got True"),
    ("[600]", "[trust] timeout must be a number"),
])
def test_trust_timeout_bad_values_are_one_line_errors(files, tmp_path, value, fragment):
    job = tmp_path / "job.toml"
    job.write_text(f'target = "target"\n[sites.a]\npath = "{files[0]}"\n[sites.b]\npath = "{files[1]}"\n'
                   f"[trust]\ntimeout = {value}\n")
    res = runner.invoke(app, ["run", str(job), "--out", str(tmp_path / "o")])
    _one_line_error(res, "[trust] timeout", fragment)
    assert not isinstance(res.exception, OverflowError) and not (tmp_path / "o").exists()


def test_a_huge_in_process_timeout_waits_instead_of_overflowing(files):
    """The in-process engine's own ``timeout`` (the Python API) is clamped to the platform's
    longest wait: a site answers instead of an OverflowError."""
    from fedtab.engines.local import LocalFederation
    from fedtab.federation.protocol.messages import Message
    from fedtab.federation.site.core import Site

    fed = LocalFederation([Site("a", read_table(files[0]), "target")], timeout=1e300)
    reply = fed.ask({"a": Message("describe", meta={"features": ["f0"]})})["a"]
    assert reply.kind == "describe", reply.meta
