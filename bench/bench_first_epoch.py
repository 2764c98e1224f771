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

import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
from _shared import CIFAR_PNG, command_line, drain, interleaved, parser, timed, write_results
from bench_containers import TARGETS, SortedGather, build_folder

import packdata


def open_and_epoch(path: Path, verify: str) -> packdata.PackedDataset:
    ds = packdata.open(path, verify=verify)
    drain(packdata.loader(ds, 256, num_workers=0))
    return ds


def main() -> None:
    args = parser(__doc__, data=CIFAR_PNG, count=20_000, rounds=5,
                  results="first_epoch.json").parse_args()
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        source = packdata.open_source(folder)
        paths = {c: packdata.convert(source, Path(tmp) / t, workers=2).path
                 for c, t in TARGETS.items()}
        ds = packdata.open(paths["hdf5"], verify="off")
        images = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["image"])
        labels = np.arange(len(ds), dtype=np.int64)
        limit = SortedGather(images, labels)
        runs = {f"{c} {v}": lambda c=c, v=v: timed(lambda: open_and_epoch(paths[c], v))
                for c in paths for v in ("full", "off")}
        times = interleaved(args.rounds, {"limit": lambda: timed(lambda: drain(limit)), **runs})
        rows = {}
        for name in runs:
            wall = [ram[0] / t[0] for ram, t in zip(times["limit"], times[name])]
            cpu = [ram[1] / t[1] for ram, t in zip(times["limit"], times[name])]
            rows[name] = {"ratio": statistics.median(wall), "per_round": wall,
                          "cpu_ratio": statistics.median(cpu), "cpu_per_round": cpu}
            print(f"{name:10s} open + first epoch / in-RAM limit: {rows[name]['ratio']:.2f} "
                  f"(in CPU time of this process: {rows[name]['cpu_ratio']:.2f})", flush=True)
    write_results(args.json, {"command": command_line(), "count": args.count,
                              "rounds": args.rounds, "load_average": os.getloadavg(),
                              "rows": rows})


if __name__ == "__main__":
    main()
