"""``fedtab attach RUN_ID JOB.toml --superlink HOST:PORT``: wait for a submitted Flower run, write its outputs.

``fedtab run --superlink`` prints the run id as soon as the run is submitted; if that
command was interrupted, timed out on this side, or ran on another machine, ``attach``
follows the same run (its progress lines included) and writes ``model.fedtab``,
``result.json`` and ``report.html`` as ``fedtab run`` would have. The job file is the one
the run was submitted with (it names the sites and the outputs); nothing is submitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import PlainHelp, console, fail

__all__ = ["attach_command"]

COMMAND_SETTINGS = {"cls": PlainHelp}


def attach_command(
    run_id: Annotated[int, typer.Argument(min=1, help="The Flower run id that fedtab run printed.")],
    job: Annotated[Path, typer.Argument(help="The job file the run was submitted with.")],
    superlink: Annotated[str, typer.Option(help="HOST:PORT of the SuperLink the run was submitted to.")],
    root_certificates: Annotated[Optional[Path], typer.Option(help="The consortium's CA certificate (ca.pem of "
                                                              "fedtab deploy).")] = None,
    insecure: Annotated[bool, typer.Option(help="The SuperLink runs without TLS (Flower's --insecure).")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: the job's [run] out).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait; the run is stopped on the SuperLink "
                                                       "after that.")] = 3600.0,
) -> None:
    """Wait for a Flower run submitted earlier and write its model, result.json and report.html."""
    from ..engines.errors import RunError
    from ..federation.protocol import FederationError
    from ..job import JobError
    from ..job.run import run_job
    from .run import step_reporter

    say, close = step_reporter()
    try:
        result = run_job(job, engine="flower", out=out, progress=say, superlink=superlink,
                         root_certificates=root_certificates, insecure=insecure, timeout=timeout, attach=run_id)
    except (JobError, FederationError, RunError, ValueError, OSError) as exc:
        close()
        fail(str(exc))
        return
    close()
    where = Path(out) if out is not None else Path(result["job"]["run"]["out"])
    console.print(f"wrote {', '.join(str(where / f) for f in result['artifacts'].values())}", highlight=False)
