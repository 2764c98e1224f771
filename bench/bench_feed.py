"""Does the loader cost the training thread anything? A training loop whose step holds the
interpreter, fed by packdata.loader and by a batch that is already there.

    python bench/bench_feed.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--batch-size 1024] [--rounds 3] [--step-ms 0 (auto)] [--json bench/results/feed.json]

On a GPU, an eager training step spends most of its time on the training thread launching
kernels while it holds the interpreter lock; whatever the loader does on that thread, or takes
the lock for in another, is added to every step however fast the loader is alone. This bench
shows that contention without a GPU: the step is S ms of pure-Python work (it never releases the
lock of its own accord), and S is set so that the loader alone (nothing to train) delivers about
four times the step's rate. For each container (the real CIFAR-10 test PNGs repeated to
``--count`` images, converted with the defaults) it times, interleaved per round:

- ``io``: the loader alone, its samples/s (later epochs, the checked reads of the first one
  done);
- ``ready``: the loop fed one batch that is already there: the limit;
- ``loader``: the loop fed by ``packdata.loader(ds, B, shuffle=True, drop_last=True)``, its
  samples/s and the training thread's own time in each ``next()`` (median and mean, µs): wall
  time, and the thread's CPU time, which the machine's other work does not inflate.

The ratio ``loader ÷ ready`` per round is what the loop loses to the loader.

With ``--device cuda`` the step is real: :class:`~packdata.bench.models.FastCIFAR` (the network
of the fastest CIFAR-10 trainers) in bf16 autocast, channels-last, SGD with Nesterov momentum,
eager. Rows per round: ``ready`` (one batch already on the GPU), ``resident`` (every image held
on the GPU, a shuffled gather and ``cifar_recipe(backend="torch")`` per batch: the limit for a
loader that augments on the GPU) and, per container, ``packdata.loader(ds, B, shuffle=True,
drop_last=True, device="cuda", augment=cifar_recipe(backend="torch"))``; the ratio that matters
is ``loader ÷ resident``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _shared import CIFAR_PNG, command_line, parser, write_results
from bench_containers import TARGETS, build_folder

import packdata
from packdata.augment import cifar_recipe
from packdata.bench.models import FastCIFAR

IO_TIMES_STEP = 4  # the loader alone delivers this many times the step's rate


def hold_the_interpreter(seconds: float) -> None:
    """A training step's stand-in: pure-Python work for ``seconds`` (the lock is taken from it
    only when another thread asks and the switch interval has passed)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def epoch_seconds(loader: object) -> float:
    """Wall seconds of one pass over ``loader`` with nothing to train."""
    start = time.perf_counter()
    for _ in loader:  # type: ignore[attr-defined]
        pass
    return time.perf_counter() - start


def fed_loop(batches: object, steps: int, step_seconds: float) -> dict[str, float]:
    """``steps`` training steps, each taking its batch from ``batches`` (an iterator): wall
    seconds, and the training thread's own time in each ``next()``: wall (waiting included)
    and the thread's CPU time (what it spent working, whatever else the machine runs)."""
    waits, works = [], []
    start = time.perf_counter()
    for _ in range(steps):
        asked, cpu = time.perf_counter(), time.thread_time()
        batch = next(batches)  # type: ignore[call-overload]
        works.append(time.thread_time() - cpu)
        waits.append(time.perf_counter() - asked)
        hold_the_interpreter(step_seconds)
        del batch
    wall = time.perf_counter() - start
    return {"seconds": wall, "next_us_median": statistics.median(waits) * 1e6,
            "next_us_mean": statistics.fmean(waits) * 1e6,
            "next_cpu_us_median": statistics.median(works) * 1e6,
            "next_cpu_us_mean": statistics.fmean(works) * 1e6}


def ready_loop(batch: object, steps: int, step_seconds: float) -> float:
    """The same loop fed a batch that is already there: wall seconds."""
    start = time.perf_counter()
    for _ in range(steps):
        kept = batch  # noqa: F841
        hold_the_interpreter(step_seconds)
    return time.perf_counter() - start


