"""The ``packdata`` command. Each command parses (flags of its own, or one for each option of the
library's tables), calls one library function and renders what it returns."""

from __future__ import annotations

import functools
import inspect
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape  # help is Rich markup: "[plot]" would be taken for a tag
from rich.progress import MofNCompleteColumn, Progress
from typer.core import TyperCommand, TyperGroup

from packdata import containers, interrupts, sources
from packdata.bench.settings import OPTIONS as BENCH_OPTIONS
from packdata.errors import InputWarning, PackdataError, SampleError
from packdata.options import Option


class Command(TyperCommand):
    """A command listed by its docstring's first paragraph, its usage naming its arguments as the
    help does (typer writes ``{src}``), a PackdataError or OSError out of it one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.short_help is None and self.help:
            self.short_help = " ".join(inspect.cleandoc(self.help).split("\n\n")[0].split())

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [p[1:-1].upper() if p[:1] == "{" else p for p in super().collect_usage_pieces(ctx)]

    def invoke(self, ctx: Any) -> Any:
        with warnings.catch_warnings():  # every warning, a library's too: one line
            warnings.simplefilter("always", InputWarning)  # inputs left out: one line each
            warnings.showwarning = lambda message, *_: console.print(
                f"[yellow]warning:[/yellow] {escape(' '.join(str(message).split()))}",
                highlight=False)
            try:
                return super().invoke(ctx)
            except (PackdataError, OSError) as exc:
                fail(exc)


class Commands(TyperGroup):
    """The group: ``convert`` gets its flags (numpy, Pillow…) only when it runs, not for --help."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] == "convert":
            self.commands["convert"] = build_convert()
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=Commands, no_args_is_help=True, pretty_exceptions_enable=False, help=(
    "Pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast."))
console = Console(stderr=True, soft_wrap=True)
JsonFile = Annotated[Path | None, typer.Option("--json", help="Also write the results as JSON.")]
JsonPrint = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
Dataset = Annotated[str, typer.Argument(  # a str: Path("s3://bucket/ds") is "s3:/bucket/ds"
    help="A packdata dataset: a path, or a URL (s3://bucket/ds) as packdata.open takes.")]


def with_flags(command: Callable, options: dict[str, list[tuple[str | None, Option]]]
               ) -> Callable:
    """``command`` (taking ``**options``) with a flag for each of the library's ``options`` (by
    name, with who declares each; None: the command), in its signature; a flag not given: None."""
    flags = []
    for name, declared in options.items():
        by = {o: who for who, o in reversed(declared)}  # those sharing one Option: one help
        text = " ".join(("" if len(by) == 1 else f"{who}: ") + o.help + (
            "" if o.default is None or o.type is bool else f" (default {o.default})")
            for o, who in by.items())
        o, allowed = declared[0][1], "|".join(dict.fromkeys(c for o in by for c in o.choices))
        panel = " and ".join(w for w, _ in declared if w) + " options" if declared[0][0] else None
        info = typer.Option(*o.flags or [o.flag], help=escape(text), rich_help_panel=panel,
                            metavar=f"<{allowed}>" if allowed else None)
        flags.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                       annotation=Annotated[o.type | None, info]))
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]

    # a new function (``command`` keeps its signature), with no **options: typer < 0.29 refuses it
    flagged = functools.wraps(command)(lambda **given: command(**given))
    flagged.__signature__ = signature.replace(parameters=fixed + flags)  # type: ignore[attr-defined]
    return flagged


def fail(exc: Exception, hint: str = "") -> None:
    """Print ``exc`` (and ``hint``) as one ``error:`` line and exit with status 2."""
    console.print(f"[red]error:[/red] {escape(str(exc) + hint)}", highlight=False)
    raise typer.Exit(2)


class Interrupted(SystemExit):
    """The command said it was interrupted, and what that left (status 130)."""


def interrupted(what: str) -> None:
    """Say the command was interrupted and what that left; exit with status 130."""
    console.print(f"[red]interrupted:[/red] {escape(what)}", highlight=False)
    raise Interrupted(130)


