"""House rules the suite enforces with ruff (issue 29, item 5): the committed configuration in
``pyproject.toml`` (``[tool.ruff]``) reports nothing on ``src``, ``tests`` and ``benchmarks``.

The rules are the project's own choice: pyflakes (``F``: undefined names, names in ``__all__``
that do not exist, unused imports and variables), ``E9`` (files that do not parse), ``W`` and
``C901`` (no function with a McCabe complexity over :data:`MAX_COMPLEXITY`, issue 29 item 5; the
other limits of that item — body length, parameters — are in ``tests/test_layering.py``).
Skipped, with the reason, only when ruff is not installed (``pip install -e '.[dev]'``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("src", "tests", "benchmarks")
#: the most complex a function may be (ruff's C901, McCabe's cyclomatic complexity)
MAX_COMPLEXITY = 25

needs_ruff = pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                                reason="ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_ruff_configuration_is_committed_with_the_house_rules():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    selected = set(config["tool"]["ruff"]["lint"]["select"])
    assert {"F", "E9"} <= selected
    assert not set(config["tool"]["ruff"]["lint"].get("ignore", [])) & {"F", "F401", "F821", "F822", "F841"}
    assert any(dep.startswith("ruff") for dep in config["project"]["optional-dependencies"]["dev"])
    assert "C901" in selected and config["tool"]["ruff"]["lint"]["mccabe"]["max-complexity"] <= MAX_COMPLEXITY
    ignored = config["tool"]["ruff"]["lint"].get("per-file-ignores", {})
    assert not {code for codes in ignored.values() for code in codes} & {"F", "F401", "F821", "F822", "F841"}


@needs_ruff
def test_ruff_finds_nothing_in_the_tree():
    done = _ruff(*CHECKED)
    assert done.returncode == 0, f"ruff check {' '.join(CHECKED)} (pyproject.toml [tool.ruff]):\n{done.stdout}{done.stderr}"


@needs_ruff
def test_the_committed_rules_catch_an_undefined_name_an_unused_import_and_a_bad_all(tmp_path):
    """The check can fail: the committed configuration, run on a module with each kind of mistake."""
    bad = tmp_path / "bad.py"
    bad.write_text('import os\n\n__all__ = ["missing"]\n\n\ndef f(request: "Message") -> int:\n'
                   '    unused = 1\n    return undefined_name\n')
    done = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert done.returncode == 1
    codes = {line.split(" ")[1] for line in done.stdout.splitlines() if line.startswith("bad.py:")}
    assert codes == {"F401", "F821", "F822", "F841"}, done.stdout


def _function_of_complexity(cc: int) -> str:
    """A module with one function ``f`` of McCabe complexity ``cc`` (``cc - 1`` ``if`` statements)."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(cc - 1))
    return f"def f(x):\n{body}    return -1\n"


@needs_ruff
def test_the_committed_rules_refuse_a_function_over_the_complexity_limit(tmp_path):
    """C901 at :data:`MAX_COMPLEXITY`: a function of that complexity passes, one more branch fails."""
    (tmp_path / "at_limit.py").write_text(_function_of_complexity(MAX_COMPLEXITY))
    (tmp_path / "over.py").write_text(_function_of_complexity(MAX_COMPLEXITY + 1))
    done = _ruff("--config", str(ROOT / "pyproject.toml"), "at_limit.py", "over.py", cwd=tmp_path)
    assert done.returncode == 1
    found = [line for line in done.stdout.splitlines() if " C901 " in line]
    assert len(found) == 1 and found[0].startswith("over.py:") and f"({MAX_COMPLEXITY + 1} > " in found[0], done.stdout
