"""Imports run downward only (DESIGN.md, "Layout"): checked by parsing every module's imports.

* the algorithms (``election/``, ``impute/``, ``learn/``) and the privacy math (``privacy/``)
  import nothing from ``federation/``, ``engines/``, ``job/``, ``report/``, ``cli/`` or the front
  doors (``estimators/``);
* ``federation/`` imports no engine (nor ``job/``, ``report/``, ``cli/``, ``estimators/``).

Every import counts wherever it is written — module level, inside a function, relative or
absolute — except those under ``if TYPE_CHECKING:`` (annotations only: nothing is imported
when the code runs). The few known exceptions are listed in :data:`EXCEPTIONS` with why; a
test fails when one of them is no longer needed, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedtab"

ALGORITHMS = ("election", "impute", "learn", "privacy")
ABOVE_ALGORITHMS = ("federation", "engines", "job", "report", "cli", "estimators")
RULES = {layer: ABOVE_ALGORITHMS for layer in ALGORITHMS}
RULES["federation"] = ("engines", "job", "report", "cli", "estimators")

#: ``(module, imported package): why`` — imports the rules allow for now
EXCEPTIONS = {
    ("fedtab.election", "fedtab.estimators"): "the old import path fedtab.election.FederatedFeatureElection, "
                                              "resolved on first access only",
}


def _module_name(path: Path) -> str:
    parts = ("fedtab", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports at run time (any depth, relative resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)  # ``from . import engines``
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def violations(layer: str) -> dict[tuple[str, str], list[str]]:
    """``{(module, forbidden package): [imported names]}`` of the modules of ``layer``."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted((SRC / layer).rglob("*.py")):
        module = _module_name(path)
        for name in sorted(imports(path)):
            for banned in RULES[layer]:
                target = f"fedtab.{banned}"
                if name == target or name.startswith(target + "."):
                    out.setdefault((module, target), []).append(name)
    return out


@pytest.mark.parametrize("layer", sorted(RULES))
def test_imports_run_downward_only(layer):
    found = {k: v for k, v in violations(layer).items() if k not in EXCEPTIONS}
    assert found == {}, "\n".join(f"{m} imports {t}: {', '.join(names)}" for (m, t), names in found.items())


def test_every_exception_is_still_needed():
    found = {k for layer in RULES for k in violations(layer)}
    assert set(EXCEPTIONS) <= found, f"no longer needed, remove from EXCEPTIONS: {sorted(set(EXCEPTIONS) - found)}"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """An adversarial module: a relative import inside a function, an absolute one in a class, one under
    ``if TYPE_CHECKING`` (allowed) and one in its ``else`` branch (not)."""
    pkg = tmp_path / "election"
    pkg.mkdir()
    (pkg / "sneaky.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..federation.site import Site\n"
        "else:\n    import fedtab.report.html\n"
        "def f():\n    from ..engines import local\n"
        "class C:\n    import fedtab.job.spec as spec\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    found = violations("election")
    assert set(found) == {("fedtab.election.sneaky", "fedtab.report"), ("fedtab.election.sneaky", "fedtab.engines"),
                          ("fedtab.election.sneaky", "fedtab.job")}


# ----------------------------------------------------------------------------- readable functions
#: longest body (statements after the signature and the docstring) of any function in ``src/fedtab``
MAX_BODY_LINES = 100


def _long_functions(root: Path, limit: int) -> list[str]:
    """``"path:function (n lines)"`` (path relative to ``root``) for every function under ``root``
    whose body exceeds ``limit`` lines."""
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body = body[1:]
            if body and (n := node.end_lineno - body[0].lineno + 1) > limit:
                long.append(f"{path.relative_to(root)}:{node.name} ({n} lines)")
    return long


def test_no_function_body_is_longer_than_a_screenful():
    """Issue 21: files a newcomer can read — no function body over ``MAX_BODY_LINES`` lines
    (a signature's options and a docstring do not count)."""
    assert _long_functions(SRC, MAX_BODY_LINES) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "fedtab"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    (pkg / "long.py").write_text(f'def f():\n    """doc"""\n{body}\n\n\ndef g():\n    """doc"""\n    return 1\n')
    assert _long_functions(pkg, MAX_BODY_LINES) == ["long.py:f (101 lines)"]