def run(args: list[str] | None = None) -> int:
    """Run the command line; its exit status (Ctrl-C anywhere: one line, 130; see interrupts)."""
    try:
        app(args, prog_name="packdata")  # standalone: usage errors shown, ends in SystemExit
        status = 0
    except Interrupted:
        return 130
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    if interrupts.received():  # typer makes a KeyboardInterrupt a silent 130
        console.print("[red]interrupted[/red]", highlight=False)
        status = 130
    return status


def convert(
    src: Annotated[str, typer.Argument(
        help="Input: a folder of files, one per sample (or a URL: s3://bucket/raw/).")],
    dst: Annotated[str, typer.Argument(
        help="Output. *.lmdb → LMDB; *.h5/*.hdf5 → one HDF5 file; a directory, NAME.tar or "
        "DIR/NAME-%06d.tar → uncompressed tar shards (webdataset naming); a URL "
        "(s3://bucket/ds/) → tar shards in object storage.")],
    kind: Annotated[str | None, typer.Option(help=f"Sample kind ({', '.join(sources.KINDS)}); "
                                             "detected from file suffixes when omitted.")] = None,
    **options: Any,
) -> None:
    """Convert a one-file-per-sample dataset into a packed one.

    Example: packdata convert ./cifar-png cifar.lmdb --labels labels.pkl

    Point clouds: packdata convert ./scans trees.h5 --points 4096 --sampling fps --variants 4
    """
    from packdata.conversion.dispatch import convert as run_convert
    from packdata.conversion.settings import OPTIONS

    given = {k: v for k, v in options.items() if v is not None}  # the rest: the defaults
    job = {o.name: given.pop(o.name) for o in OPTIONS if o.name in given}
    written = {k: given.pop(k) for k in containers.writer_options() if k in given}
    try:
        with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as bar:  # a log: no bar
            task = bar.add_task(escape(f"converting {src}"), total=None)
            result = run_convert(
                sources.open_source(src, kind, **given), dst, **job,
                container_options=written or None, progress=lambda done, total: (
                    interrupts.check(), bar.update(task, completed=done, total=total)))
    except (PackdataError, OSError, ValueError) as exc:
        if not interrupts.received():  # else a worker stopped by the same Ctrl-C: interrupted
            fail(exc, " (--on-error skip skips bad inputs and lists them)"
                 if isinstance(exc, SampleError) and "on_error" not in job else "")
        interrupted(f"nothing was written to {dst}")
    except KeyboardInterrupt:
        in_parts = {"engine", "scheduler", "part_size", "resume"} & set(job)
        interrupted(f"nothing was written to {dst}" + (
            " (finished parts are kept: rerun with --resume to continue)" if in_parts else ""))
    if interrupts.received():  # arrived after the output was complete, and was swallowed
        interrupted(f"{dst} had already been written in full")
    console.print("\n".join(result.lines()), highlight=False, markup=False)


@functools.cache  # once: the group is made anew for every run in one process (tests)
def build_convert() -> Any:
    from packdata.conversion.settings import OPTIONS

    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    flags = {**{o.name: [(None, o)] for o in OPTIONS}, **sources.options(),
             **containers.writer_options()}
    one.command("convert", cls=Command)(with_flags(convert, flags))
    return typer.main.get_command(one)


app.command(cls=Command)(with_flags(convert, {}))  # its flags made when it runs


@app.command("inspect", cls=Command)
def inspect_dataset(
    dataset: Dataset,
    preview: Annotated[Path | None, typer.Option(
        help="Write a PNG grid of the first samples (image datasets).")] = None,
    as_json: JsonPrint = False,
) -> None:
    """Show what a dataset holds: count, fields, classes, size on disk, how it was made."""
    from packdata.describe import describe, print_table

    info = describe(dataset, preview=preview)
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        print_table(info, Console())


