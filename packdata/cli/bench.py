"""``packdata bench`` (does I/O outrun training?) and ``packdata demo``."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape  # help is Rich markup: "[plot]" would be taken for a tag

from packdata.cli.app import Command, JsonFile, app, console, fail
from packdata.errors import PackdataError


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


class BenchDevice(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@app.command(cls=Command)
def bench(
    dataset: Annotated[str, typer.Argument(  # a str: Path("s3://b/ds") is "s3:/b/ds"
        help="A packdata dataset (a path, or a URL: s3://bucket/ds), or a plain image folder "
        "(labels.* inside, or class sub-folders).")],
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
    warm: Annotated[bool, typer.Option(
        "--warm/--cold", help="Warm: each measurement first reads, untimed, the batches it "
        "times (first reads after opening a dataset are slower); cold times first reads.")
    ] = True,
    augment: Annotated[str | None, typer.Option(
        help="Augmentation on the I/O side, on the device after the copy, as training runs it: "
        "'cifar' (random crop with padding 4, flip, normalise).")] = None,
    sweep: Annotated[bool, typer.Option(
        help="Also time the real loop for num_workers from 0 to the cores × prefetch_factor × "
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
    as_json: JsonFile = None,
    plot: Annotated[Path | None, typer.Option(
        help=escape('Write a PNG chart (needs matplotlib: pip install "packdata[plot]").'))
    ] = None,
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
                                 workers=workers, warm=warm)
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
        fail(exc)
