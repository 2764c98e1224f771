"""The whole ``packdata bench`` run: open the input(s), build the model, measure I/O alone,
training alone and both, draw the verdict; optionally sweep the loader and profile."""

from __future__ import annotations

import functools
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from packdata.bench.flops import FlopCount, Target, count_flops, estimate, resolve_target
from packdata.bench.inputs import (
    DEFAULT_DECODE,
    FOLDER,
    BenchInput,
    LoaderOptions,
    convert_all,
    open_input,
)
from packdata.bench.models import (
    SmallTransformer,
    build_model,
    default_model,
    describe_batch,
    split_batch,
)
from packdata.bench.profile import profile_loop
from packdata.bench.runner import (
    Trainer,
    bench_device,
    first_batch,
    measure_io,
    measure_loop,
    measure_train,
)
from packdata.bench.settings import BenchSettings, resolve
from packdata.bench.sweep import default_grid, run_sweep
from packdata.bench.timer import batch_size_of, device_sync
from packdata.bench.verdict import Facts, advice, verdict
from packdata.errors import BenchError
from packdata.loading.device import Augment
from packdata.units import available_cores

#: augmentations ``--augment`` knows by name
AUGMENTS = ("cifar",)

#: version of the JSON layout documented in docs/bench.md
SCHEMA_VERSION = 2


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": available_cores(),
        "torch_threads": torch.get_num_threads(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else platform.processor() or platform.machine(),
    }


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
                log: Callable[[str], Any], augment: Augment | None = None,
                target: Target | None = None, flops: FlopCount | None = None,
                ) -> dict[str, Any]:
    """I/O alone and the real loop on ``inp`` (training alone is shared by all inputs: it
    never touches storage), with the verdict, advice and, for a ``target`` GPU, its estimate."""
    log(f"{inp.name}: I/O alone (mock trainer)")
    io = measure_io(inp, settings, options, trainer.device, augment)
    log(f"{inp.name}: the real loop")
    state = trainer.state()
    loop = measure_loop(inp, trainer, settings, options, augment=augment)
    trainer.restore(state)
    facts = Facts(io_rate=io["samples_per_s"], train_rate=train["samples_per_s"],
                  loop_rate=loop["samples_per_s"], load_share=loop["load_share"],
                  device=trainer.device.type, format=inp.format, encoded=inp.encoded,
                  num_workers=options.num_workers, cores=available_cores(),
                  pin_memory=options.pin_memory, batch_size=settings.batch_size,
                  amp=settings.amp, augmented=augment is not None,
                  feeder=inp.format != FOLDER)
    text = verdict(facts)
    estimated: dict[str, Any] | None = None
    if target is not None and flops is not None:
        if flops.per_sample is None:
            estimated = {"target": target.to_dict(), "reason": flops.reason}
            text += f" No estimate for {target.name}: {flops.reason}."
        else:
            estimated = estimate(target, flops.per_sample, io["samples_per_s"], trainer.name)
            text += " " + estimated["text"]
    return {"input": inp.to_dict(), "io": io, "train": train, "loop": loop,
            "io_over_train": facts.ratio, "verdict": text, "advice": advice(facts),
            "target": estimated}


def resolve_augment(augment: str | Augment | None, kind: str, seed: int = 0,
                    ) -> tuple[str | None, Augment | None]:
    """(name, callable) for ``--augment``: ``"cifar"`` (:func:`packdata.augment.cifar_recipe`,
    images only) or a callable taking the batch's images (its first part) on the device."""
    if augment is None:
        return None, None
    if callable(augment):
        return getattr(augment, "__qualname__", type(augment).__name__), augment
    if augment == "cifar":
        if kind != "image":
            raise BenchError(f"--augment cifar is for images; this dataset holds {kind} samples")
        from packdata.augment import cifar_recipe

        return "cifar", cifar_recipe(seed=seed)
    raise BenchError(f"--augment '{augment}': known: {', '.join(AUGMENTS)} (from Python, any "
                     "callable taking a batch of images)")


def warn_slow(step_seconds: float, settings: BenchSettings, measurements: int,
              log: Callable[[str], Any]) -> None:
    """Say before measuring when single steps, not --max-seconds, will set the bench's length."""
    if step_seconds <= settings.max_seconds / 2:
        return
    # each measurement: at least one warm-up and one timed step, or max_seconds plus one step
    each = max(2 * step_seconds, settings.max_seconds + step_seconds)
    log(f"warning: one training step takes {step_seconds:.1f} s (the batch's first step); each "
        f"of the {measurements} measurements runs at least two, so the bench will take about "
        f"{measurements * each + step_seconds:,.0f} s. A smaller --batch-size or a lighter "
        "--model measures I/O sooner.")


