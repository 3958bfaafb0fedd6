"""Every code block of README.md, docs/*.md and benchmarks/README.md is checked, and every
relative link resolves. The rules (one per fence language) are stated at the top of
docs/README.md; this file implements exactly those rules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import os
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
LINKED_ONLY = [ROOT / "src" / "fedtab" / "engines" / "flower_app" / "README.md"]  # links checked, no blocks
KNOWN = {"python", "toml", "bash", "text"}
#: blocks that document a command not built yet: (page, text the block contains) -> reason. A pending
#: block must fail (xfail) and the test fails as soon as it passes, so the entry cannot outlive the gap.
PENDING: dict[tuple[str, str], str] = {}

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    mode: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page (indented fences inside lists included)."""
    out, lines = [], page.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group("indent"), m.group("info").split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{start}: unclosed code fence")
        out.append(Block(page, start, info[0] if info else "", info[1] if len(info) > 1 else "", "\n".join(body)))
        i += 1
    return out


# ----- links -----------------------------------------------------------------------------
def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]|\[|\]|\(.*?\)", lambda m: "" if m.group(0) in "`*[]" else m.group(0), heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    inside, anchors = False, set()
    for line in page.read_text().split("\n"):
        if FENCE.match(line) or line.strip() == "```":
            inside = not inside
        elif not inside and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _links(page: Path) -> list[tuple[int, str]]:
    inside, found = False, []
    for n, line in enumerate(page.read_text().split("\n"), 1):
        if FENCE.match(line) or line.strip() == "```":
            inside = not inside
            continue
        if inside:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z]+:", target):
                found.append((n, target))
    return found


