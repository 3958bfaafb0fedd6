"""``python -m benchmarks.vs_nvflare --quick``: FLARE's own feature election vs fedtab in-process.

Runs FLARE's ``FeatureElectionController``/``FeatureElectionExecutor`` job in the
simulator on the example's data (small) and checks that fedtab, with FLARE's selector
and ``normalization="selected"``, elects exactly FLARE's mask and writes the JSON in the
issue's format. The engine runs of the benchmark are covered by the engine tests.
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.requires("nvflare")


@pytest.mark.slow
def test_quick_benchmark_masks_equal_flare(tmp_path):
    from benchmarks import vs_nvflare

    code = vs_nvflare.main(["--quick", "--out", str(tmp_path), "--skip", "nvflare,same-interval,flower"])
    runs = json.loads((tmp_path / "vs_nvflare.json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["nvflare-feature-election", "fedtab-local"]
    assert all(set(r) == {"name", "seconds", "kept", "mask_equals_nvflare", "f1"} for r in runs)
    assert runs[1]["mask_equals_nvflare"] is True and code == 0
    assert runs[0]["kept"] == runs[1]["kept"] > 0
    assert (tmp_path / "vs_nvflare.md").read_text().startswith("# fedtab vs NVIDIA FLARE")


def test_flower_bare_replays_fedtabs_exchanges_and_fedtab_reports_clientapp_stages(tmp_path):
    """``flower-bare`` makes exactly the exchanges of a fedtab run, with their sizes; fedtab's
    ClientApp reports its per-message stages (the benchmark's breakdown)."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from benchmarks import flower_bare, vs_nvflare
    from fedtab.engines import flower

    configs = vs_nvflare.write_data(vs_nvflare.example_data(300), tmp_path / "data")  # test parts above the floor
    result = flower.run_in_process(configs, vs_nvflare.run_config(1, 0.5))
    assert [e["kind"] for e in result["exchanges"]] == ["ballot", "set_mask", "fit", "evaluate"]
    for e in result["exchanges"]:
        assert e["bytes_down"] > 0 and e["bytes_up"] > 0
        assert {"fedtab_import", "restore", "work", "store"} <= set(e["clientapp"])
    plan = vs_nvflare.bare_plan(result)
    assert plan[0] == [0, 0] and len(plan) == 5

    out = tmp_path / "bare.json"
    cfg = {"plan": json.dumps(plan), "min-sites": 3, "timeout": 60.0, "result-path": str(out)}
    grid = flower.InProcessGrid(flower_bare.client_app, configs, run_config=cfg)
    ctx = Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                  run_config=cfg)
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run.run_id, SUPERLINK_NODE_ID
    try:
        flower_bare.server_app(grid, ctx)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    bare = json.loads(out.read_text())
    assert bare["sites"] == 3
    assert [[e["bytes_down"], e["bytes_up"]] for e in bare["exchanges"]] == plan
    source = open(flower_bare.__file__).read()  # no fedtab import: bare (its trace lines only mimic fedtab's format)
    assert not re.search(r"^\s*(import|from)\s+fedtab|import_module\(.fedtab|__import__\(.fedtab", source, re.M)
