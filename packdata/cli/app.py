"""The ``packdata`` command: thin wrappers that parse, call the library and print. This module
holds what every command shares; each command group is a module of its own."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from packdata import interrupts


class Command(TyperCommand):
    """A command whose usage line names its arguments as the help does: ``SRC DST`` (typer
    writes required arguments as ``{src} {dst}``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.short_help is None and self.help:  # one line in `packdata --help`'s list
            self.short_help = " ".join(inspect.cleandoc(self.help).split("\n\n")[0].split())

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [p[1:-1].upper() if p.startswith("{") and p.endswith("}") else p
                for p in super().collect_usage_pieces(ctx)]


#: commands built only when they run or their help is asked: name → (stand-in, build)
_LATER: dict[str, tuple[Any, Callable[[], Any]]] = {}


def later(name: str, short_help: str, build: Callable[[], Any]) -> None:
    """Register command ``name``, built by ``build()`` (a click command) when it runs; until
    then ``packdata --help`` lists it with ``short_help`` (convert's flags come from every
    sample kind's OPTIONS: importing every kind's module, with numpy and Pillow, which a plain
    ``--help`` need not pay)."""
    stand_in = typer.Typer(add_completion=False)
    stand_in.command(name, help=short_help)(lambda: None)
    _LATER[name] = (typer.main.get_command(stand_in), build)


class Commands(TyperGroup):
    """The ``packdata`` group: commands registered with :func:`later` come first, as stand-ins
    until one of them is resolved to run (its own ``--help`` included)."""

    def __init__(self, *, commands: Any = None, **attrs: Any) -> None:
        listed = dict(commands or {}) if not isinstance(commands, (list, tuple)) else \
            {c.name: c for c in commands}
        super().__init__(commands={**{n: c for n, (c, _) in _LATER.items()}, **listed},
                         **attrs)

    def loaded(self, name: str) -> Any:
        """Command ``name``, built now if it is still a stand-in."""
        if name in _LATER and self.commands.get(name) is _LATER[name][0]:
            self.commands[name] = _LATER[name][1]()
        return self.commands.get(name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args:
            self.loaded(args[0])
        return super().resolve_command(ctx, args)


app = typer.Typer(
    help="Pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=Commands,
)
console = Console(stderr=True, soft_wrap=True)

#: ``--json FILE``: a command that reports also writes its results there
JsonFile = Annotated[Path | None, typer.Option("--json", help="Also write the results as JSON.")]
#: ``--json``: a command prints JSON instead of its text
JsonPrint = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def choices(name: str, values: Iterable[str]) -> type[Enum]:
    """A typer choice type over values the library defines (each set has one home there)."""
    return Enum(name, {value: value for value in values}, type=str)


def fail(exc: Exception) -> None:
    """Print ``exc`` as one ``error:`` line and exit with status 2."""
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    raise typer.Exit(2)


_announced = False  # whether the command said it was interrupted, and how


def interrupted(what: str) -> None:
    """Say the command was interrupted and what that left; exit with status 130."""
    global _announced
    _announced = True
    console.print(f"[red]interrupted:[/red] {escape(what)}", highlight=False)
    raise typer.Exit(130)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` for the command line: one ``warning:`` line."""
    console.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False)


def run(args: list[str] | None = None) -> int:
    """Run the command line; its exit status. Ctrl-C anywhere is one line and status 130 (see
    :mod:`packdata.interrupts`, installed by ``packdata.__main__`` before this module loads)."""
    try:
        app(args, prog_name="packdata")  # standalone: usage errors shown, ends in SystemExit
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    if interrupts.received() and not _announced:  # typer turns KeyboardInterrupt into a silent 130
        console.print("[red]interrupted[/red]", highlight=False)
        status = 130
    return status
