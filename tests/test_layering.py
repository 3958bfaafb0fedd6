"""Imports run downward only (DESIGN.md, "Layout"): checked by parsing every module's imports.

* the algorithms (``election/``, ``impute/``, ``learn/``) and the privacy math (``privacy/``)
  import nothing from ``federation/``, ``engines/``, ``job/``, ``report/``, ``cli/`` or the front
  doors (``estimators/``);
* ``federation/`` imports no engine (nor ``job/``, ``report/``, ``cli/``, ``estimators/``).

Every import counts wherever it is written — module level, inside a function, relative or
absolute — except those under ``if TYPE_CHECKING:`` (annotations only: nothing is imported
when the code runs). The few known exceptions are listed in :data:`EXCEPTIONS` with why; a
test fails when one of them is no longer needed, so the list only shrinks.

* ``engines/`` imports no ``job/`` (the job hands the engine its server app; issue 29 item 3), not
  even by a name written as a string (:func:`named_modules`: ``importlib.import_module`` of a
  constant, a default in the Flower app's ``pyproject.toml``): a deployed server imports the
  server app its run configuration names, which the job's side writes;
* no import circles: the run-time import graph of fedtab's modules (every import, as above;
  a package is its ``__init__``) has no strongly connected component but the ones listed in
  :data:`CIRCLES` (which can only shrink: a new module in a circle, a new import inside one, or
  a new circle fails; a circle that shrank must be written down smaller);
* imports under ``if TYPE_CHECKING:`` are counted apart (:func:`type_only_imports`): they make
  no circle, and those against the layers are listed in :data:`TYPE_ONLY_EXCEPTIONS`.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import tomllib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fedtab"

ALGORITHMS = ("election", "impute", "learn", "privacy")
ABOVE_ALGORITHMS = ("federation", "engines", "job", "report", "cli", "estimators")
RULES = {layer: ABOVE_ALGORITHMS for layer in ALGORITHMS}
RULES["federation"] = ("engines", "job", "report", "cli", "estimators")
RULES["engines"] = ("job",)
# the federation's four parts (issue 29): protocol <- site <- steps <- workflows
RULES["federation/protocol"] = ("federation.site.core", "federation.site.lazy", "federation.steps",
                                "federation.workflows")
RULES["federation/site"] = ("federation.steps", "federation.workflows")
RULES["federation/steps"] = ("federation.workflows",)

#: ``(module, imported package): why`` — imports the rules allow for now
EXCEPTIONS = {
    ("fedtab.election", "fedtab.estimators"): "the old import path fedtab.election.FederatedFeatureElection, "
                                              "resolved on first access only",
}

#: ``(module, imported package): why`` — imports against the rules written under ``if TYPE_CHECKING:``
#: (annotations only: nothing is imported when the code runs); counted apart, the list only shrinks
TYPE_ONLY_EXCEPTIONS = {
    ("fedtab.privacy.gate", "fedtab.federation"): "annotations name the Message the gate checks",
    ("fedtab.privacy.policy", "fedtab.federation"): "annotations name the Site and Message a policy checks",
    ("fedtab.privacy.secagg", "fedtab.federation"): "annotations name the Site and Message the site side masks",
    ("fedtab.federation.steps.baselines", "fedtab.federation.workflows"): "an annotation names the training outcome "
                                                                           "whose settings the baselines repeat",
}

#: the import circles of today as ``(modules, imports between them)``: none is left (issue 29's "done
#: when": the last ones, the job's steps, the election's selectors and rule, privacy's dp ↔ policy, were
#: broken by shared modules and tables filled by the side that knows). It can only shrink — see
#: :func:`test_no_new_import_circle` and :func:`test_every_listed_circle_is_as_written`.
CIRCLES: list[tuple[frozenset[str], int]] = []



def _module_name(path: Path) -> str:
    parts = ("fedtab", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """``(run time, type only)``: absolute names of every module ``path`` imports (any depth, relative
    resolved), those under ``if TYPE_CHECKING:`` apart (its ``else`` branch runs: it counts as run time)."""
    return _parsed_imports(_module_name(path), path.name == "__init__.py", path.read_text(), str(path))


@functools.lru_cache(maxsize=None)
def _parsed_imports(module: str, is_package: bool, text: str, filename: str) -> tuple[frozenset[str], frozenset[str]]:
    package = module if is_package else module.rpartition(".")[0]
    run_time: set[str] = set()
    type_only: set[str] = set()

    def visit(node: ast.AST, found: set[str]) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, type_only)
            for child in node.orelse:
                visit(child, found)
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
            # ``from . import engines`` names the module ``engines``; ``from .site import Site`` a name
            # of ``site`` (``…site.Site`` resolves to ``…site``); ``from x import *`` is ``x.*``
            found.update(f"{name}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, found)

    visit(ast.parse(text, filename), run_time)
    return frozenset(run_time), frozenset(type_only)


def imports(path: Path) -> frozenset[str]:
    """Absolute names of every module ``path`` imports at run time (any depth, relative resolved)."""
    return _imports(path)[0]


def type_only_imports(path: Path) -> frozenset[str]:
    """Absolute names ``path`` imports under ``if TYPE_CHECKING:`` only (annotations: nothing runs)."""
    return _imports(path)[1]


def violations(layer: str, type_only: bool = False) -> dict[tuple[str, str], list[str]]:
    """``{(module, forbidden package): [imported names]}`` of the modules of ``layer`` (at run time, or
    under ``if TYPE_CHECKING:`` only)."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted((SRC / layer).rglob("*.py")):
        module = _module_name(path)
        for name in sorted(_imports(path)[1 if type_only else 0]):
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


