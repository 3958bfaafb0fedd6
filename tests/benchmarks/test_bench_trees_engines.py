"""`python -m benchmarks.trees_engines --quick`: the GBDT job runs in-process and the output is
written; the deployments (FLARE, Flower) are left to the benchmark itself (no timed tests)."""

from __future__ import annotations

import json


def test_quick_mode_runs_the_gbdt_job_and_writes_its_rows(tmp_path, capsys):
    from benchmarks.trees_engines import job_config, main  # imported here: collection stays fast
    from fedtab.job.exchange_plan import planned_exchanges
    from fedtab.job.spec import spec_from_plan

    out = tmp_path / "rows.json"
    assert main(["--quick", "--json", str(out), "--workdir", str(tmp_path / "work")]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert (row["engine"], row["trees"], row["max_depth"]) == ("local", 2, 2)
    # the job's exchanges are the plan's: 2 trees x 2 levels + the GBDT's fixed exchanges
    plan = json.loads(job_config(2, 2)["job"])
    assert row["exchanges"] == sum(planned_exchanges(spec_from_plan(plan)).values())
    assert row["exchanges"] >= 2 * 2
    assert abs(row["seconds_per_exchange"] * row["exchanges"] - row["seconds"]) < 1e-9
    assert row["auroc"] > 0.7  # trees were really trained on the sites' Adult rows
    assert len(doc["load_start"]) == len(doc["load_end"]) == 3
    # a plain run: every site opted in to plain answers over the server's tree nodes
    printed = capsys.readouterr().out
    assert "load average" in printed and "| local | 2 × 2 | " in printed
    assert len(list((tmp_path / "work" / "local" / "state").glob("*/table-cache/*/manifest.json"))) == 3


def test_extrapolation_uses_the_full_jobs_exchanges_and_is_labelled():
    from benchmarks.trees_engines import extrapolate, format_table

    rows = [{"engine": "local", "trees": 100, "max_depth": 6, "exchanges": 605, "seconds": 60.0, "minutes": 1.0,
             "seconds_per_exchange": 60 / 605, "note": "in-process"},
            {"engine": "flower-loopback", "trees": 2, "max_depth": 6, "exchanges": 20, "seconds": 200.0,
             "minutes": 200 / 60, "seconds_per_exchange": 10.0, "note": "TLS"}]
    extrapolate(rows, 100, planned=999)  # a full run counted: its exchanges, not the plan's
    assert "extrapolated_minutes" not in rows[0]
    assert abs(rows[1]["extrapolated_minutes"] - 605 * 10.0 / 60) < 1e-9
    assert "extrapolated" in rows[1]["note"] and "(extrapolated)" in format_table(rows)
    alone = extrapolate([dict(rows[1], note="TLS")], 100, planned=604)  # no full run: the plan's count
    assert abs(alone[0]["extrapolated_minutes"] - 604 * 10.0 / 60) < 1e-9 and "plan's count" in alone[0]["note"]


def test_an_unknown_engine_is_refused_by_name(capsys):
    from benchmarks.trees_engines import main

    assert main(["--quick", "--engines", "local,flwr"]) == 2
    assert "unknown engine(s) ['flwr']" in capsys.readouterr().err
