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
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _shared import CIFAR_PNG, command_line, parser, write_results
from bench_containers import TARGETS, build_folder

import packdata

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


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=3, results="feed.json")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="the step's length (0: four times the loader's time per batch alone)")
    p.add_argument("--containers", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-feed-"))
    try:
        folder = build_folder(args.data, work / "png", args.count)
        results = {}
        for name in args.containers:
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
                                  "batch_size": args.batch_size, "containers": results})


if __name__ == "__main__":
    main()