def test_type_only_imports_against_the_layers_are_the_listed_ones():
    found = {k for layer in RULES for k in violations(layer, type_only=True)}
    assert found - set(TYPE_ONLY_EXCEPTIONS) == set(), "new type-only imports against the layers"
    assert set(TYPE_ONLY_EXCEPTIONS) - found == set(), "no longer needed, remove from TYPE_ONLY_EXCEPTIONS"


#: a module written as a string (``"fedtab.job"``, ``"fedtab.job.apps:server_app"``): what an
#: ``importlib.import_module`` or an entry point would import without an import statement
_MODULE_NAME = re.compile(r"(fedtab(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?::[A-Za-z_][A-Za-z0-9_.]*)?")


def _strings(value: object) -> list[str]:
    """Every string in a parsed TOML/JSON document (keys and values, any depth)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def named_modules(path: Path) -> frozenset[str]:
    """The fedtab modules a file names in a whole string: a string constant of a Python module (not
    a docstring's prose: the string must be the name alone), any string of a TOML or JSON file."""
    if path.suffix == ".py":
        texts = [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    elif path.suffix == ".toml":
        texts = _strings(tomllib.loads(path.read_text(encoding="utf-8")))
    elif path.suffix == ".json":
        texts = _strings(json.loads(path.read_text(encoding="utf-8")))
    else:
        return frozenset()
    return frozenset(m.group(1) for t in texts if (m := _MODULE_NAME.fullmatch(t.strip())))


def named_violations(layer: str, root: Path | None = None) -> dict[str, list[str]]:
    """``{file: [fedtab modules of a forbidden layer it names in a string]}`` under ``layer``."""
    root = root or SRC
    out: dict[str, list[str]] = {}
    for path in sorted((root / layer).rglob("*")):
        banned = sorted(n for n in named_modules(path) for b in RULES[layer]
                        if n == f"fedtab.{b}" or n.startswith(f"fedtab.{b}."))
        if banned:
            out[str(path.relative_to(root))] = banned
    return out


def test_the_engines_name_no_job_module_in_a_string():
    """Issue 29 item 3: the engines reach the job by no string either — a deployed server imports
    the server app its run configuration names, written by the job's side (``fedtab.job.apps``)."""
    assert named_violations("engines") == {}


def test_the_string_check_sees_a_constant_import_and_an_app_default(tmp_path):
    """An adversarial engine: ``importlib.import_module`` of a constant, an entry point as a default
    argument, the Flower app's config defaulting to the job's app; prose in a docstring is not a name."""
    pkg = tmp_path / "engines"
    pkg.mkdir()
    (pkg / "sneaky.py").write_text(
        '"""Runs fedtab.job.apps:server_app, see fedtab.job.workflow."""\n'
        "import importlib\n"
        "def f(name='fedtab.job.apps:server_app'):\n    return importlib.import_module('fedtab.job.workflow')\n"
        "OK = 'fedtab.federation.protocol'\n")
    (pkg / "app.toml").write_text('[config]\nserver-app = "fedtab.job.apps:server_app"\nother = "x"\n')
    assert named_violations("engines", tmp_path) == {"engines/app.toml": ["fedtab.job.apps"],
                                                     "engines/sneaky.py": ["fedtab.job.apps", "fedtab.job.workflow"]}


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
#: (issue 29 item 5; the complexity limit is ruff's C901 in pyproject.toml, tests/test_house_rules.py)
MAX_BODY_LINES = 80
#: a function taking this many parameters or more (positional and keyword-only; not ``self``/``cls``,
#: nor ``*args``/``**kwargs``) must be in :data:`MANY_PARAMETERS`
MANY_PARAMETER_COUNT = 10
#: ``"path:qualified name": why`` — the only functions allowed :data:`MANY_PARAMETER_COUNT` parameters
#: or more (at most five; issue 29 item 5): every other function groups related parameters in small
#: dataclasses
MANY_PARAMETERS = {
    "cli/elect.py:elect_command": "a typer command: each option is a parameter",
    "cli/impute.py:impute_command": "a typer command: each option is a parameter",
    "cli/run.py:run_command": "a typer command: each option is a parameter",
    "estimators/imputer.py:FederatedImputer.__init__": "a scikit-learn estimator: each setting is a parameter",
    "estimators/election.py:FederatedFeatureElection.__init__": "a scikit-learn estimator: each setting is a "
                                                                "parameter",
}

def _functions(root: Path):
    """``(path relative to root, qualified name, node)`` of every function under ``root`` (methods
    as ``Class.method``; a function inside a function as ``outer.inner``)."""
    for path in sorted(root.rglob("*.py")):
        stack = [("", node) for node in ast.parse(path.read_text(encoding="utf-8")).body]
        while stack:
            prefix, node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + node.name
                if not isinstance(node, ast.ClassDef):
                    yield path.relative_to(root), name, node
                stack.extend((name + ".", child) for child in node.body)
            else:
                stack.extend((prefix, child) for child in ast.iter_child_nodes(node))


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


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Positional (and positional-only) plus keyword-only parameters of ``node``, without a leading
    ``self``/``cls``; ``*args`` and ``**kwargs`` do not count."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(args.kwonlyargs)


def _many_parameter_functions(root: Path, limit: int) -> dict[str, int]:
    """``{"path:qualified name": parameters}`` of the functions under ``root`` taking ``limit`` or more."""
    return {f"{path}:{name}": n for path, name, node in _functions(root) if (n := parameter_count(node)) >= limit}


def test_no_function_body_is_longer_than_a_screenful():
    """Issue 21 and 29: files a newcomer can read — no function body over ``MAX_BODY_LINES`` lines
    (a signature's options and a docstring do not count)."""
    assert _long_functions(SRC, MAX_BODY_LINES) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "fedtab"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES + 1))
    (pkg / "long.py").write_text(f'def f():\n    """doc"""\n{body}\n\n\ndef g():\n    """doc"""\n    return 1\n')
    assert _long_functions(pkg, MAX_BODY_LINES) == [f"long.py:f ({MAX_BODY_LINES + 1} lines)"]


