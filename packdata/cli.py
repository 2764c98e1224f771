"""The ``packdata`` command: thin wrappers that parse, call the library and print."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from enum import Enum
from inspect import Parameter, signature
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.table import Table

from packdata import interrupts, sources
from packdata.containers import CONTAINERS
from packdata.convert import ON_ERROR
from packdata.engines import ENGINES
from packdata.errors import InputWarning, PackdataError
from packdata.sources import KINDS
from packdata.sources.options import Option

app = typer.Typer(
    help="Pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True, soft_wrap=True)


def _choices(name: str, values: Iterable[str]) -> type[Enum]:
    """A typer choice type over values the library defines (each set has one home there)."""
    return Enum(name, {value: value for value in values}, type=str)


ContainerName = _choices("ContainerName", CONTAINERS)
Engine = _choices("Engine", ENGINES)
Kind = _choices("Kind", KINDS)
OnError = _choices("OnError", ON_ERROR)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    raise typer.Exit(2)


def _source_options() -> list[Parameter]:
    """One ``packdata convert`` flag per source option, from every kind's ``OPTIONS`` (an option
    several kinds share, such as --labels or --dtype, is one flag)."""
    by_name: dict[str, list[tuple[str, Option]]] = {}
    for kind in KINDS:
        for option in sources.get(kind).OPTIONS:
            by_name.setdefault(option.name, []).append((kind, option))
    params = []
    for name, declared in by_name.items():
        first_kind = {o: kind for kind, o in reversed(declared)}  # kinds sharing one: one help
        options = list(first_kind)
        helps = [("" if len(options) == 1 else f"{first_kind[o]}: ") + o.help
                 + ("" if o.default in (None, False) else f" (default {o.default})")
                 for o in options]
        choices = tuple(dict.fromkeys(c for o in options for c in o.choices))
        value_type = _choices(f"{name}_choices", choices) if choices else options[0].type
        info = typer.Option(options[0].flag, help=" ".join(helps),
                            rich_help_panel=" and ".join(k for k, _ in declared) + " options")
        params.append(Parameter(name, Parameter.KEYWORD_ONLY, default=None,
                                annotation=Annotated[value_type | None, info]))
    return params


def _with_source_options(command: Callable) -> Callable:
    """``command`` taking ``**source_options`` gets one typed parameter per source option: typer
    reads the signature, so the command line follows the kinds' ``OPTIONS`` tables."""
    declared = signature(command, eval_str=True)
    fixed = [p for p in declared.parameters.values() if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = declared.replace(  # type: ignore[attr-defined]
        parameters=[*fixed, *_source_options()])
    return command


@app.command()
@_with_source_options
def convert(
    src: Annotated[str, typer.Argument(
        help="Input: a folder of files, one per sample (or a URL: s3://bucket/raw/).")],
    dst: Annotated[str, typer.Argument(
        help="Output. *.lmdb → LMDB; *.h5/*.hdf5 → HDF5; a directory, NAME.tar or "
        "DIR/NAME-%06d.tar → uncompressed tar shards (webdataset naming); a URL "
        "(s3://bucket/ds/) → tar shards in object storage.")],
    format: Annotated[ContainerName | None, typer.Option(
        "--format", "-f", help="Container, when DST's suffix does not say.")] = None,
    kind: Annotated[Kind | None, typer.Option(
        help="Sample kind; detected from file suffixes when omitted.")] = None,
    workers: Annotated[int, typer.Option(
        help="Parallel decode processes (default: CPU count).")] = os.cpu_count() or 1,
    on_error: Annotated[OnError, typer.Option(
        help="'fail' stops at the first bad input, naming it; 'skip' skips, counts and "
        "records bad inputs in the manifest.")] = OnError["fail"],
    overwrite: Annotated[bool, typer.Option(
        help="Replace DST if it is an existing packdata dataset.")] = False,
    shard_size: Annotated[str | None, typer.Option(
        help="Tar: samples per shard (10000) or bytes per shard (e.g. 512MB).")] = None,
    engine: Annotated[Engine | None, typer.Option(
        help="Convert in parts, as independent tasks, into a sharded dataset: 'local' runs "
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
    **source_options: Any,
) -> None:
    """Convert a one-file-per-sample dataset into a packed one. Options of a sample kind apply
    to its sources only (an image option given for text is an error).

    Example: packdata convert ./cifar-png cifar.lmdb --labels labels.pkl

    Point clouds: packdata convert ./scans trees.h5 --points 4096 --sampling fps --variants 4
    """
    given = {k: v.value if isinstance(v, Enum) else v for k, v in source_options.items()
             if v is not None}  # only what the user gave: each kind knows its own defaults
    try:
        with warnings.catch_warnings():  # inputs left out, precision lost: one line each
            warnings.simplefilter("always", InputWarning)
            warnings.showwarning = _show_warning
            result = _run_convert(src, dst, kind, given, format=format, shard_size=shard_size,
                                  workers=workers, on_error=on_error, overwrite=overwrite,
                                  engine=engine, scheduler=scheduler, part_size=part_size,
                                  resume=resume)
    except (PackdataError, OSError, ValueError) as exc:
        if not interrupts.received():  # else a worker stopped by the same Ctrl-C: interrupted
            _fail(exc)
        _interrupted(f"nothing was written to {dst}")
    except KeyboardInterrupt:
        kept = " (finished parts are kept: rerun with --resume to continue)" \
            if engine or scheduler or part_size or resume else ""
        _interrupted(f"nothing was written to {dst}{kept}")
    if interrupts.received():  # arrived after the output was complete, and was swallowed
        _interrupted(f"{dst} had already been written in full")
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


_announced = False  # whether the command said it was interrupted, and how


def _interrupted(what: str) -> None:
    global _announced
    _announced = True
    console.print(f"[red]interrupted:[/red] {escape(what)}", highlight=False)
    raise typer.Exit(130)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    console.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False)


def _run_convert(src: str, dst: str, kind: Enum | None, options: dict[str, Any], *,
                 format: Enum | None, shard_size: str | None, workers: int, on_error: Enum,
                 overwrite: bool, engine: Enum | None, scheduler: str | None,
                 part_size: int | None, resume: bool):
    from packdata.convert import convert as run_convert
    from packdata.sources import open_source

    source = open_source(src, kind.value if kind else None, **options)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    ) as bar:
        task = bar.add_task(escape(f"converting {src}"), total=None)
        return run_convert(
            source, dst, container=format.value if format else None,
            container_options={"shard_size": shard_size} if shard_size else None,
            workers=workers, on_error=on_error.value, overwrite=overwrite,
            progress=lambda done, total: (interrupts.check(),
                                          bar.update(task, completed=done, total=total)),
            engine=engine.value if engine else None, scheduler=scheduler,
            part_size=part_size, resume=resume,
        )


@app.command()
def inspect(
    dataset: Annotated[Path, typer.Argument(help="A packdata dataset.")],
    preview: Annotated[Path | None, typer.Option(
        help="Write a PNG grid of the first samples (image datasets).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show what a dataset holds: count, fields, classes, size on disk, how it was made."""
    from packdata.inspect import describe
    from packdata.inspect import preview as write_preview

    try:
        info = describe(dataset)
        if preview:
            write_preview(dataset, preview)
    except (PackdataError, OSError) as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    table = Table(title=escape(str(dataset)), show_header=False)

    def add_row(key: str, value: str) -> None:  # values hold paths and lists: no markup
        table.add_row(escape(key), escape(value))

    add_row("container", info["container"])
    add_row("kind", info["kind"])
    add_row("samples", f"{info['count']:,}")
    for name, f in info["fields"].items():
        shape = "×".join("N" if s is None else str(s) for s in f["shape"]) or "scalar"
        codec = f" ({f['codec']})" if f.get("codec") else ""
        add_row(f"field {name}", f"{f['dtype']} {shape}{codec}")
    for name, stats in info.get("lengths", {}).items():
        add_row(f"{name} lengths", ", ".join(f"{k} {v:,}" for k, v in stats.items()))
    if "padding" in info:
        p = info["padding"]
        add_row(f"padding (batches of {p['batch_size']})",
                      f"random {p['random']:.1%}, length-bucketed {p['bucketed']:.1%}")
    if info["classes"]:
        add_row("classes", f"{len(info['classes'])}: " + ", ".join(info["classes"][:10]))
    add_row("size on disk", f"{info['bytes_on_disk'] / 2**20:,.1f} MiB")
    add_row("source", json.dumps(info["source"]))
    add_row("options", json.dumps(info["options"]))
    if info["skipped"]:
        add_row("skipped inputs", str(info["skipped"]))
    for k, v in info["extra"].items():
        add_row(k, json.dumps(v)[:200])
    Console().print(table)
    if preview:
        console.print(f"preview written to {preview}", markup=False)


@app.command()
def verify(
    dataset: Annotated[Path, typer.Argument(help="A packdata dataset.")],
    source: Annotated[Path | None, typer.Option(
        help="Also compare every record with a fresh conversion of this input folder (with the "
        "options the manifest recorded).")] = None,
    deep: Annotated[bool, typer.Option(
        help="Also read each record alone and decode stored images.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Check a dataset: manifest, record count, every record's shape and CRC-32; exits 1 when
    anything is wrong, listing the bad records by key."""
    from packdata.verify import source_for
    from packdata.verify import verify as run_verify

    try:
        src = None
        if source is not None:
            from packdata.containers import for_existing

            src = source_for(for_existing(dataset).READER(dataset).manifest, source)
        report = run_verify(dataset, source=src, deep=deep)
    except (PackdataError, OSError) as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(report.__dict__ | {"ok": report.ok}, indent=2))
    else:
        out = Console(soft_wrap=True)
        checked = f"{report.checked} of {report.count} records checked"
        if source is not None:
            checked += f", {report.compared} compared with {source}"
        out.print(f"{dataset}: {report.container or 'unreadable'}, {checked}", markup=False,
                  highlight=False)
        for problem in report.problems:
            out.print(f"  problem: {problem}", markup=False, highlight=False)
        for bad in report.bad[:50]:
            at = "" if bad["index"] is None else f" (record {bad['index']})"
            out.print(f"  bad: {bad['key']}{at}: {bad['problem']}", markup=False, highlight=False)
        if len(report.bad) > 50:
            out.print(f"  ... and {len(report.bad) - 50} more bad records", markup=False)
        out.print("OK" if report.ok else f"FAILED: {len(report.bad)} bad records, "
                  f"{len(report.problems)} problems", markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def demo(
    count: Annotated[int, typer.Option(help="Images in the demo folder.")] = 10_000,
    workdir: Annotated[Path | None, typer.Option(
        help="Keep the demo's files here (default: a temporary directory).")] = None,
    as_json: Annotated[Path | None, typer.Option("--json", help="Also write results as JSON.")] = None,
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


class BenchDevice(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@app.command()
def bench(
    dataset: Annotated[Path, typer.Argument(
        help="A packdata dataset, or a plain image folder (labels.* inside, or class sub-folders).")],
    model: Annotated[str, typer.Option(
        help="small-cnn, resnet18, pointnet, transformer, or module:callable / file.py:callable "
        "returning a torch.nn.Module. 'auto': by sample kind (images: resnet18 on a GPU, "
        "small-cnn on a CPU).")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Samples per batch.")] = 256,
    device: Annotated[BenchDevice, typer.Option(help="Where to train.")] = BenchDevice.auto,
    amp: Annotated[bool, typer.Option(
        help="Mixed precision (bfloat16 autocast; float16 with loss scaling on older GPUs).")] = False,
    steps: Annotated[int, typer.Option(help="Timed steps per measurement.")] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed steps before each measurement.")] = 5,
    max_seconds: Annotated[float, typer.Option(
        help="Bound of each measurement, warm-up included (it ends within this plus one step "
        "even if --steps are not done).")] = 20.0,
    workers: Annotated[int, typer.Option(help="DataLoader worker processes.")] = 0,
    augment: Annotated[str | None, typer.Option(
        help="Augmentation on the I/O side, on the device after the copy, as training runs it: "
        "'cifar' (random crop with padding 4, flip, normalise).")] = None,
    sweep: Annotated[bool, typer.Option(
        help="Also time the real loop for num_workers 0…cores × prefetch_factor × "
        "persistent_workers (× pin_memory × non_blocking on CUDA), each several times.")] = False,
    sweep_seconds: Annotated[float, typer.Option(
        help="Time budget of the whole sweep, shared by every run of every configuration.")] = 60.0,
    sweep_repeats: Annotated[int, typer.Option(
        help="Runs of each sweep configuration (interleaved), to tell a winner from noise.")] = 3,
    target_gpu: Annotated[str | None, typer.Option(
        help="Estimate whether this GPU would wait for your I/O: A100, H100, H200, L4, V100, "
        "RTX 4090 (peak bf16 with --amp, fp32 without).")] = None,
    target_flops: Annotated[float | None, typer.Option(
        help="The same for any accelerator: its peak FLOP/s, e.g. 312e12.")] = None,
    mfu: Annotated[float, typer.Option(
        help="Share of the target's peak the model would reach (model FLOPs utilisation), "
        "in (0, 1].")] = 0.4,
    profile: Annotated[Path | None, typer.Option(
        help="Profile a few steps with torch.profiler; write the trace to this directory and "
        "print the step-time breakdown.")] = None,
    compare: Annotated[bool, typer.Option(
        help="Image folder only: convert it into every container (in a temporary directory) "
        "and measure each beside the folder.")] = False,
    as_json: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Write a PNG chart (needs matplotlib: pip install \"packdata[plot]\").")] = None,
) -> None:
    """Does I/O outrun training? Measures I/O alone, training alone and the real loop.

    Example: packdata bench cifar.lmdb --model resnet18 --amp --sweep --plot bench.png
    or: packdata bench cifar.lmdb --augment cifar --target-gpu H100
    """
    from packdata.bench import report
    from packdata.bench.runner import BenchSettings
    from packdata.bench.suite import run_bench

    try:
        settings = BenchSettings(model=model, batch_size=batch_size, device=device.value,
                                 amp=amp, steps=steps, warmup=warmup, max_seconds=max_seconds,
                                 workers=workers)
        result = run_bench(dataset, settings, sweep=sweep, sweep_seconds=sweep_seconds,
                           sweep_repeats=sweep_repeats, profile_dir=profile, compare=compare,
                           augment=augment, target_gpu=target_gpu, target_flops=target_flops,
                           mfu=mfu,
                           log=lambda m: console.print(m, highlight=False, markup=False,
                                                         style="dim"))
        report.print_report(result, Console())
        if as_json:
            report.write_json(result, as_json)
        if plot:
            report.plot(result, plot)
    except (PackdataError, OSError) as exc:
        _fail(exc)


@app.command("check-resume")
def check_resume(
    dataset: Annotated[Path, typer.Argument(help="A packdata dataset.")],
    trials: Annotated[int, typer.Option(help="Random interruptions per scenario.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the samplers and of the interruptions.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Batch size of every scenario.")] = 64,
    processes: Annotated[bool, typer.Option(
        help="Include the scenario with DataLoader worker processes (slowest to start).")] = True,
) -> None:
    """Prove mid-epoch resume: interrupt the real loaders at random steps on simulated ranks,
    save, rebuild (other num_workers, other world size), resume, and check from sample checksums
    that each epoch serves every sample once and the order continues unchanged. Exits 1 on any
    failure.

    Example: packdata check-resume cifar.lmdb --trials 3
    """
    import packdata
    from packdata.resume_check import SETUPS
    from packdata.resume_check import check_resume as run_checks

    setups = SETUPS if processes else tuple(s for s in SETUPS if s[2] != "process")
    try:
        results = run_checks(packdata.open(dataset), setups=setups, trials=trials, seed=seed,
                             batch_size=batch_size, log=lambda row: print(row, flush=True))
    except (PackdataError, OSError) as exc:
        _fail(exc)
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} scenarios passed")
    if failed:
        raise typer.Exit(1)


@app.command("index")
def index(
    dataset: Annotated[Path, typer.Argument(help="A packdata tar dataset.")],
) -> None:
    """Write the indexes other readers use into a tar dataset made by an older packdata: a DALI
    .idx per shard (wds2idx layout) and a wids index JSON."""
    from packdata.reader_index import write_reader_indexes

    try:
        written = write_reader_indexes(dataset)
    except (PackdataError, OSError) as exc:
        _fail(exc)
    print(f"wrote {len(written)} index files in {dataset}")


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


if __name__ == "__main__":
    from packdata.__main__ import main

    raise SystemExit(main())
