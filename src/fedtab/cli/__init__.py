"""The ``fedtab`` command (typer + rich): one module per command.

``app`` is the typer application (entry point ``fedtab.cli:app``); :func:`fail` ends a
command with a one-line error and exit code 2, never a traceback. Commands live in
``cli/<command>.py`` and are registered here, each with click's plain help (:class:`PlainHelp`:
every option name whole at 80 columns); a command whose optional extra is not installed is
simply absent. The long commands (:data:`LONG_COMMANDS`) get ``--quiet`` and ``--log-file``
and run inside :func:`command_output` (Ctrl-C: ``interrupted``, exit 130). Rich writes no
colour codes when its output is not a terminal. A command module imports its heavy
dependencies inside the command, so ``fedtab predict`` loads no torch or matplotlib.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator, Optional

import typer

if TYPE_CHECKING:
    import logging

    from rich.console import Console

__all__ = ["ENGINE_LOGGERS", "LONG_COMMANDS", "LazyConsole", "LogFileOption", "PlainHelp", "PlainHelpGroup", "QuietOption", "app", "command_output", "fail",
           "finite_number", "console", "err_console", "long_command", "outcome"]

class PlainHelp(typer.core.TyperCommand):
    """A command whose ``--help`` is click's plain two-column text: readable at 80 columns for a
    command with many options (rich's table leaves each option's help a narrow column)."""

    def format_help(self, ctx, formatter):  # noqa: ANN001, ANN201 - click's signature
        import click

        click.Command.format_help(self, ctx, formatter)
        # typer escapes "[default: ...]" for rich markup even when click renders the text
        formatter.buffer[:] = [part.replace("\\[", "[") for part in formatter.buffer]


class PlainHelpGroup(typer.core.TyperGroup):
    """``fedtab --help`` as click's plain text, like every command's (:class:`PlainHelp`): each
    command with the whole first paragraph of its help (click would cut it at the first sentence).

    Typer's rich help would import ``typer.rich_utils`` (rich's markdown, syntax highlighting and
    tracebacks): about 60 ms, most of what ``fedtab --help`` cost beyond typer itself."""

    def format_help(self, ctx, formatter):  # noqa: ANN001, ANN201 - click's signature
        import click

        click.Group.format_help(self, ctx, formatter)

    def format_commands(self, ctx, formatter):  # noqa: ANN001, ANN201 - click's signature
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = cmd.short_help or inspect.cleandoc(cmd.help or "").split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# never print local variables in a traceback: they hold the sites' rows
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False, cls=PlainHelpGroup,
                  help="Federated feature election, imputation and training for tabular data.")


class LazyConsole:
    """A rich ``Console(**options)`` made on first use; every attribute read or set goes to it.

    ``rich.console`` costs about 17 ms to import, which ``fedtab --help`` and a command's argument
    parsing do not need. The console writes to ``sys.stdout``/``sys.stderr`` as they are when it
    prints (rich's own behaviour), so making it later changes nothing a command prints."""

    def __init__(self, **options: Any) -> None:
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_console", None)

    def _real(self) -> "Console":
        made = self._console
        if made is None:
            from rich.console import Console

            made = Console(**self._options)
            object.__setattr__(self, "_console", made)
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real(), name, value)


console: "Console" = LazyConsole()  # type: ignore[assignment]
err_console: "Console" = LazyConsole(stderr=True)  # type: ignore[assignment]


#: set by the SIGINT handler of :func:`command_output`: an engine that catches the Ctrl-C itself
#: (FLARE's simulator returns -9) then fails with an error that is really the interruption
_interrupt = threading.Event()


def _on_sigint(signum: int, frame: object) -> None:
    _interrupt.set()
    signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as without this handler


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as a one-line error on stderr and exit with ``code`` -- or, after a
    Ctrl-C during the command, ``interrupted`` and 130 (whatever error the interruption caused)."""
    from rich.markup import escape

    if _interrupt.is_set():
        err_console.print("interrupted", style="bold red", highlight=False)
        raise typer.Exit(130)
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


#: loggers of the engines and of fedtab: to the log file with ``--log-file``, warnings only with ``--quiet``
ENGINE_LOGGERS = ("flwr", "nvflare", "fedtab")

QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the outcome (run id, where the "
                                           "outputs are), warnings and errors: no progress lines.")]
LogFileOption = Annotated[Optional[Path], typer.Option(help="Append fedtab's and the engine's logs to this file "
                                                       "(plain text, no colour codes).")]


def outcome(message: str) -> None:
    """Print a command's outcome line on stdout, also under ``--quiet``."""
    quiet, console.quiet = console.quiet, False
    try:
        console.print(message, highlight=False, markup=False, soft_wrap=True)
    finally:
        console.quiet = quiet