def test_only_the_allowed_functions_take_ten_parameters_or_more():
    """Issue 29 item 5: at most five functions take :data:`MANY_PARAMETER_COUNT` parameters or more —
    exactly those of :data:`MANY_PARAMETERS` (an entry that no longer needs its place fails too)."""
    assert len(MANY_PARAMETERS) <= 5
    assert sorted(_many_parameter_functions(SRC, MANY_PARAMETER_COUNT)) == sorted(MANY_PARAMETERS)


def test_the_allowed_functions_exist_and_take_many_parameters():
    """The allowance names real functions, each still taking ten parameters or more."""
    found = _many_parameter_functions(SRC, MANY_PARAMETER_COUNT)
    assert set(MANY_PARAMETERS) <= set(found), sorted(set(MANY_PARAMETERS) - set(found))


def test_the_parameter_check_counts_positional_and_keyword_only_parameters(tmp_path):
    pkg = tmp_path / "fedtab"
    (pkg / "sub").mkdir(parents=True)
    nine = ", ".join(f"a{i}" for i in range(5)) + ", *, " + ", ".join(f"k{i}" for i in range(4))
    ten = nine + ", k4=0"
    (pkg / "sub" / "m.py").write_text(
        f"def nine({nine}, **options):\n    pass\n\n\n"
        f"def ten({ten}):\n    def inner(self, {nine}, extra):\n        pass\n\n\n"
        f"class C:\n    def __init__(self, {nine}):\n        pass\n\n"
        f"    @classmethod\n    def make(cls, {ten}, **kw):\n        pass\n\n"
        f"    def posonly(self, p0, p1, /, {nine}):\n        pass\n")
    assert _many_parameter_functions(pkg, MANY_PARAMETER_COUNT) == {
        "sub/m.py:ten": 10, "sub/m.py:ten.inner": 10, "sub/m.py:C.make": 10, "sub/m.py:C.posonly": 11}


