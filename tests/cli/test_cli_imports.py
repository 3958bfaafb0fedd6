"""``fedtab --help`` starts fast: importing the command line loads no numerical library.

Every command module imports numpy, pandas, torch (and the rest) inside its command function;
``fedtab --help`` renders click's plain text, so it loads neither typer's rich help (rich's
markdown, syntax highlighting, tracebacks) nor rich's console. Checked in a fresh interpreter
through ``sys.modules`` (not by timing).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "sklearn", "torch", "torch_geometric", "matplotlib", "flwr", "nvflare")
#: what ``fedtab --help`` needs no more than ``import typer`` does
HELP_EXTRA = ("typer.rich_utils", "rich.console", "rich.markdown", "rich.table", "rich.traceback", "logging")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _loaded(code: str, watch: tuple[str, ...] = HEAVY) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {watch!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_library():
    assert _loaded("import fedtab.cli") == []


def test_fedtab_help_loads_no_heavy_library():
    code = ("from typer.testing import CliRunner\nfrom fedtab.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0 and 'predict' in r.output, r.output")
    assert _loaded(code) == []


def test_fedtab_help_loads_neither_rich_help_nor_rich_console():
    code = ("from typer.testing import CliRunner\nfrom fedtab.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0 and 'predict' in r.output, r.output")
    assert _loaded(code, HELP_EXTRA) == []


def test_fedtab_help_lists_every_command_with_its_help_and_every_option():
    """The plain group help loses nothing typer's rich help showed: each command with the whole
    first paragraph of its help (not cut at the first sentence), and the group's options."""
    import typer
    from typer.testing import CliRunner

    from fedtab.cli import app

    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    group = typer.main.get_command(app)
    assert len(group.commands) >= 8
    for name, cmd in group.commands.items():
        first = " ".join((cmd.help or "").split("\n\n")[0].split())
        assert first and f"{name} {first}" in flat, (name, first)
    for opt in ("--version", "--help"):
        assert opt in res.output
    assert max(map(len, res.output.splitlines())) <= 80


def test_a_lazy_console_prints_where_stdout_is_when_it_prints(capsys):
    """The console made on first use writes to the stream of that moment, and a setting made
    through the proxy (``--quiet``) reaches the real console."""
    from fedtab.cli import LazyConsole

    out = LazyConsole()
    out.print("first", highlight=False)
    assert capsys.readouterr().out == "first\n"
    out.quiet = True
    out.print("hidden")
    assert capsys.readouterr().out == "" and out.quiet is True
    err = LazyConsole(stderr=True)
    err.print("to stderr", highlight=False)
    assert capsys.readouterr().err == "to stderr\n"


def test_the_probe_sees_a_heavy_import():
    """The check itself: a module that does load pandas is reported."""
    assert "pandas" in _loaded("import fedtab.cli\nimport pandas")
