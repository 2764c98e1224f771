"""The whole ``packdata bench`` run: open the input(s), build the model, measure I/O alone,
training alone and both, draw the verdict; optionally sweep the loader and profile."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from packdata.bench.inputs import FOLDER, BenchInput, LoaderOptions, convert_all, open_input
from packdata.bench.models import build_model, default_model, describe_batch
from packdata.bench.profile import profile_loop
from packdata.bench.runner import (
    BenchSettings,
    Trainer,
    bench_device,
    first_batch,
    measure_io,
    measure_loop,
    measure_train,
)
from packdata.bench.sweep import default_grid, run_sweep
from packdata.bench.verdict import Facts, advice, verdict
from packdata.errors import BenchError

#: version of the JSON layout documented in docs/bench.md
SCHEMA_VERSION = 1


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count() or 1,
        "torch_threads": torch.get_num_threads(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else platform.processor() or platform.machine(),
    }


def _encoded(inp: BenchInput) -> bool:
    manifest = getattr(inp.dataset, "manifest", None)
    return manifest is not None and any(f.codec for f in manifest.fields.values())


def loader_options(settings: BenchSettings, device: torch.device) -> LoaderOptions:
    """The loader the three measurements use: ``settings.workers`` workers, and on CUDA pinned
    memory with non-blocking copies (the setting a GPU user should start from)."""
    cuda = device.type == "cuda"
    return LoaderOptions(num_workers=settings.workers,
                         prefetch_factor=2 if settings.workers else None,
                         persistent_workers=settings.workers > 0, pin_memory=cuda,
                         non_blocking=cuda)


def bench_input(inp: BenchInput, trainer: Trainer, train: dict[str, Any],
                settings: BenchSettings, options: LoaderOptions,
                log: Callable[[str], Any]) -> dict[str, Any]:
    """I/O alone and the real loop on ``inp`` (training alone is shared by all inputs: it
    never touches storage), with the verdict and advice."""
    log(f"{inp.name}: I/O alone (mock trainer)")
    io = measure_io(inp, settings, options, trainer.device)
    log(f"{inp.name}: the real loop")
    state = trainer.state()
    loop = measure_loop(inp, trainer, settings, options)
    trainer.restore(state)
    facts = Facts(io_rate=io["samples_per_s"], train_rate=train["samples_per_s"],
                  loop_rate=loop["samples_per_s"], load_share=loop["load_share"],
                  device=trainer.device.type, format=inp.format, encoded=_encoded(inp),
                  num_workers=options.num_workers, cores=os.cpu_count() or 1,
                  pin_memory=options.pin_memory, batch_size=settings.batch_size,
                  amp=settings.amp)
    return {"input": inp.to_dict(), "io": io, "train": train, "loop": loop,
            "io_over_train": facts.ratio, "verdict": verdict(facts), "advice": advice(facts)}


def run_bench(
    path: str | Path,
    settings: BenchSettings | None = None,
    *,
    sweep: bool = False,
    sweep_seconds: float = 6.0,
    sweep_grid: Sequence[LoaderOptions] | None = None,
    profile_dir: str | Path | None = None,
    compare: bool = False,
    log: Callable[[str], Any] = lambda m: None,
) -> dict[str, Any]:
    """Measure ``path`` (a packdata dataset or an image folder); the result is the JSON
    document described in docs/bench.md. ``sweep_grid`` replaces the default sweep
    (:func:`packdata.bench.sweep.default_grid`); ``sweep_seconds`` bounds each configuration."""
    settings = settings or BenchSettings()
    started = time.perf_counter()
    device = bench_device(settings.device)
    main = open_input(path)
    if compare and main.format != FOLDER:
        raise BenchError(f"--compare converts an image folder into every container; {path} is "
                         f"already a {main.format} dataset")
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        inputs = [main] + (convert_all(Path(path), Path(tmp), log) if compare else [])
        batch = first_batch(main, settings, device)
        spec = default_model(main.kind, device) if settings.model == "auto" else settings.model
        name, model = build_model(spec, main.kind, batch, main.num_classes)
        log(f"model {name} on {device}; batch {describe_batch(batch)}")
        trainer = Trainer(model, device, amp=settings.amp, name=name)
        trainer.check(batch)
        initial = trainer.state()
        log("training alone (mock loader)")
        train = measure_train(trainer, batch, settings)
        trainer.restore(initial)
        del batch
        options = loader_options(settings, device)
        runs = [bench_input(inp, trainer, train, settings, options, log) for inp in inputs]
        swept = None
        if sweep:
            configs = list(sweep_grid or default_grid(os.cpu_count() or 1, device))
            log(f"sweeping {len(configs)} loader configurations")
            swept = run_sweep(main, trainer, settings, configs, sweep_seconds, log)
        profiled = None
        if profile_dir is not None:
            log(f"profiling the real loop into {profile_dir}")
            profiled = profile_loop(main, trainer, settings, options, profile_dir)
    return {
        "schema": SCHEMA_VERSION,
        "dataset": main.to_dict(),
        "settings": {**settings.to_dict(), "model": name, "device": str(device),
                     "loader": options.to_dict()},
        "environment": environment(device),
        "runs": runs,
        "sweep": swept,
        "profile": profiled,
        "seconds": time.perf_counter() - started,
    }