# ----------------------------------------------------------------------------- import graph and circles
def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """``{module: {fedtab modules it imports}}`` over every module under :data:`SRC` — at run time
    (default) or under ``if TYPE_CHECKING:`` only. An imported name is resolved to the deepest module
    of the tree it names (``from .site import Site`` → ``….site``; ``from . import validate`` →
    ``….validate``; a name of a package's ``__init__`` → the package); a module's imports of itself
    are left out."""
    files = {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if (candidate := ".".join(parts[:k])) in files:
                return candidate
        return None

    def targets(name: str) -> set[str]:
        """The module ``name`` resolves to and, for a name a package resolves on first access
        (:func:`lazy_exports`), the module that defines it: that import runs it."""
        target = resolve(name)
        if target is None:
            return set()
        defined = lazy_exports(target, files[target]).get(name[len(target) + 1:])
        return {target} | ({resolve(defined)} - {None} if defined else set())

    graph = {}
    for module, path in files.items():
        names = _imports(path)[1 if type_only else 0]
        graph[module] = {target for name in names for target in targets(name) if target != module}
    return graph


@functools.lru_cache(maxsize=None)
def lazy_exports(module: str, path: Path) -> dict[str, str]:
    """``{name: absolute module}`` of a package whose ``__init__`` resolves its names on first access
    (PEP 562) from a literal ``_EXPORTS = {name: module}`` dict (``".server"``, ``"...learn.x"``, or a
    bare submodule name); ``{}`` for any other module."""
    if path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text(), str(path)).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS" and isinstance(node.value, ast.Dict):
            found = {}
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    rel = value.value if value.value.startswith(".") else "." + value.value
                    level = len(rel) - len(rel.lstrip("."))
                    base = module.split(".")
                    found[key.value] = ".".join([*base[:len(base) - (level - 1)], rel[level:]])
            return found
    return {}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return sorted(found, key=lambda c: (-len(c), sorted(c)))


def circle_imports(graph: dict[str, set[str]], circle: frozenset[str]) -> list[tuple[str, str]]:
    """The imports between two modules of ``circle``: each one lies on a circle (its target leads back)."""
    return sorted((a, b) for a in circle for b in graph[a] if b in circle)


