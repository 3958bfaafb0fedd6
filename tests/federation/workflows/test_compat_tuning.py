"""``compat`` reaches the tuning workflow, the job file and ``fedtab elect --tune``."""

import pytest

from fedtab.federation import elect_from_ballots, tune_flow
from fedtab.job.spec import JobError, parse_job
from tests.builders import classification_parts, federation, write_csvs


def test_tuning_elects_every_candidate_with_the_peer_rule():
    fed = federation(classification_parts(900, 30, 5, 3, class_sep=1.5)[1], seed=range(3))
    out = tune_flow(fed, selector="lasso", model="logistic", compat="nvflare", apply=False, rounds=3, local_epochs=3,
                    grid=(0.0, 0.25, 0.5, 0.75, 1.0), refine_step=0.0)
    assert out.election.compat == "nvflare"
    fd = out.tuning.freedom_degree
    ours = elect_from_ballots(out.ballots, fd, compat="nvflare")
    assert out.features == ours.selected_names
    # the curve's masks are the profile's: FLARE returns the union from fd >= 0.99
    curve = out.tuning.curve()
    union = elect_from_ballots(out.ballots, 1.0, compat="nvflare")
    assert curve[-1]["kept"] == len(union.selected_names)


def _job(election):
    return {"target": "y", "sites": {"a": {"path": "a.csv"}, "b": {"path": "b.csv"}},
            "election": election, "training": {"model": "logistic"}}


def test_job_file_takes_compat_and_checks_it(tmp_path):
    for n in ("a", "b"):
        (tmp_path / f"{n}.csv").write_text("x,y\n1,0\n")
    spec = parse_job(_job({"compat": "nvflare", "tune": "grid"}), tmp_path)
    assert spec.election.compat == "nvflare"
    with pytest.raises(JobError, match="compat"):
        parse_job(_job({"compat": "flare"}), tmp_path)
    with pytest.raises(JobError, match="normali"):
        parse_job(_job({"compat": "flash", "normalization": "selected"}), tmp_path)


def test_cli_tunes_with_a_peer_rule(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedtab.cli import app
    files = write_csvs(classification_parts(600, 20, 4, 2, [0.5, 0.5], seed=1, class_sep=1.5)[1], tmp_path)
    res = CliRunner().invoke(app, ["elect", *map(str, files), "--target", "target", "-s", "anova",
                                   "--compat", "nvflare", "--tune", "grid", "--rounds", "2",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["compat"] == "nvflare" and doc["tuning"]["freedom_degree"] is not None
