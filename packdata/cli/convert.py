"""``packdata convert``: its flags follow the sample kinds' and the container writers'
``OPTIONS`` tables (one flag per option, generated), so the command line cannot drift from the
library."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from enum import Enum
from inspect import Parameter, signature
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from packdata import containers, interrupts, sources
from packdata.cli.app import Command, choices, console, fail, interrupted, later, show_warning
from packdata.containers import CONTAINERS
from packdata.conversion.engines import ENGINES
from packdata.conversion.job import ON_ERROR
from packdata.errors import InputWarning, PackdataError
from packdata.options import Option
from packdata.sources import KINDS

ContainerName = choices("ContainerName", CONTAINERS)
Engine = choices("Engine", ENGINES)
Kind = choices("Kind", KINDS)
OnError = choices("OnError", ON_ERROR)


def _container_options() -> dict[str, list[tuple[str, Option]]]:
    """The writers' options that have a flag, by name, with the containers declaring each."""
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for name in CONTAINERS:
        for option in containers.get(name).WRITER.OPTIONS:
            if option.on_command_line:
                by_name.setdefault(option.name, []).append((name, option))
    return by_name


def _source_options() -> dict[str, list[tuple[str, Option]]]:
    """Every kind's options, by name, with the kinds declaring each."""
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for kind in KINDS:
        for option in sources.get(kind).OPTIONS:
            by_name.setdefault(option.name, []).append((kind, option))
    return by_name


def _flags(by_name: dict[str, list[tuple[str, Option]]]) -> list[Parameter]:
    """One ``packdata convert`` flag per option (an option several kinds or containers share,
    such as --labels or --dtype, is one flag)."""
    params = []
    for name, declared in by_name.items():
        first_kind = {o: kind for kind, o in reversed(declared)}  # kinds sharing one: one help
        options = list(first_kind)
        helps = [("" if len(options) == 1 else f"{first_kind[o]}: ") + o.help
                 + ("" if o.default in (None, False) else f" (default {o.default})")
                 for o in options]
        allowed = tuple(dict.fromkeys(c for o in options for c in o.choices))
        value_type = choices(f"{name}_choices", allowed) if allowed else options[0].type
        info = typer.Option(options[0].flag, help=escape(" ".join(helps)),  # not markup
                            rich_help_panel=" and ".join(k for k, _ in declared) + " options")
        params.append(Parameter(name, Parameter.KEYWORD_ONLY, default=None,
                                annotation=Annotated[value_type | None, info]))
    return params


