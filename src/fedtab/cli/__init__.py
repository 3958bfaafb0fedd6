"""The ``fedtab`` command (typer + rich): one module per command.

``app`` is the typer application (entry point ``fedtab.cli:app``); :func:`fail` ends a
command with a one-line error and exit code 2, never a traceback. Commands live in
``cli/<command>.py`` and are registered here; a command whose optional extra is not
installed (``impute`` needs torch) is simply absent.
"""

from __future__ import annotations

import importlib
import math
from typing import Annotated, Optional

import typer
from rich.console import Console

__all__ = ["PlainHelp", "app", "fail", "finite_number", "console", "err_console"]

# never print local variables in a traceback: they hold the sites' rows
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Federated feature election, imputation and training for tabular data.")
console = Console()
err_console = Console(stderr=True)


class PlainHelp(typer.core.TyperCommand):
    """A command whose ``--help`` is click's plain two-column text: readable at 80 columns for a
    command with many options (rich's table leaves each option's help a narrow column)."""

    def format_help(self, ctx, formatter):  # noqa: ANN001, ANN201 - click's signature
        import click

        click.Command.format_help(self, ctx, formatter)
        # typer escapes "[default: ...]" for rich markup even when click renders the text
        formatter.buffer[:] = [part.replace("\\[", "[") for part in formatter.buffer]


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as a one-line error on stderr and exit with ``code``."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def finite_number(value: float | None) -> float | None:
    """typer callback: refuse NaN/inf at parse time (click's ranges let NaN through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        console.print(f"fedtab {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the fedtab version and exit.")] = None,
) -> None:
    """fedtab: prepare and train on tables that stay at their sites."""


#: (module, function, command name); a module whose import fails with ImportError (missing extra) is skipped
_COMMANDS = [
    ("demo", "demo_command", "demo"),
    ("elect", "elect_command", "elect"),
    ("impute", "impute_command", "impute"),
    ("deploy", "deploy_command", "deploy"),
    ("run", "run_command", "run"),
    ("attach", "attach_command", "attach"),
    ("predict", "predict_command", "predict"),
    ("export", "export_command", "export"),
]


def _register_commands() -> None:
    for module, function, name in _COMMANDS:
        try:
            mod = importlib.import_module(f"{__name__}.{module}")
        except ImportError:
            continue
        app.command(name, **getattr(mod, "COMMAND_SETTINGS", {}))(getattr(mod, function))


_register_commands()