def warn_capped(model: nn.Module, batch: Any, log: Callable[[str], Any]) -> None:
    """The built-in transformer reads the first MAX_MOCK_TOKENS of each document: say so, with
    the numbers, when the documents are longer."""
    inputs, _ = split_batch(batch)
    cap = getattr(model, "max_tokens", None)
    if not isinstance(model, SmallTransformer) or cap is None or inputs[0].ndim != 2:
        return
    length = inputs[0].shape[1]
    if length > cap:
        log(f"warning: the first batch's documents run to {length:,} tokens; the built-in "
            f"transformer trains on the first {cap:,} of each (attention over all of them would "
            f"cost about {(length / cap) ** 2:,.0f}× more per step). I/O is timed on whole "
            "documents; pass --model to train your own model on them.")


def run_bench(
    path: str | Path,
    settings: BenchSettings | None = None,
    *,
    sweep_grid: Sequence[LoaderOptions] | None = None,
    log: Callable[[str], Any] = lambda m: None,
    **options: Any,
) -> dict[str, Any]:
    """Measure ``path`` (a packdata dataset or an image folder); the result is the JSON
    document described in docs/bench.md.

    ``options`` are those of :data:`packdata.bench.settings.OPTIONS` (``packdata bench``'s
    flags): the fields of :class:`BenchSettings` given there replace ``settings``'s. ``augment``
    (``"cifar"`` or a callable on a batch of images) runs on the I/O side, after the copy to
    the device, as a training loop would. ``sweep_grid`` replaces the default sweep
    (:func:`packdata.bench.sweep.default_grid`); ``sweep_seconds`` is the budget of the whole
    sweep, shared by ``sweep_repeats`` runs of each configuration. ``target_gpu`` (a name in
    :data:`packdata.bench.flops.GPUS`) or ``target_flops`` (peak FLOP/s), at ``mfu``, add the
    estimate of whether that GPU would wait for this I/O. ``profile``: a directory for a
    torch.profiler trace of a few steps. ``compare``: an image folder converted into every
    container, each measured beside it.
    """
    settings, o = resolve(settings, options)
    sweep, sweep_seconds, sweep_repeats = o["sweep"], o["sweep_seconds"], o["sweep_repeats"]
    started = time.perf_counter()
    target = resolve_target(o["target_gpu"], o["target_flops"], o["mfu"], settings.amp)
    if sweep and sweep_repeats < 2:
        raise BenchError(f"sweep repeats must be ≥ 2 to tell a difference from noise, "
                         f"got {sweep_repeats}")
    if sweep and not 0 < sweep_seconds < float("inf"):
        raise BenchError(f"--sweep-seconds {sweep_seconds}: expected the sweep's time budget in "
                         "seconds, > 0")
    device = bench_device(settings.device)
    main = open_input(path, o["decode"], log)
    augment_name, augment_fn = resolve_augment(o["augment"], main.kind, settings.seed)
    if o["compare"] and main.format != FOLDER:
        raise BenchError(f"--compare converts an image folder into every container; {path} is "
                         f"already a {main.format} dataset")
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        inputs = [main] + (convert_all(Path(path), Path(tmp), log, decode=o["decode"] or (
            DEFAULT_DECODE if main.dataset.mixed_sizes else None)) if o["compare"] else [])
        batch = first_batch(main, settings, device, augment_fn)
        spec = default_model(main.kind, device) if settings.model == "auto" else settings.model
        name, model = build_model(spec, main.kind, batch, main.num_classes)
        log(f"model {name} on {device}; batch {describe_batch(batch)}")
        warn_capped(model, batch, log)
        trainer = Trainer(model, device, amp=settings.amp, name=name)
        initial = trainer.state()
        step_start = time.perf_counter()
        trainer.check(batch)
        device_sync(device)()
        warn_slow(time.perf_counter() - step_start, settings, 1 + 2 * len(inputs), log)
        flops = count_flops(functools.partial(trainer, batch), batch_size_of(batch))
        trainer.restore(initial)
        log("training alone (mock loader)")
        train = measure_train(trainer, batch, settings)
        trainer.restore(initial)
        del batch
        options = loader_options(settings, device)
        runs = [bench_input(inp, trainer, train, settings, options, log, augment_fn, target,
                            flops) for inp in inputs]
        swept = None
        if sweep:
            configs = list(sweep_grid or default_grid(available_cores(), device))
            log(f"sweeping {len(configs)} loader configurations × {sweep_repeats} runs "
                f"in about {sweep_seconds:.0f} s")
            swept = run_sweep(main, trainer, settings, configs, sweep_seconds, log,
                              sweep_repeats, augment_fn)
        profiled = None
        if o["profile"] is not None:
            log(f"profiling the real loop into {o['profile']}")
            profiled = profile_loop(main, trainer, settings, options, o["profile"],
                                    augment=augment_fn)
    return {
        "schema": SCHEMA_VERSION,
        "dataset": main.to_dict(),
        "settings": {**settings.to_dict(), "model": name, "device": str(device),
                     "loader": options.to_dict(), "augment": augment_name,
                     "target": None if target is None else target.to_dict()},
        "flops": {**flops.to_dict(), "achieved_per_s": None if flops.per_sample is None
                  else flops.per_sample * train["samples_per_s"]},
        "environment": environment(device),
        "runs": runs,
        "sweep": swept,
        "profile": profiled,
        "seconds": time.perf_counter() - started,
    }
