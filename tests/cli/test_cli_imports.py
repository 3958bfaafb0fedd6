"""``fedtab --help`` starts fast: importing the command line loads no numerical library.

Every command module imports numpy, pandas, torch (and the rest) inside its command function;
checked in a fresh interpreter through ``sys.modules`` (not by timing).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "sklearn", "torch", "torch_geometric", "matplotlib", "flwr", "nvflare")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _loaded(code: str) -> list[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_library():
    assert _loaded("import fedtab.cli") == []


def test_fedtab_help_loads_no_heavy_library():
    code = ("from typer.testing import CliRunner\nfrom fedtab.cli import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0 and 'predict' in r.output, r.output")
    assert _loaded(code) == []


def test_the_probe_sees_a_heavy_import():
    """The check itself: a module that does load pandas is reported."""
    assert "pandas" in _loaded("import fedtab.cli\nimport pandas")
