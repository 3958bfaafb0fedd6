"""The server app a run configuration names (issue 29 item 3): the job hands the engine what its server
runs, by a name the job's side writes; the engine imports nothing of the job and runs no other function."""

from __future__ import annotations

import sys

import pytest

from fedtab.engines.local import LocalFederation
from fedtab.engines.server_apps import SERVER_APP_KEY, load_server_app, server_app, workflow_app
from fedtab.federation.protocol import FederationError
from fedtab.federation.site.core import Site
from fedtab.job.apps import SERVER_APP, engine_config
from fedtab.job.apps import server_app as job_server_app


def test_the_job_writes_its_server_app_and_plan_into_the_run_config(jobs):
    plan = jobs.plan(training={"rounds": 1, "local_epochs": 1})
    cfg = engine_config(plan, **{"min-sites": 3})
    assert cfg[SERVER_APP_KEY] == "fedtab.job.apps:server_app" == SERVER_APP
    assert cfg["min-sites"] == 3 and isinstance(cfg["job"], str)
    assert load_server_app(cfg[SERVER_APP_KEY]) is job_server_app


def test_the_engines_server_side_imports_no_job_until_a_run_config_names_it():
    """At run time too (the static check is tests/test_layering.py): a fresh process importing the
    Flower ServerApp and the FLARE controller has no ``fedtab.job`` module; loading the name the
    job's side wrote imports it."""
    import importlib.util
    import subprocess

    engines = [m for m in ("flower", "nvflare") if importlib.util.find_spec({"flower": "flwr"}.get(m, m))]
    code = ("import sys\n"
            + "".join(f"import fedtab.engines.{m}\n" for m in engines)
            + "from fedtab.engines.server_apps import load_server_app\n"
            "before = sorted(m for m in sys.modules if m.startswith('fedtab.job'))\n"
            "load_server_app('fedtab.job.apps:server_app')\n"
            "print(before, 'fedtab.job.apps' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[] True"


@pytest.mark.parametrize("name, why", [
    (None, "is missing"), ("", "is missing"), (7, "must be"), ("os:system", "must be"),
    ("builtins:eval", "must be"), ("fedtab.__main__:main", "must be"), ("fedtab.job._x:f", "must be"),
    ("fedtab.job.apps:_private", "must be"), ("fedtab.job.apps", "must be"), ("fedtab.job.apps:server_app()", "must be"),
    ("fedtab." + "a." * 120 + "b:f", "must be"), ("fedtab.no_such_module:app", "cannot import"),
    ("fedtab.job.apps:engine_config", "is not a server app"), ("fedtab.job.workflow:engine_workflow", "is not a server app"),
    ("fedtab.job.apps:SERVER_APP", "is not a server app"), ("fedtab.job.apps:nothing", "is not a server app"),
])
def test_a_name_that_is_no_declared_fedtab_server_app_is_refused_in_one_line(name, why):
    """A run configuration chooses the name: nothing outside ``fedtab.``, no private or ``__main__``
    module (importing it would run the CLI), and only a function declared a server app — the job's
    step loop itself has the right signature but is not declared, so it is refused too."""
    with pytest.raises(FederationError, match=f"run config 'server-app'.*{why}") as info:
        load_server_app(name)
    assert "\n" not in str(info.value)


def _sites() -> list[Site]:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    return [Site(f"s{i}", pd.DataFrame({"a": rng.normal(size=40), "y": [0, 1] * 20}), "y") for i in range(2)]


def test_a_declared_app_and_a_wrapped_workflow_get_the_federation_and_the_run_config():
    seen = []

    @server_app
    def app(federation, run_config, emit=None):
        seen.append((sorted(federation.sites), dict(run_config), emit))
        return {"ok": 1}

    fed = LocalFederation(_sites())
    assert app(fed, {"k": "v"}) == {"ok": 1} and seen == [(["s0", "s1"], {"k": "v"}, None)]
    lines: list[str] = []
    wrapped = workflow_app(lambda federation, run_config: {"sites": federation.sites, **run_config})
    assert wrapped(fed, {"k": 2}, lines.append) == {"sites": ["s0", "s1"], "k": 2}
    fed.on_exchange("describe", 2, 2)  # the wrapper wired the progress log to the federation's hook
    assert len(lines) == 1 and '"kind": "describe"' in lines[0]
