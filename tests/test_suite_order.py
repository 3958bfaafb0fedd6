"""The order ``make test`` hands test files to its xdist workers (tests/conftest.py)."""

from pathlib import Path

from tests.conftest import FILLERS, HEAVY_FILES, heavy_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_heavy_file_and_filler_exists():
    """A renamed or removed file would silently fall back to the end of the queue."""
    for name in [*HEAVY_FILES, *FILLERS]:
        assert (ROOT / name).is_file(), name


def test_heavy_files_go_first_dearest_first_and_never_queue_behind_a_short_heavy_one():
    files = [("a.py", 30), ("slow1.py", 1), ("b.py", 2), ("c.py", 5), ("slow3.py", 4), ("slow2.py", 2),
             ("d.py", 3)]
    heavy = {"slow1.py": 100, "slow2.py": 50, "slow3.py": 10}
    order = heavy_first(files, heavy, fillers=("d.py",))
    assert sorted(order) == sorted(name for name, _ in files)  # every file, once
    # slow1 and slow2 have at most 2 tests: a cheap file of 3 or more follows each (d.py preferred)
    assert order == ["slow1.py", "d.py", "slow2.py", "a.py", "slow3.py", "b.py", "c.py"]
    assert heavy_first(files, {}) == [name for name, _ in files]  # nothing heavy: collection order


def test_the_hook_moves_whole_heavy_files_first_keeping_each_files_test_order():
    from types import SimpleNamespace

    from tests.conftest import pytest_collection_modifyitems

    heavy = next(iter(HEAVY_FILES))
    ids = ["tests/x/test_a.py::t1", "tests/x/test_a.py::t2", f"{heavy}::t1", f"{heavy}::t2", f"{heavy}::t3",
           "tests/x/test_b.py::t1"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [it.nodeid for it in items] == [*ids[2:5], *ids[:2], ids[5]]
