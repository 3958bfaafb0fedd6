"""The site's prepared table cached in its state folder (fedtab.engines.table_cache).

Only the first site built from a file reads it; a fresh process (a restarted ClientApp)
builds the same site from the cache without calling the CSV reader; a changed file or a
changed shaping setting is read again; a damaged cache (a flipped byte, a bad manifest,
a rewritten entry whose parts point outside the table) is refused and the file re-read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedtab.data.tables as tables
from fedtab.data import classification_table
from fedtab.engines.site_config import build_lazy_site, build_site
from fedtab.engines.table_cache import CACHE_DIR, TableCache, cache_key, _file_hash

SRC = Path(__file__).resolve().parents[2] / "src"


def _table(seed: int = 3, n: int = 200) -> pd.DataFrame:
    table = classification_table(n, 6, 2, 1, seed=seed)
    table["target"] = table["target"].map({0: "no", 1: "yes"})
    table["colour"] = np.where(np.arange(n) % 3 == 0, None, np.where(np.arange(n) % 2, "red", "blue"))
    table["count"] = np.arange(n, dtype=np.int64)
    table.loc[4, "f1"] = np.nan
    return table


@pytest.fixture
def config(tmp_path) -> dict:
    _table().to_csv(tmp_path / "site.csv", index=False)
    return {"name": "s", "data-path": str(tmp_path / "site.csv"), "target": "target", "state-dir": str(tmp_path / "st"),
            "folds": 3}


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every call of the table reader, by path."""
    calls: list[str] = []
    real = tables.read_table

    def counting(path, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(tables, "read_table", counting)
    return calls


def _parts(site) -> list[np.ndarray]:  # noqa: ANN001
    return [site.parts.train, site.parts.test, *site.parts.folds]


def _assert_same_site(a, b) -> None:  # noqa: ANN001
    pd.testing.assert_frame_equal(a.table, b.table)
    assert a.parts.n_rows == b.parts.n_rows and len(_parts(a)) == len(_parts(b))
    for x, y in zip(_parts(a), _parts(b)):
        np.testing.assert_array_equal(x, y)


def _entries(config: dict) -> list[Path]:
    root = Path(config["state-dir"]) / CACHE_DIR
    return sorted(root.iterdir()) if root.is_dir() else []


def test_the_second_site_comes_from_the_cache_and_equals_the_read_one(config, reads):
    first = build_site(config)
    assert reads == [config["data-path"]] and len(_entries(config)) == 1
    second = build_site(config)
    assert reads == [config["data-path"]]  # not read again
    _assert_same_site(first, second)
    assert str(second.table["colour"].dtype) == str(first.table["colour"].dtype)
    assert second.table["colour"].isna().sum() == first.table["colour"].isna().sum() > 0
    files = list(_entries(config)[0].iterdir())
    assert {f.suffix for f in files} == {".npy", ".json"}  # no pickle anywhere
    assert all(np.load(f, allow_pickle=False).dtype.kind != "O" for f in files if f.suffix == ".npy")


def test_a_fixed_split_site_caches_both_tables(tmp_path, reads):
    _table(1, 120).to_csv(tmp_path / "train.csv", index=False)
    _table(2, 40).to_csv(tmp_path / "test.csv", index=False)
    cfg = {"name": "s", "data-path": str(tmp_path / "train.csv"), "test-path": str(tmp_path / "test.csv"),
           "target": "target", "state-dir": str(tmp_path / "st")}
    first, second = build_site(cfg), build_site(cfg)
    assert len(reads) == 2 and type(second).__name__ == "FixedSplitSite"
    _assert_same_site(first, second)
    assert second.n_rows("test") == 40
    _table(5, 40).to_csv(tmp_path / "test.csv", index=False)  # the held-out file changed: both read again
    third = build_site(cfg)
    assert len(reads) == 4
    assert not third.table.equals(first.table)


def test_a_changed_file_or_setting_is_read_again_and_replaces_the_entry(config, reads):
    first = build_site(config)
    old = _entries(config)
    _table(seed=9).to_csv(config["data-path"], index=False)
    changed = build_site(config)
    assert len(reads) == 2 and not changed.table.equals(first.table)
    assert len(_entries(config)) == 1 and _entries(config) != old  # one entry per site: the current file's
    _assert_same_site(changed, build_site(config))
    assert len(reads) == 2
    for key, value in (("seed", 7), ("test-size", 0.3), ("folds", 2), ("min-rows", 3), ("na-values", "?"),
                       ("target", "colour"), ("label-map", '{"no": "n", "yes": "y"}')):
        before = len(reads)
        build_site({**config, key: value})
        assert len(reads) == before + 1, key  # another shaping setting: another key, the file read


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite_parts_outside(entry: Path) -> None:
    """A damaged entry whose hashes were rewritten to match: the train part points past the table."""
    manifest = json.loads((entry / "manifest.json").read_text())
    train = np.load(entry / "p.train.npy")
    train[-1] = 10**6
    np.save(entry / "p.train.npy", train, allow_pickle=False)
    manifest["files"]["p.train.npy"] = _file_hash(entry / "p.train.npy")
    (entry / "manifest.json").write_text(json.dumps(manifest))


def _same_row_twice(entry: Path) -> None:
    """A manifest whose two float columns name one row of their block (hashes intact)."""
    manifest = json.loads((entry / "manifest.json").read_text())
    floats = [c for c in manifest["table"]["columns"] if c.get("block") == "t.f8.npy"]
    floats[1]["row"] = floats[0]["row"]
    (entry / "manifest.json").write_text(json.dumps(manifest))


def _escape_name(entry: Path) -> None:
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["files"]["../../escape.npy"] = manifest["files"].pop("t.f8.npy")
    (entry / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [
    lambda e: _flip_byte(e / "t.f8.npy"),
    lambda e: _flip_byte(e / "p.test.npy"),
    lambda e: (e / "t.i8.npy").unlink(),
    lambda e: (e / "manifest.json").write_text("{not json"),
    lambda e: (e / "manifest.json").write_text(json.dumps({"format": "other", "files": {}})),
    _rewrite_parts_outside,
    _same_row_twice,
    _escape_name,
], ids=["flipped-column", "flipped-part", "missing-array", "bad-json", "other-format", "parts-outside", "same-row",
        "escape"])
def test_a_damaged_cache_is_refused_and_the_file_read_again(config, reads, damage):
    first = build_site(config)
    damage(_entries(config)[0])
    again = build_site(config)
    assert len(reads) == 2  # refused: read from the file
    _assert_same_site(first, again)
    build_site(config)
    assert len(reads) == 2  # and stored anew
    assert not (Path(config["state-dir"]).parent / "escape.npy").exists()


def test_no_state_dir_no_cache_and_an_uncacheable_column_is_read_every_time(tmp_path, config, reads):
    cfg = {k: v for k, v in config.items() if k != "state-dir"}
    build_site(cfg), build_site(cfg)
    assert len(reads) == 2 and not (tmp_path / "st").exists()
    table = _table()
    table["when"] = pd.to_datetime("2020-01-01") + pd.to_timedelta(np.arange(len(table)), unit="D")
    from fedtab.engines.table_cache import CachedTables

    site = build_site(config)
    assert not TableCache(config["state-dir"]).store(cache_key({"data_path": config["data-path"]}),
                                                     CachedTables(table, None, site.parts))
    with pytest.raises(ValueError, match="not a cache key"):
        TableCache(config["state-dir"]).load("../../x")


def test_columns_of_every_kind_come_back_in_their_order_from_one_file_per_dtype(tmp_path):
    from fedtab.engines.table_cache import CachedTables, _frame, _frame_arrays

    n = 7
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.normal(size=n), "flag": rng.random(n) > 0.5, "k": np.arange(n, dtype=np.int64),
                          "word": ["x", None, "yy", "z", "x", None, "w"], "b": rng.normal(size=n).astype(np.float32),
                          "c": rng.normal(size=n), "j": np.arange(n, dtype=np.int32) * 3})
    specs, arrays = _frame_arrays(table, "t")
    assert sorted(arrays) == ["t.b1.npy", "t.f4.npy", "t.f8.npy", "t.i4.npy", "t.i8.npy", "t3.na.npy", "t3.npy"]
    assert arrays["t.f8.npy"].shape == (2, n)  # a and c: one file
    back = _frame(specs, arrays, "t", n)
    pd.testing.assert_frame_equal(back, table)
    with pytest.raises(ValueError, match="no block of this table"):
        _frame([{**specs[0], "block": "h.f8.npy"}, *specs[1:]], arrays, "t", n)
    with pytest.raises(ValueError, match="text column 3 is malformed"):
        _frame(specs, arrays, "t", n + 1)
    numbers = [s for s in specs if s["kind"] == "numeric"]
    with pytest.raises(ValueError, match=r"t.f8.npy has shape \(2, 7\), expected \(columns, 8\)"):
        _frame(numbers, arrays, "t", n + 1)
    cache = TableCache(tmp_path)
    from fedtab.federation.site.parts import RowParts

    parts = RowParts(n_rows=n, train=np.arange(5), test=np.arange(5, n), folds=())
    assert cache.store("0" * 64, CachedTables(table, None, parts))
    pd.testing.assert_frame_equal(cache.load("0" * 64).table, table)


