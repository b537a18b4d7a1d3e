"""The ``detprof`` command line.

Commands are thin: they parse options, call the analyses and hand the results to a
renderer. A command line imports only the module of the command it runs (all of them only
for ``detprof --help`` or a command detprof does not know), and the analyses load what they
need inside the command, so ``detprof parse`` of a SQLite or CSV trace does not pay for the
sweep's, the report's or TensorFlow's imports. ``main`` is the one place that turns a
``DetprofError`` into a single line on stderr and its exit code.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import os
import sys
from collections.abc import Iterable
from enum import Enum
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import TyperPath

from detprof import interrupts, invocation, locks, study_kinds
from detprof.errors import DetprofError, ExitCode, environment_failure
from detprof.study_kinds import Command

# Help reads like any other command line's: "--top INTEGER", "--format [table|json|csv]",
# "Usage: detprof report [OPTIONS] RESULTS_DIRS...". Typer's own rendering (rich panels or
# plain) labels every value with a Python type in angle brackets (``--top <int range>``,
# ``<str>``) and every required argument in braces, so the plain renderer is used and
# ``HelpCommand`` names values the way Click always has, from the Click type Typer gave each
# parameter (an option without a metavar of its own gets one when help is shown; flags get
# none). It works from the parameters Typer built off each command's signature, so commands
# whose options come from ``options.with_run_options`` read the same as the others.
_METAVARS_BY_TYPE_NAME = {
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "FLOAT",
    "float range": "FLOAT",
    "boolean": "BOOLEAN",
    "str": "TEXT",
    "text": "TEXT",
    "file": "FILE",
    "filename": "FILE",
    "directory": "DIRECTORY",
    "path": "PATH",
}


def _value_metavar(param: TyperArgument | TyperOption) -> str:
    """The Click-style name of what a parameter takes: INTEGER, PATH, [a|b|c], ..."""
    choices = getattr(param.type, "choices", None)
    if choices:
        return f"[{'|'.join(str(c.value) if isinstance(c, Enum) else str(c) for c in choices)}]"
    return _METAVARS_BY_TYPE_NAME.get(param.type.name, "VALUE")


def _argument_name(param: TyperArgument) -> str:
    """``TRACE``, or ``RESULTS_DIRS...`` for an argument that takes several values."""
    name = (param.name or "").upper()
    return f"{name}..." if param.nargs != 1 else name


class _NamedPath(TyperPath):
    """A path parameter that refuses an empty value: ``Path("")`` reads as ``.``, so ``-o "$REPORT"`` with the
    variable unset would write into the current folder (or fail there with the machine's words)."""

    @classmethod
    def of(cls, path: TyperPath) -> _NamedPath:
        """The same path type (its checks as Typer built them off the annotation) that also refuses an empty value."""
        named = copy.copy(path)
        named.__class__ = cls
        return named

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value == "":
            raise typer.BadParameter("is empty: name a file or folder (a shell variable that was not set?)", ctx, param)
        return super().convert(value, param, ctx)


class HelpCommand(TyperCommand):
    """A Typer command whose ``--help`` and usage line name values the way Click does, and whose paths are never
    empty."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param.type, TyperPath):
                param.type = _NamedPath.of(param.type)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = _argument_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            if isinstance(param, TyperArgument):
                extra = "  [required]" if param.required else ""
                arguments.append((_argument_name(param), f"{param.help or ''}{extra}"))
            elif isinstance(param, TyperOption):
                if param.metavar is None and not param.is_flag and not param.count:
                    param.metavar = _value_metavar(param)
                record = param.get_help_record(ctx)
                if record is not None:
                    options.append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        if options:
            with formatter.section("Options"):
                formatter.write_dl(options)


def _print_version(value: bool) -> None:
    if value:
        from detprof import __version__

        typer.echo(f"detprof {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print detprof's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    """Options of ``detprof`` itself; ``--version`` is eager, so it answers before any command is parsed."""


_FIXED: dict[str, Command] = {
    "parse": Command(
        "detprof.traces.command",
        "parse",
        "Parse a kernel trace (nsys, nvprof, TensorFlow profiler, PyTorch profiler JSON) and show its top kernels.",
        "PARSE_DETAILS",
    ),
    "diff": Command(
        "detprof.traces.command",
        "diff",
        "Compare two traces kernel by kernel: what was added, removed, slowed down.",
        "DIFF_DETAILS",
    ),
    "models": Command("detprof.models.command", "models", "List the models detprof can profile."),
    "gpus": Command("detprof.profiler.command", "gpus", "List the NVIDIA GPUs that NVML sees."),
    "knobs": Command(
        "detprof.sweep.knobs_command",
        "knobs",
        "List a backend's determinism knobs (what sweep --knobs prices): how each is set and what it does.",
    ),
    "report": Command(
        "detprof.reports.command",
        "report",
        "Write one self-contained HTML (or Markdown, or JSON) report from sweep, kernels and stability results.",
    ),
    "baseline": Command(
        "detprof.check.command", "baseline", "Freeze a sweep's per-repeat overheads as the CI baseline (JSON)."
    ),
    "check": Command(
        "detprof.check.command",
        "check",
        "Compare each model's determinism overhead with a baseline; fail on a regression.",
        "CHECK_DETAILS",
    ),
    "gpu-study": Command(
        "detprof.gpu_study.command",
        "gpu_study",
        "Measure the whole answer on a lent GPU within a time budget: overhead (the paper's medium CNN and a GPT "
        "first), the knob study, what determinism buys, verify; --resume continues in the next window.",
    ),
    "doctor": Command(
        "detprof.doctor.command",
        "doctor",
        "Check that this machine is ready to measure: the GPU (NVML), driver and CUDA, nsys, each Keras backend, "
        "its determinism switch, and a 5-step smoke run that must be traced. Exit 0 ready, 1 not.",
    ),
}
"""The commands that run no study kind of their own (``study_kinds`` holds those)."""
_TOOLS = ("parse", "diff", "models", "gpus")
"""The commands ``detprof --help`` lists before the study kinds': reading traces, the models, the GPUs."""


def _commands() -> dict[str, Command]:
    """Every command, in the order ``detprof --help`` lists them: the tools, each study kind's, then the rest."""
    tools = {name: command for name, command in _FIXED.items() if name in _TOOLS}
    rest = {name: command for name, command in _FIXED.items() if name not in _TOOLS}
    return tools | study_kinds.commands() | rest


class _CommandTable(TyperGroup):
    """``detprof`` itself: every command of ``_commands()`` is known by name and summary, and only those added
    (the one a command line runs) are imported.

    ``detprof --help``, ``--version`` and a command detprof does not know import no command module: the
    listing is the table's summaries, wrapped and cut as Click cuts a command's help.
    """

    def list_commands(self, ctx: Any) -> list[str]:
        return list(_commands())

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each command's summary, cut to the width as Click cuts a command's help."""
        table = _commands()
        limit = formatter.width - 6 - max(len(name) for name in table)
        rows = [(name, TyperCommand(name, help=spec.summary).get_short_help_str(limit)) for name, spec in table.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """As Click's, suggesting the table's names for a command detprof does not know (none is imported then)."""
        word = args[0] if args else ""
        table = _commands()
        close = [] if word.startswith("-") else difflib.get_close_matches(word, table)
        if word not in table and close:
            ctx.fail(f"No such command {word!r}. Did you mean {', '.join(repr(name) for name in close)}?")
        return super().resolve_command(ctx, args)


def command_names() -> list[str]:
    """Every command, in the order ``detprof --help`` lists them (the documentation's reference follows it)."""
    return list(_commands())


def build_app(commands: Iterable[str] = ()) -> typer.Typer:
    """The ``detprof`` application, with ``commands`` (each imported) added to the table's names.

    The root callback keeps it a group however few commands it has, so ``detprof parse
    ...`` parses, and its help reads, exactly as with all of them.
    """
    app = typer.Typer(
        name="detprof",
        cls=_CommandTable,
        help="What deterministic training costs on your GPU, where the cost comes from, and what it buys.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=None,
        # Click wraps help at 80 columns whatever the terminal; a wider one shows whole command summaries.
        context_settings={"max_content_width": 120},
    )
    app.callback()(_root)
    for name in commands:
        spec = _commands()[name]
        module = importlib.import_module(spec.module)
        app.command(name, help=spec.help(module), cls=HelpCommand)(getattr(module, spec.function))
    return app


def _commands_for(args: list[str]) -> list[str]:
    """The command a command line runs, or none (help, the version, or a command detprof does not know).

    ``detprof`` itself takes only flags (``--help``, ``--version``), so the first word that
    is not an option names the command.
    """
    word = next((a for a in args if not a.startswith("-")), None)
    return [word] if word in _commands() else []


OPTIONAL_VALUES = {"--knobs": "all"}
"""Options whose value may be left out, and the value that stands for it: ``sweep --knobs`` alone studies every
knob, ``--knobs A,B`` some. Typer parses an option's value as the next word whatever it is, so the value left out
is written in before parsing."""


def with_optional_values(args: list[str]) -> list[str]:
    """``args`` with each option of ``OPTIONAL_VALUES`` given a value where the next word is none (another option,
    or the end)."""
    out = []
    for index, word in enumerate(args):
        out.append(word)
        following = args[index + 1] if index + 1 < len(args) else None
        if word in OPTIONAL_VALUES and (following is None or following.startswith("-")):
            out.append(OPTIONAL_VALUES[word])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every expected failure is one line on stderr and a documented exit code.

    SIGTERM (a scheduler's preemption, ``systemctl stop``) ends a command as Ctrl-C does:
    workers stopped, completed runs kept, the resume line. Every lock the command took is given
    back however it ends (``locks``).
    """
    args = sys.argv[1:] if argv is None else argv
    invocation.remember(args)
    args = with_optional_values(args)
    try:
        with interrupts.handled():
            return _run(args)
    finally:
        locks.release_all()


def _run(args: list[str]) -> int:
    try:
        app = build_app(_commands_for(args))
        code = app(args=args, prog_name="detprof", standalone_mode=False)
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message())
            return ExitCode.OK
        typer.echo(f"detprof: error: {exc.format_message()}", err=True)
        return ExitCode.USAGE
    except typer.Abort:
        typer.echo("detprof: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except DetprofError as exc:
        typer.echo(f"detprof: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt as stop:
        if interrupts.terminated(stop):
            typer.echo("detprof: terminated (SIGTERM)", err=True)
            return ExitCode.TERMINATED
        typer.echo("detprof: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except OSError as exc:
        failure = environment_failure(exc)
        if failure is None:
            return _internal(exc)
        typer.echo(f"detprof: error: {failure}", err=True)
        return failure.exit_code
    except Exception as exc:
        return _internal(exc)
    return code if isinstance(code, int) else ExitCode.OK


def _internal(exc: Exception) -> int:
    """A bug: one line, unless ``DETPROF_DEBUG`` asks for the traceback."""
    if os.environ.get("DETPROF_DEBUG"):
        raise exc
    typer.echo(f"detprof: internal error: {type(exc).__name__}: {exc} (DETPROF_DEBUG=1 shows the traceback)", err=True)
    return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