def measure(path: Path, batch_size: int, rounds: int, step_ms: float) -> dict:
    ds = packdata.open(path)
    loader = packdata.loader(ds, batch_size, shuffle=True, drop_last=True)
    steps = len(loader)
    epoch_seconds(loader)  # the first epoch checks every record: later epochs are what repeats
    io = [epoch_seconds(loader) for _ in range(2)]
    io_batch = min(io) / steps
    step = step_ms / 1e3 if step_ms else IO_TIMES_STEP * io_batch
    ready_batch = next(iter(loader))
    rows: dict[str, list[float]] = {"io": [], "ready": [], "loader": [], "next_us_median": [],
                                    "next_us_mean": [], "next_cpu_us_median": [],
                                    "next_cpu_us_mean": []}
    for r in range(rounds):
        rows["io"].append(steps * batch_size / epoch_seconds(loader))
        rows["ready"].append(steps * batch_size / ready_loop(ready_batch, steps, step))
        fed = fed_loop(iter(loader), steps, step)
        rows["loader"].append(steps * batch_size / fed["seconds"])
        for key in ("next_us_median", "next_us_mean", "next_cpu_us_median", "next_cpu_us_mean"):
            rows[key].append(fed[key])
        print(f"  round {r + 1}/{rounds}: loader ÷ ready "
              f"{rows['loader'][-1] / rows['ready'][-1]:.3f}, next() "
              f"{fed['next_us_median']:.0f} µs median, {fed['next_cpu_us_median']:.0f} µs of CPU",
              file=sys.stderr)
    ratios = [a / b for a, b in zip(rows["loader"], rows["ready"])]
    return {"batches_per_epoch": steps, "step_ms": step * 1e3, "io_ms_per_batch": io_batch * 1e3,
            "rounds": rows, "loader_vs_ready": statistics.median(ratios),
            "loader_vs_ready_range": [min(ratios), max(ratios)],
            "io_vs_step": statistics.median(rows["io"]) / statistics.median(rows["ready"]),
            "next_us_median": statistics.median(rows["next_us_median"]),
            "next_cpu_us_median": statistics.median(rows["next_cpu_us_median"])}