@app.command(cls=Command)
def verify(
    dataset: Dataset,
    source: Annotated[str | None, typer.Option(
        help="Also compare every record with a fresh conversion of this input folder (with the "
        "options the manifest recorded).")] = None,
    deep: Annotated[bool, typer.Option(
        "--deep", help="Also read each record alone and decode stored images.")] = False,
    as_json: JsonPrint = False,
) -> None:
    """Check a dataset: manifest, record count, every record's shape and checksum; exits 1 when
    anything is wrong, listing the bad records by key."""
    from packdata.verification import verify as run_verify

    report = run_verify(dataset, source=source, deep=deep)
    print(json.dumps(report.__dict__ | {"ok": report.ok}, indent=2) if as_json
          else "\n".join(report.lines()))
    raise typer.Exit(int(not report.ok))


@app.command("check-resume", cls=Command)
def check_resume(
    dataset: Dataset,
    trials: Annotated[int, typer.Option(help="Random interruptions per scenario.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the samplers and of the interruptions.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Batch size of every scenario.")] = 64,
    processes: Annotated[bool, typer.Option(
        help="Include the scenario with DataLoader worker processes (slowest to start).")] = True,
) -> None:
    """Prove mid-epoch resume: interrupt the real loaders at random steps on simulated ranks,
    save, rebuild (other num_workers, other world size), resume, and check that each epoch serves
    every sample once and the order continues unchanged. Exits 1 on any failure.

    Example: packdata check-resume cifar.lmdb --trials 3
    """
    from packdata.resume_check import check_resume as run_checks

    results = run_checks(dataset, processes=processes, trials=trials, seed=seed,
                         batch_size=batch_size, log=lambda row: print(row, flush=True))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} scenarios passed")
    raise typer.Exit(int(failed > 0))


@app.command(cls=Command)
def index(dataset: Dataset) -> None:
    """Write the indexes other readers use into a tar dataset made by an older packdata: a DALI
    .idx per shard (wds2idx layout) and a wids index JSON."""
    from packdata.containers.tar.reindex import write_reader_indexes

    print(f"wrote {len(write_reader_indexes(dataset))} index files in {dataset}")


@app.command(cls=Command)
def demo(
    count: Annotated[int, typer.Option(help="Images in the demo folder.")] = 10_000,
    workdir: Annotated[Path | None, typer.Option(
        help="Keep the demo's files here (default: a temporary directory).")] = None,
    as_json: JsonFile = None,
    seconds: Annotated[float, typer.Option(help="Minimum timing per loader.")] = 1.0,
) -> None:
    """Convert a real CIFAR-10 sample shipped with packdata into every container and compare
    loading speed with the classic one-file-per-sample Dataset."""
    from packdata.demo import print_table, run_demo

    results = run_demo(count=count, workdir=workdir, min_seconds=seconds,
                       log=lambda m: console.print(m, highlight=False, markup=False))
    print_table(results, Console())
    if as_json:
        as_json.write_text(json.dumps(results, indent=2))


def bench(
    dataset: Annotated[str, typer.Argument(
        help="A packdata dataset (a path, or a URL: s3://bucket/ds), or a plain image folder "
        "(labels.* inside, or class sub-folders).")],
    as_json: JsonFile = None,
    plot: Annotated[Path | None, typer.Option(help=escape(
        'Write a PNG chart (needs matplotlib: pip install "packdata[plot]").'))] = None,
    **options: Any,
) -> None:
    """Does I/O outrun training? Measures I/O alone, training alone and the real loop.

    Example: packdata bench cifar.lmdb --model resnet18 --amp --sweep --plot bench.png
    or: packdata bench cifar.lmdb --augment cifar --target-gpu H100
    """
    from packdata.bench import report
    from packdata.bench.suite import run_bench

    given = {k: v for k, v in options.items() if v is not None}  # the rest: the defaults
    result = run_bench(dataset, **given, log=lambda m: console.print(
        m, highlight=False, markup=False, style="dim"))
    report.print_report(result, Console())
    if as_json:
        report.write_json(result, as_json)
    if plot:
        report.plot(result, plot)


app.command(cls=Command)(with_flags(bench, {o.name: [(None, o)] for o in BENCH_OPTIONS}))