# A fresh interpreter, as a restarted ClientApp: builds the lazy site and answers with its table's
# fingerprint; with BLOCK set the CSV reader raises, so the site must come from the cache.
FRESH = textwrap.dedent("""
    import json, sys
    import pandas as pd
    import fedtab.data.tables as tables
    if sys.argv[2] == "block":
        def refuse(*a, **k):
            raise AssertionError("the CSV reader was called")
        tables.read_table = pd.read_csv = refuse
    from fedtab.engines.site_config import build_lazy_site
    site = build_lazy_site(json.loads(sys.argv[1]))
    t = site.table
    print(json.dumps({"rows": len(t), "hash": int(pd.util.hash_pandas_object(t).sum() % 2**61),
                      "train": site.parts.train.tolist()[:20], "dtypes": [str(d) for d in t.dtypes]}))
""")


def _fresh(config: dict, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FRESH, json.dumps(config), mode], capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})


def test_a_restarted_process_reads_the_cache_not_the_csv(config):
    blocked = _fresh(config, "block")  # nothing cached yet: the reader is needed, and refused
    assert blocked.returncode != 0 and "the CSV reader was called" in blocked.stderr
    first = _fresh(config, "read")
    assert first.returncode == 0, first.stderr
    again = _fresh(config, "block")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)
    build_lazy_site(config)  # the lazy site needs the file only to exist