def _guard_new_handlers(logger: logging.Logger, to_file: bool, plain: bool) -> None:
    """What a library adds to ``logger`` while the command runs (Flower adds its console handler
    when it is first imported, inside the run): nothing with ``--log-file`` (the file handler
    stays the only one), a handler without colour codes when stderr is not a terminal.
    An instance attribute over ``Logger.addHandler``; ``del logger.addHandler`` undoes it."""
    add = logger.addHandler

    def guarded(handler: logging.Handler) -> None:
        if to_file:
            return
        if plain and hasattr(handler, "colored"):  # flwr's ConsoleHandler
            handler.colored = False
        add(handler)

    logger.addHandler = guarded  # type: ignore[method-assign]


@contextmanager
def command_output(quiet: bool = False, log_file: Path | None = None) -> Iterator[None]:
    """What a long command prints and where its logs go, and what Ctrl-C does, while it runs.

    * ``quiet``: stdout holds only :func:`outcome` lines (errors and warnings go to stderr);
    * ``log_file``: the records of :data:`ENGINE_LOGGERS` (INFO and up) and of the root logger
      are appended to it, plain text, and not printed -- also those of a library that sets up
      its logger only when the run imports it (Flower); without it, ``quiet`` keeps those
      loggers to warnings, and their console handlers write no colour codes when stderr is not
      a terminal;
    * Ctrl-C (``KeyboardInterrupt``) anywhere ends the command with ``interrupted`` on stderr
      and exit code 130, blaming nobody; outputs written before it stay as they were.

    Everything changed is restored on exit (the tests run several commands in one process).
    """
    import logging

    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in ENGINE_LOGGERS)]
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    saved_quiet = console.quiet
    handler = None
    _interrupt.clear()
    main = threading.current_thread() is threading.main_thread()
    saved_sigint = signal.signal(signal.SIGINT, _on_sigint) if main else None
    try:
        if log_file is not None:
            try:
                log_file.parent.mkdir(parents=True, exist_ok=True)
                handler = logging.FileHandler(log_file, encoding="utf-8")
            except OSError as exc:
                fail(f"cannot write the log file {log_file}: {exc}")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            for lg in loggers:
                lg.handlers = [handler]
                lg.setLevel(logging.INFO)
                lg.propagate = False
        elif quiet:
            for lg in loggers[1:]:
                lg.setLevel(logging.WARNING)
        plain = not err_console.is_terminal
        for lg in loggers[1:]:
            for h in lg.handlers:
                if plain and hasattr(h, "colored"):
                    h.colored = False
            _guard_new_handlers(lg, log_file is not None, plain)
        console.quiet = quiet or saved_quiet
        yield
    except KeyboardInterrupt:
        console.quiet = False
        err_console.print("interrupted", style="bold red", highlight=False)
        raise typer.Exit(130) from None
    finally:
        if main:
            signal.signal(signal.SIGINT, saved_sigint if saved_sigint is not None else signal.default_int_handler)
        console.quiet = saved_quiet
        for lg, level, handlers, propagate in saved:
            lg.__dict__.pop("addHandler", None)
            if handler is not None:  # replaced for the log file; otherwise keep what a library added
                lg.handlers, lg.propagate = handlers, propagate
            lg.setLevel(level)
        if handler is not None:
            handler.close()


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


#: commands that run a federation: each has ``--quiet`` and ``--log-file`` and runs in :func:`command_output`
LONG_COMMANDS = ("demo", "elect", "impute", "run")


def long_command(fn):  # noqa: ANN001, ANN201 - any command function
    """``fn`` run inside :func:`command_output`, with ``--quiet`` and ``--log-file`` options added
    unless it declares ``quiet`` / ``log_file`` parameters itself (then it receives them too)."""
    sig = inspect.signature(fn, eval_str=True)
    own = set(sig.parameters)
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
             for name, default, annotation in (("quiet", False, QuietOption), ("log_file", None, LogFileOption))
             if name not in own]

    @functools.wraps(fn)
    def command(**kwargs):  # noqa: ANN003, ANN202
        quiet = kwargs["quiet"] if "quiet" in own else kwargs.pop("quiet", False)
        log_file = kwargs["log_file"] if "log_file" in own else kwargs.pop("log_file", None)
        with command_output(quiet, log_file):
            return fn(**kwargs)

    command.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *added])
    return command


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
        fn = getattr(mod, function)
        settings = {"cls": PlainHelp, **getattr(mod, "COMMAND_SETTINGS", {})}  # every option name whole at 80 columns
        app.command(name, **settings)(long_command(fn) if name in LONG_COMMANDS else fn)


_register_commands()
