"""The ``packdata`` command: thin wrappers that parse, call the library and print. This module
holds what every command shares; each command group is a module of its own."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

import typer
from rich.console import Console
from rich.markup import escape

from packdata import interrupts

app = typer.Typer(
    help="Pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True, soft_wrap=True)


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
