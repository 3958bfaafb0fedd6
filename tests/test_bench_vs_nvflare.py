"""``python -m benchmarks.vs_nvflare --quick``: FLARE's own feature election vs fedtab in-process.

Runs FLARE's ``FeatureElectionController``/``FeatureElectionExecutor`` job in the
simulator on the example's data (small) and checks that fedtab, with FLARE's selector
and ``normalization="selected"``, elects exactly FLARE's mask and writes the JSON in the
issue's format. The engine runs of the benchmark are covered by the engine tests.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("nvflare")


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
