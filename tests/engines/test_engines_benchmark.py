"""`python -m benchmarks.engines --quick` on the cheapest engines (in-process and Flower's
ServerApp/ClientApp in one process): the same job makes the same exchanges on both, and
the table reports them. The deployments (Flower loopback, FLARE) are left to the benchmark."""

from __future__ import annotations

from benchmarks import engines
from benchmarks.engines import CHEAP, format_table, main, run_engines


def test_the_quick_benchmark_runs_the_same_job_on_the_cheap_engines(tmp_path, capsys):
    rows = run_engines(CHEAP, quick=True, workdir=tmp_path)
    assert [r["engine"] for r in rows] == list(CHEAP)
    # election (ballot, set_mask) + 1 FedAvg round + the evaluation, on every engine
    assert [r["exchanges"] for r in rows] == [4, 4]
    for r in rows:
        assert r["seconds"] > 0 and abs(r["seconds_per_exchange"] * r["exchanges"] - r["seconds"]) < 1e-9
        assert r["fedtab_cpu_per_message"] > 0 and r["ratio_to_bare"] is None  # no bare run among these
    # every site got a table cache in its state folder (the benchmark's sites are deployed ones)
    assert len(list((tmp_path / "local" / "state").glob("*/table-cache/*/manifest.json"))) == 3
    table = format_table(rows)
    assert table.count("\n") == 1 + len(rows) and "| local | 4 |" in table


def test_an_unknown_engine_is_refused_by_name(capsys):
    assert main(["--quick", "--engines", "local,flwr"]) == 2
    assert "unknown engine(s) ['flwr']" in capsys.readouterr().err
    assert set(CHEAP) <= set(engines.ENGINES)
