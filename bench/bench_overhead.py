"""The bench's own overhead: its three measurements against bare loops doing the same work.

    python bench/bench_overhead.py [--data ../shared/data/cifar10/test-png] [--count 10000]
        [--rounds 5] [--json bench/results/bench_overhead.json]

Converts ``count`` real CIFAR-10 images to LMDB, then, in interleaved rounds (so machine load
drifts hit both sides alike), measures samples/s of
- I/O alone: ``measure_io`` vs ``for batch in loader: batch.to(device)``;
- training alone: ``measure_train`` vs ``for _ in range(steps): step(batch)``;
- the real loop: ``measure_loop`` (StepTimer, t1/t2/t3 per step) vs a bare loader + step loop;
and reports the median overhead ``1 − bench rate / bare rate`` of each (target: under 2 %).
On a shared machine those A/B pairs carry several per cent of noise, so the bench's own cost
per step is also measured directly: the real loop's machinery (StepTimer marks, generator hops,
bounds) around a loader and a step that do nothing, minus a bare loop around the same.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _shared import CIFAR_PNG, parser, write_results
from bench_containers import build_folder

import packdata
from packdata.bench.inputs import LoaderOptions, endless, open_input
from packdata.bench.models import build_model
from packdata.bench.runner import (
    Trainer,
    first_batch,
    measure_io,
    measure_loop,
    measure_train,
    to_device,
)
from packdata.bench.settings import BenchSettings

CPU = torch.device("cpu")


def bare_io(inp, settings: BenchSettings) -> float:
    batches = endless(inp.loader(settings.batch_size, LoaderOptions(), seed=settings.seed))
    for _ in range(settings.warmup):
        next(batches)
    samples = 0
    start = time.perf_counter()
    for _ in range(settings.steps):
        samples += len(to_device(next(batches), CPU)[0])
    return samples / (time.perf_counter() - start)


def bare_train(trainer: Trainer, batch, settings: BenchSettings) -> float:
    for _ in range(settings.warmup):
        trainer(batch)
    start = time.perf_counter()
    for _ in range(settings.steps):
        trainer(batch)
    return settings.steps * len(batch[0]) / (time.perf_counter() - start)


def bare_loop(inp, trainer: Trainer, settings: BenchSettings) -> float:
    batches = endless(inp.loader(settings.batch_size, LoaderOptions(), seed=settings.seed))
    for _ in range(settings.warmup):
        trainer(to_device(next(batches), CPU))
    samples = 0
    start = time.perf_counter()
    for _ in range(settings.steps):
        batch = to_device(next(batches), CPU)
        trainer(batch)
        samples += len(batch[0])
    return samples / (time.perf_counter() - start)


class Instant:
    """A loader of one pre-made batch, and a training step that does nothing."""

    def __init__(self, batch, n: int) -> None:
        self.batch, self.n, self.device = batch, n, CPU

    def loader(self, *args, **kwargs):
        return [self.batch] * self.n

    def __call__(self, batch) -> None:
        pass


def machinery_us(batch, steps: int = 20_000) -> float:
    """Microseconds the real-loop measurement adds per step, beyond a bare loop."""
    instant = Instant(batch, steps)
    settings = BenchSettings(batch_size=len(batch[0]), steps=steps, warmup=0, max_seconds=1e9,
                             warm=False)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        measure_loop(instant, instant, settings, LoaderOptions())  # type: ignore[arg-type]
        timed = time.perf_counter() - start
        start = time.perf_counter()
        for b in endless(instant.loader()):
            instant(to_device(b, CPU))
            steps -= 1
            if not steps:
                break
        steps = settings.steps
        best = min(best, (timed - (time.perf_counter() - start)) / steps * 1e6)
    return best


def main() -> None:
    args = parser(__doc__, data=CIFAR_PNG, count=10_000, rounds=5,
                  results="bench_overhead.json").parse_args()

    with tempfile.TemporaryDirectory(prefix="packdata-overhead-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        lmdb = packdata.convert(packdata.open_source(folder), Path(tmp) / "c.lmdb",
                                workers=os.cpu_count() or 1).path
        inp = open_input(lmdb)
        # I/O: many cheap steps (the harshest case for per-step overhead); training: fewer.
        # Cold (no untimed pass first), as the bare loops they are compared with
        io_settings = BenchSettings(batch_size=256, steps=39, warmup=2, max_seconds=1e9, warm=False)
        train_settings = BenchSettings(batch_size=64, steps=10, warmup=2, max_seconds=1e9,
                                       warm=False)
        batch = first_batch(inp, train_settings, CPU)
        trainer = Trainer(build_model("small-cnn", "image", batch, 10)[1], CPU)
        pairs: dict[str, list[tuple[float, float]]] = {"io": [], "train": [], "loop": []}
        for r in range(args.rounds):
            for _ in range(20):  # I/O steps are ~1 ms: repeat to reach tens of ms per sample
                pairs["io"].append((measure_io(inp, io_settings, LoaderOptions(), CPU)
                                    ["samples_per_s"], bare_io(inp, io_settings)))
            pairs["train"].append((measure_train(trainer, batch, train_settings)["samples_per_s"],
                                   bare_train(trainer, batch, train_settings)))
            pairs["loop"].append((measure_loop(inp, trainer, train_settings, LoaderOptions())
                                  ["samples_per_s"], bare_loop(inp, trainer, train_settings)))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        cost = machinery_us(batch)
    report = {"count": args.count, "cpus": os.cpu_count(), "rounds": args.rounds,
              "time": time.strftime("%Y-%m-%d %H:%M"), "rows": []}
    print("| measurement | bench samples/s | bare loop samples/s | overhead (median) |")
    print("|---|---:|---:|---:|")
    for name, ps in pairs.items():
        bench = statistics.median(b for b, _ in ps)
        bare = statistics.median(a for _, a in ps)
        overhead = statistics.median(1 - b / a for b, a in ps)
        report["rows"].append({"measurement": name, "bench_samples_per_s": bench,
                               "bare_samples_per_s": bare, "overhead": overhead, "pairs": ps})
        print(f"| {name} | {bench:,.0f} | {bare:,.0f} | {overhead:+.1%} |")
    train_step_us = 1e6 * 64 / report["rows"][1]["bench_samples_per_s"]
    io_step_us = 1e6 * 256 / report["rows"][0]["bench_samples_per_s"]
    report["machinery_us_per_step"] = cost
    print(f"real-loop machinery: {cost:.1f} µs per step = {cost / io_step_us:.2%} of an I/O step "
          f"(batch 256), {cost / train_step_us:.3%} of a training step (batch 64)")
    write_results(args.json, report)


if __name__ == "__main__":
    main()