def _describe(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    return f"{sorted(circle)}: " + ", ".join(f"{a} -> {b}" for a, b in circle_imports(graph, circle))


def test_no_new_import_circle():
    """Every circle of today's run-time graph lies inside a listed one and holds no more imports than
    listed: an import between two modules of a circle always closes a circle (the target leads back)."""
    graph = import_graph()
    problems = []
    for circle in circles(graph):
        listed = [(modules, n) for modules, n in CIRCLES if circle <= modules]
        if not listed:
            problems.append(f"new import circle {_describe(graph, circle)}")
        elif (n := len(circle_imports(graph, circle))) > listed[0][1]:
            problems.append(f"{n} imports inside a listed circle (at most {listed[0][1]}): {_describe(graph, circle)}")
    assert problems == [], "\n".join(problems)


def test_every_listed_circle_is_as_written():
    """The list only shrinks: a circle that lost a module or an import is written down as it is now."""
    graph = import_graph()
    now = {circle: len(circle_imports(graph, circle)) for circle in circles(graph)}
    stale = [f"{len(modules)} modules, {n} imports" for modules, n in CIRCLES if now.get(modules) != n]
    assert stale == [], f"listed circles that shrank or broke — write down today's: {stale}; today: " \
                        f"{[(sorted(c), n) for c, n in now.items()]}"


def test_the_circle_finder_sees_deferred_imports_and_leaves_type_only_ones_apart(tmp_path, monkeypatch):
    """An adversarial tree: a circle closed by an import inside a function, one closed only under
    ``if TYPE_CHECKING`` (no circle at run time, one type-only import), a package whose ``__init__``
    re-exports a module that imports the package back, and a module importing itself."""
    pkg = tmp_path / "tree"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .hub import thing\n")
    (pkg / "hub.py").write_text("import fedtab.tree.a\nthing = 1\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from .d import y\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import z\n")
    (pkg / "e.py").write_text("from fedtab.tree import thing\n")
    (pkg / "f.py").write_text("import fedtab.tree.f\nfrom . import e\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    graph = import_graph()
    assert circles(graph) == [frozenset({"fedtab.tree.a", "fedtab.tree.b"})]
    assert circle_imports(graph, frozenset({"fedtab.tree.a", "fedtab.tree.b"})) == [
        ("fedtab.tree.a", "fedtab.tree.b"), ("fedtab.tree.b", "fedtab.tree.a")]
    assert graph["fedtab.tree.e"] == {"fedtab.tree"} and graph["fedtab.tree"] == {"fedtab.tree.hub"}
    assert graph["fedtab.tree.f"] == {"fedtab.tree.e"}
    assert import_graph(type_only=True)["fedtab.tree.d"] == {"fedtab.tree.c"}
    (pkg / "hub.py").write_text("import fedtab.tree.e\nthing = 1\n")  # the package re-exports its importer
    assert circles(import_graph()) == [frozenset({"fedtab.tree", "fedtab.tree.e", "fedtab.tree.hub"}),
                                       frozenset({"fedtab.tree.a", "fedtab.tree.b"})]


def test_a_name_a_package_resolves_on_first_access_leads_to_the_module_defining_it(tmp_path, monkeypatch):
    """``from pkg import run`` where ``pkg/__init__`` maps ``run`` to ``.server`` in ``_EXPORTS``
    (PEP 562, :mod:`fedtab._lazy`) runs ``pkg.server``: an edge to it, so a circle through it is seen;
    ``pkg`` itself imports neither of its modules."""
    pkg = tmp_path / "lazy"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text(
        'from ..._lazy import lazy_exports\n_EXPORTS = {"run": ".server", "helper": "..util"}\n'
        "__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)\n")
    (pkg / "inner" / "server.py").write_text("from ..user import go\nrun = 1\n")
    (pkg / "inner" / "site.py").write_text("x = 1\n")
    (pkg / "util.py").write_text("helper = 1\n")
    (pkg / "user.py").write_text("from .inner import run, helper\ndef go():\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    graph = import_graph()
    assert graph["fedtab.lazy.inner"] == set()
    assert graph["fedtab.lazy.user"] == {"fedtab.lazy.inner", "fedtab.lazy.inner.server", "fedtab.lazy.util"}
    assert circles(graph) == [frozenset({"fedtab.lazy.inner.server", "fedtab.lazy.user"})]