class FastStep:
    """One training step of :class:`FastCIFAR` on the GPU, as the fastest trainers run it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.model = FastCIFAR(10).to(device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9,
                                         nesterov=True, weight_decay=5e-4)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        with torch.autocast(self.device.type, torch.bfloat16):
            out = self.model(images.contiguous(memory_format=torch.channels_last))
            loss = torch.nn.functional.cross_entropy(out, labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def gpu_epochs(batches: object, step: FastStep, epochs: int) -> tuple[float, int, list[float]]:
    """(seconds, samples, the training thread's CPU µs in each ``next()``) of ``epochs``
    passes of the loop over ``batches`` (a loader), timed from the first batch's arrival."""
    samples, works = 0, []
    sync = torch.cuda.synchronize if step.device.type == "cuda" else lambda: None
    sync()
    start = time.perf_counter()
    for _ in range(epochs):
        it = iter(batches)  # type: ignore[call-overload]
        while True:
            cpu = time.thread_time()
            batch = next(it, None)
            works.append((time.thread_time() - cpu) * 1e6)
            if batch is None:
                break
            step(batch)
            samples += len(batch[1])
    sync()
    return time.perf_counter() - start, samples, works[:-1]


def measure_gpu(paths: dict[str, Path], batch_size: int, rounds: int, epochs: int,
                device: torch.device) -> dict:
    step = FastStep(device)
    augment = cifar_recipe(seed=0, backend="torch")
    first = packdata.open(next(iter(paths.values())))
    loaders = {"resident": packdata.loader(first, batch_size, shuffle=True, drop_last=True,
                                           resident=True, device=device, augment=augment)}
    for name, path in paths.items():
        loaders[name] = packdata.loader(packdata.open(path), batch_size, shuffle=True,
                                        drop_last=True, device=device, augment=augment)
    ready = tuple(next(iter(loaders["resident"])))

    class Ready:
        def __iter__(self):
            return (ready for _ in range(len(loaders["resident"])))

    loaders = {"ready": Ready(), **loaders}
    for loader in loaders.values():  # warm: kernels chosen, feeders started, records checked
        gpu_epochs(loader, step, 1)
    rows: dict[str, dict[str, list[float]]] = {n: {"rate": [], "next_cpu_us": []} for n in loaders}
    for r in range(rounds):
        for name, loader in loaders.items():
            seconds, samples, works = gpu_epochs(loader, step, epochs)
            rows[name]["rate"].append(samples / seconds)
            rows[name]["next_cpu_us"].append(statistics.median(works))
        line = ", ".join(f"{n} {rows[n]['rate'][-1]:,.0f}" for n in rows)
        print(f"  round {r + 1}/{rounds}: {line} samples/s", file=sys.stderr)
    out = {}
    for name, row in rows.items():
        out[name] = {"rounds": row, "rate": statistics.median(row["rate"]),
                     "next_cpu_us": statistics.median(row["next_cpu_us"])}
        ratios = [a / b for a, b in zip(row["rate"], rows["resident"]["rate"])]
        out[name]["vs_resident"] = statistics.median(ratios)
        out[name]["vs_resident_range"] = [min(ratios), max(ratios)]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    # whether the feeder's slots were registered with CUDA (else each batch is copied into
    # pinned memory first, on the training thread)
    host = packdata.loader(first, batch_size, pin_memory=device.type == "cuda")
    pinned = next(iter(host))[0].is_pinned()
    host.close()
    return {"device": name, "torch": torch.__version__, "cpu_cores": os.cpu_count(),
            "arrives_pinned": pinned, "rows": out}


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=3, results="feed.json")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="the step's length (0: four times the loader's time per batch alone)")
    p.add_argument("--containers", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--step", choices=["python", "fast-cifar"], default=None,
                   help="python: a step that holds the interpreter (the default on the CPU); "
                   "fast-cifar: FastCIFAR trained on the device (the default on CUDA)")
    p.add_argument("--epochs", type=int, default=2, help="cuda: epochs per row and round")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-feed-"))
    try:
        folder = build_folder(args.data, work / "png", args.count)
        results = {}
        step = args.step or ("fast-cifar" if args.device == "cuda" else "python")
        if step == "fast-cifar":
            paths = {}
            for name in args.containers:
                paths[name] = packdata.convert(packdata.open_source(folder), work / TARGETS[name],
                                               workers=os.cpu_count()).path
            results = measure_gpu(paths, args.batch_size, args.rounds, args.epochs,
                                  torch.device(args.device))
            for name, row in results["rows"].items():
                print(f"{name}: {row['rate']:,.0f} samples/s, {row['vs_resident']:.3f}× resident "
                      f"({row['vs_resident_range'][0]:.3f}–{row['vs_resident_range'][1]:.3f}); "
                      f"next() {row['next_cpu_us']:.0f} µs of CPU")
        for name in args.containers if step == "python" else ():
            packdata.convert(packdata.open_source(folder), work / TARGETS[name], workers=2)
            print(f"{name}:", file=sys.stderr)
            results[name] = measure(work / TARGETS[name], args.batch_size, args.rounds,
                                    args.step_ms)
            r = results[name]
            print(f"{name}: step {r['step_ms']:.2f} ms, loader alone {r['io_vs_step']:.1f}× the "
                  f"step's rate; loop fed by the loader {r['loader_vs_ready']:.3f}× a ready batch "
                  f"({r['loader_vs_ready_range'][0]:.3f}–{r['loader_vs_ready_range'][1]:.3f}); "
                  f"next() {r['next_us_median']:.0f} µs ({r['next_cpu_us_median']:.0f} µs of CPU)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        write_results(args.json, {"command": command_line(), "count": args.count,
                                  "batch_size": args.batch_size, "device": args.device,
                                  "step": step,
                                  "containers": results})


if __name__ == "__main__":
    main()