@pytest.mark.parametrize("page", PAGES + LINKED_ONLY, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    bad = []
    for n, target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"line {n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"line {n}: {target} (no heading #{anchor} in {dest.name})")
    assert not bad, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(bad)


def test_the_slug_rule_matches_github():
    assert _slug(" Side by side with FLARE's own feature election") == "side-by-side-with-flares-own-feature-election"
    assert _slug(" a) FLASH protocol — `python -m benchmarks.flash`") == "a-flash-protocol--python--m-benchmarksflash"


# ----- bash rules ------------------------------------------------------------------------
def _command_lines(code: str) -> list[list[str]]:
    joined = re.sub(r"\\\n", " ", code)
    lines = [shlex.split(line, comments=True) for line in joined.split("\n")]
    # leading VAR=value assignments (FLWR_HOME=... flwr ...) set the environment, not the program
    return [argv for words in lines if (argv := list(itertools.dropwhile(_ASSIGNMENT.fullmatch, words)))]


_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=.*")


def _flags(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("-") and a != "-"]


def _click_target(group, args: list[str]):
    """Walk sub-commands of a click group; returns (command, remaining args)."""
    import click

    cmd, rest = group, list(args)
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(None, rest[0])
        if sub is None:
            raise AssertionError(f"unknown sub-command {rest[0]!r} (known: {sorted(cmd.list_commands(None))})")
        cmd, rest = sub, rest[1:]
    return cmd, rest


def _check_click(app, name: str, args: list[str]) -> None:
    import typer

    cmd, rest = _click_target(typer.main.get_command(app), args)
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [f for f in _flags(rest) if f not in known]
    assert not unknown, f"{name} {cmd.name}: unknown options {unknown} (known: {sorted(known)})"


def _argparse_options(parser) -> set[str]:
    return set(parser._option_string_actions)


def check_command(argv: list[str]) -> None:
    prog, args = argv[0], argv[1:]
    if prog == "fedtab":
        from fedtab.cli import app

        _check_click(app, "fedtab", args)
    elif prog == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        missing = [t for t in args if not t.startswith("-") and "=" not in t and t not in targets]
        assert not missing, f"make: no target {missing} in the Makefile"
    elif prog == "pip":
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        assert args[:1] == ["install"], f"only 'pip install' is documented, got {argv}"
        for spec in args[1:]:
            m = re.fullmatch(r"fedtab(?:\[([\w,-]+)\])?", spec)
            assert m, f"pip install: unexpected requirement {spec!r}"
            wanted = set(m.group(1).split(",")) if m.group(1) else set()
            assert wanted <= extras, f"pip install {spec}: unknown extras {wanted - extras}"
    elif prog == "python" and args[:1] == ["-m"]:
        module = args[1]
        assert module.startswith("benchmarks."), f"python -m {module}: only benchmarks are documented"
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"python -m {module}: no such module"
        source = Path(spec.origin).read_text()
        unknown = [f for f in _flags(args[2:]) if f'"{f}"' not in source]
        assert not unknown, f"python -m {module}: options {unknown} are not in its argument parser"
    elif prog == "flwr":
        from flwr.cli.app import app as flwr_app

        _check_click(flwr_app, "flwr", args)
    elif prog == "flower-superlink":
        from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

        unknown = set(_flags(args)) - _argparse_options(_parse_args_run_superlink())
        assert not unknown, f"flower-superlink: unknown options {unknown}"
    elif prog == "flower-supernode":
        from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

        unknown = set(_flags(args)) - _argparse_options(_parse_args_run_supernode())
        assert not unknown, f"flower-supernode: unknown options {unknown}"
    else:
        raise AssertionError(f"no rule for the program {prog!r} (extend tests/docs/test_docs.py and docs/README.md)")


# ----- python / toml rules ---------------------------------------------------------------
def check_imports(code: str, where: str) -> None:
    tree = ast.parse(code, where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            mod = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(mod, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")


def check_toml(code: str, where: str, workdir: Path) -> dict:
    doc = tomllib.loads(code)
    if "target" in doc and "sites" in doc:
        from fedtab.job import parse_job

        parse_job(doc, workdir, source=where)
    elif "min-sites" in doc or "job" in doc:  # a Flower run config: the engine's keys and the job plan
        from fedtab.engines.flower import RUN_CONFIG_KEYS
        from fedtab.job.spec import spec_from_plan

        unknown = set(doc) - set(RUN_CONFIG_KEYS)
        assert not unknown, f"{where}: run-config keys {sorted(unknown)} are not the Flower app's"
        if doc.get("job"):
            spec_from_plan(doc["job"], source=where)
    return doc


@pytest.fixture(scope="session")
def example_sites(tmp_path_factory):
    from fedtab.data.example_sites import write_heart_sites

    d = tmp_path_factory.mktemp("example_sites")
    write_heart_sites(d)
    return d


def _page_cases():
    for page in PAGES:
        yield pytest.param(page, id=str(page.relative_to(ROOT)))


@pytest.mark.parametrize("page", _page_cases())
def test_code_blocks(page, example_sites, tmp_path, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(example_sites, work)
    monkeypatch.chdir(work)
    namespace: dict = {"__name__": "__docs__"}
    for b in blocks(page):
        assert b.lang in KNOWN, f"{b.where}: unknown fence language {b.lang!r} (known: {sorted(KNOWN)})"
        if b.lang == "text":
            continue
        pending = next((why for (p, text), why in PENDING.items()
                        if p == str(page.relative_to(ROOT)) and text in b.code), None)
        try:
            run_block(b, work, namespace)
        except Exception as exc:
            if pending:
                pytest.xfail(f"{b.where}: {pending} ({type(exc).__name__}: {exc})")
            raise AssertionError(f"{b.where}: {type(exc).__name__}: {exc}") from exc
        if pending:
            pytest.fail(f"{b.where} passes now: remove it from PENDING in tests/docs/test_docs.py", pytrace=False)


def run_block(b: Block, work: Path, namespace: dict) -> None:
    if b.lang == "python":
        if b.mode == "no-run":
            compile(b.code, b.where, "exec")
            check_imports(b.code, b.where)
        else:
            assert b.mode == "", f"unknown python mode {b.mode!r}"
            exec(compile(b.code, b.where, "exec"), namespace)  # noqa: S102 - the docs' own examples
    elif b.lang == "toml":
        doc = check_toml(b.code, b.where, work)
        if "target" in doc and "sites" in doc:
            (work / "job.toml").write_text(b.code)
    elif b.lang == "bash":
        assert b.mode in ("", "run"), f"unknown bash mode {b.mode!r}"
        lines = _command_lines(b.code)
        for argv in lines:
            check_command(argv)
        if b.mode == "run":
            from typer.testing import CliRunner

            from fedtab.cli import app

            for argv in lines:
                assert argv[0] == "fedtab", f"'bash run' blocks run fedtab commands only, got {argv[0]!r}"
                res = CliRunner().invoke(app, argv[1:])
                assert res.exit_code == 0, f"{' '.join(argv)} exited {res.exit_code}: {res.output[-2000:]}"


def test_the_checker_catches_a_wrong_flag_and_an_unknown_program():
    with pytest.raises(AssertionError, match="unknown options"):
        check_command(["fedtab", "elect", "a.csv", "--target", "y", "--freedom", "0.5"])
    with pytest.raises(AssertionError, match="no rule"):
        check_command(["rm", "-rf", "/"])
    with pytest.raises(AssertionError, match="unknown extras"):
        check_command(["pip", "install", "fedtab[gpu]"])
    with pytest.raises(AssertionError, match="unknown options"):
        check_command(["flower-superlink", "--no-such-flag"])


def test_pages_exist_and_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text().split("\n")
    first_block = blocks(ROOT / "README.md")[0].code.split("\n")
    assert text[0] == "# fedtab" and first_block[0].startswith("make demo") and first_block[1].startswith("make test")
    for name in ("README", "job", "election", "imputation", "models", "deployment"):
        assert (ROOT / "docs" / f"{name}.md").is_file()
    assert os.path.getsize(ROOT / "benchmarks" / "README.md") > 10_000