def _with_generated_options(command: Callable) -> Callable:
    """``command`` taking ``**options`` gets one typed parameter per source and container option:
    typer reads the signature, so the command line follows the ``OPTIONS`` tables."""
    declared = signature(command, eval_str=True)
    fixed = [p for p in declared.parameters.values() if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = declared.replace(  # type: ignore[attr-defined]
        parameters=[*fixed, *_flags(_source_options()), *_flags(_container_options())])
    return command


def convert(
    src: Annotated[str, typer.Argument(
        help="Input: a folder of files, one per sample (or a URL: s3://bucket/raw/).")],
    dst: Annotated[str, typer.Argument(
        help="Output. *.lmdb → LMDB; *.h5/*.hdf5 → one HDF5 file; a directory, NAME.tar or "
        "DIR/NAME-%06d.tar → uncompressed tar shards (webdataset naming); a URL "
        "(s3://bucket/ds/) → tar shards in object storage.")],
    format: Annotated[ContainerName | None, typer.Option(
        "--format", "-f", help="Container, when DST's suffix does not say.")] = None,
    kind: Annotated[Kind | None, typer.Option(
        help="Sample kind; detected from file suffixes when omitted.")] = None,
    workers: Annotated[int, typer.Option(
        help="Parallel decode processes (default: the cores this process may use).")] = 0,
    on_error: Annotated[OnError, typer.Option(
        help="'fail' stops at the first bad input, naming it; 'skip' skips, counts and "
        "records bad inputs in the manifest.")] = OnError["fail"],
    overwrite: Annotated[bool, typer.Option(
        help="Replace DST if it is an existing packdata dataset.")] = False,
    engine: Annotated[Engine | None, typer.Option(
        help="Convert in parts, as independent tasks, into a sharded dataset (a folder: with "
        "HDF5 or LMDB parts, name DST as a folder and give --format): 'local' runs "
        "them in --workers processes, 'dask' on a Dask cluster (a LocalCluster of --workers "
        "processes, or --scheduler's).")] = None,
    scheduler: Annotated[str | None, typer.Option(
        help="Dask: the scheduler of an existing cluster, tcp://HOST:PORT (implies --engine "
        "dask).")] = None,
    part_size: Annotated[int | None, typer.Option(
        help="Records per part (task) of a conversion in parts (default: about 2 parts per "
        "--workers, at most 100000).")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue an interrupted sharded conversion into DST: keep its finished parts, "
        "redo the rest (refused if any option differs).")] = False,
    **options: Any,
) -> None:
    """Convert a one-file-per-sample dataset into a packed one. Options of a sample kind apply
    to its sources only (an image option given for text is an error).

    Example: packdata convert ./cifar-png cifar.lmdb --labels labels.pkl

    Point clouds: packdata convert ./scans trees.h5 --points 4096 --sampling fps --variants 4
    """
    given = {k: v.value if isinstance(v, Enum) else v for k, v in options.items()
             if v is not None}  # only what the user gave: each kind knows its own defaults
    container_options = {k: given.pop(k) for k in _container_options() if k in given}
    try:
        with warnings.catch_warnings():  # inputs left out, precision lost: one line each
            warnings.simplefilter("always", InputWarning)
            warnings.showwarning = show_warning
            result = _run_convert(src, dst, kind, given, format=format,
                                  container_options=container_options,
                                  workers=workers, on_error=on_error, overwrite=overwrite,
                                  engine=engine, scheduler=scheduler, part_size=part_size,
                                  resume=resume)
    except (PackdataError, OSError, ValueError) as exc:
        if not interrupts.received():  # else a worker stopped by the same Ctrl-C: interrupted
            fail(exc)
        interrupted(f"nothing was written to {dst}")
    except KeyboardInterrupt:
        kept = " (finished parts are kept: rerun with --resume to continue)" \
            if engine or scheduler or part_size or resume else ""
        interrupted(f"nothing was written to {dst}{kept}")
    if interrupts.received():  # arrived after the output was complete, and was swallowed
        interrupted(f"{dst} had already been written in full")
    m = result.manifest
    for stale in result.removed_stale:
        console.print(f"removed stale partial output of a killed conversion: {stale}",
                      highlight=False, markup=False)
    console.print(
        f"wrote {result.path}: {m.count} {m.kind} samples ({m.container}) in "
        f"{result.seconds:.1f} s", highlight=False, markup=False,
    )
    if m.skipped:
        console.print(f"[yellow]skipped {len(m.skipped)} inputs:[/yellow]")
        for s in m.skipped:
            console.print(f"  {s['path']}: {s['reason']}", highlight=False, markup=False)


@functools.cache  # once: the group is made anew for every run in one process (tests)
def _build() -> Any:
    """The ``convert`` command with one flag per option (importing every sample kind)."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.command("convert", cls=Command)(_with_generated_options(convert))
    return typer.main.get_command(one)


later("convert", (convert.__doc__ or "").split(".")[0] + ".", _build)


def _run_convert(src: str, dst: str, kind: Enum | None, options: dict[str, Any], *,
                 format: Enum | None, container_options: dict[str, Any], workers: int,
                 on_error: Enum,
                 overwrite: bool, engine: Enum | None, scheduler: str | None,
                 part_size: int | None, resume: bool):
    from packdata.conversion.dispatch import convert as run_convert
    from packdata.sources import open_source

    source = open_source(src, kind.value if kind else None, **options)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeRemainingColumn(), console=console, transient=True,
        disable=not console.is_terminal,  # in a log, a bar leaves only an empty line
    ) as bar:
        task = bar.add_task(escape(f"converting {src}"), total=None)
        return run_convert(
            source, dst, container=format.value if format else None,
            container_options=container_options or None,
            workers=workers or None, on_error=on_error.value, overwrite=overwrite,
            progress=lambda done, total: (interrupts.check(),
                                          bar.update(task, completed=done, total=total)),
            engine=engine.value if engine else None, scheduler=scheduler,
            part_size=part_size, resume=resume,
        )
