"""Open + first epoch against the in-RAM limit, per container, as a user starts training.

    python bench/bench_first_epoch.py [--data ../shared/data/cifar10/test-png] [--count 20000]
        [--rounds 5] [--json bench/results/first_epoch.json]

Converts ``--count`` real CIFAR-10 PNGs (repeated) into every container, then, in interleaved
rounds: one epoch of the in-RAM limit (shuffled batches of 256 gathered from arrays in RAM, each
batch's indices sorted: bench_containers' SortedGather), and for each container a fresh
``packdata.open`` (default verify: every record checked) plus one epoch of
``packdata.loader(ds, 256)`` in the main process. Reported: the median of per-round ratios
(limit seconds / open-and-epoch seconds), in wall time and in this process's CPU time (which
the machine's other jobs do not inflate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_containers import TARGETS, SortedGather, build_folder  # noqa: E402

import packdata  # noqa: E402


def timed(run) -> tuple[float, float]:
    """Wall seconds and CPU seconds of this process (``time.process_time``: what the machine's
    other jobs take does not count, page faults do) of ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def open_and_epoch(path: Path, verify: str) -> None:
    ds = packdata.open(path, verify=verify)
    for _ in packdata.loader(ds, 256, num_workers=0):
        pass


def ram_epoch(limit: SortedGather) -> None:
    for _batch in limit:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10/test-png"))
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/first_epoch.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        source = packdata.open_source(folder)
        paths = {c: packdata.convert(source, Path(tmp) / t, workers=2).path
                 for c, t in TARGETS.items()}
        ds = packdata.open(paths["hdf5"], verify="off")
        images = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["image"])
        labels = np.arange(len(ds), dtype=np.int64)
        limit = SortedGather(images, labels)
        names = [f"{c} {v}" for c in paths for v in ("full", "off")]
        ratios: dict[str, list[float]] = {name: [] for name in names}
        cpu_ratios: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            ram, ram_cpu = timed(lambda: ram_epoch(limit))
            for name in names:
                container, verify = name.split()
                wall, cpu = timed(lambda c=container, v=verify: open_and_epoch(paths[c], v))
                ratios[name].append(ram / wall)
                cpu_ratios[name].append(ram_cpu / cpu)
        rows = {name: {"ratio": statistics.median(ratios[name]), "per_round": ratios[name],
                       "cpu_ratio": statistics.median(cpu_ratios[name]),
                       "cpu_per_round": cpu_ratios[name]} for name in names}
        for name, row in rows.items():
            print(f"{name:10s} open + first epoch / in-RAM limit: {row['ratio']:.2f} "
                  f"(in CPU time of this process: {row['cpu_ratio']:.2f})", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "command": "python bench/bench_first_epoch.py " + " ".join(sys.argv[1:]),
        "count": args.count, "rounds": args.rounds, "load_average": os.getloadavg(),
        "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
