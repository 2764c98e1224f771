"""Open + first epoch against the in-RAM limit, per container, as a user starts training.

    python bench/bench_first_epoch.py [--data ../shared/data/cifar10/test-png] [--count 20000]
        [--rounds 5] [--lidar ../shared/data/lidar/trees --clouds 1280]
        [--json bench/results/first_epoch.json]

Converts ``--count`` real CIFAR-10 PNGs (repeated) into every container, then, in interleaved
rounds: one epoch of the in-RAM limit (shuffled batches of 256 gathered from arrays in RAM, each
batch's indices sorted: bench_containers' SortedGather), and for each container a fresh
``packdata.open`` (default verify: every record checked) plus one epoch of
``packdata.loader(ds, 256)`` in the main process. Reported: the median of per-round ratios
(limit seconds / open-and-epoch seconds), in wall time and in this process's CPU time (which
the machine's other jobs do not inflate).

With ``--lidar DIR`` the same for presampled point clouds instead: the LAS/LAZ files of DIR
tiled to ``--clouds`` clouds, converted with 4 variants of 4,096 points (random sampling), read
in batches of 16 (each record's variant for the epoch: ``select``), against a gather of the same
variants from an array of every record's K variants in RAM.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from _shared import CIFAR_PNG, command_line, drain, interleaved, parser, timed, write_results
from bench_containers import TARGETS, SortedGather, build_folder

import packdata
from packdata import sources

CLOUD_BATCH = 16


def open_and_epoch(path: Path, verify: str, batch: int = 256) -> packdata.PackedDataset:
    ds = packdata.open(path, verify=verify)
    drain(packdata.loader(ds, batch, num_workers=0))
    return ds


class VariantGather:
    """The point-cloud limit: shuffled batches, each batch's indices sorted, of the variant
    each record serves in epoch 0, gathered from every record's K variants in RAM."""

    def __init__(self, points: np.ndarray, manifest, seed: int = 0) -> None:
        self.points, self.manifest = points, manifest
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        select = sources.get("pointcloud").select
        order = self.rng.permutation(len(self.points))
        for start in range(0, len(order), CLOUD_BATCH):
            idx = np.sort(order[start : start + CLOUD_BATCH])
            yield torch.from_numpy(self.points[idx, select(self.manifest, idx, 0)["points"]])


def cifar_runs(args, tmp: Path):
    folder = build_folder(args.data, tmp / "png", args.count)
    source = packdata.open_source(folder)
    paths = {c: packdata.convert(source, tmp / t, workers=2).path for c, t in TARGETS.items()}
    ds = packdata.open(paths["hdf5"], verify="off")
    images = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["image"])
    limit = SortedGather(images, np.arange(len(ds), dtype=np.int64))
    return limit, {f"{c} {v}": lambda c=c, v=v: timed(lambda: open_and_epoch(paths[c], v))
                   for c in paths for v in ("full", "off")}


def lidar_runs(args, tmp: Path):
    files = sorted(args.lidar.glob("*.la[sz]"))
    if not files:
        raise SystemExit(f"{args.lidar}: no .las or .laz files in this folder")
    folder = tmp / "clouds"
    folder.mkdir()
    for i in range(args.clouds):
        shutil.copy(files[i % len(files)], folder / f"{i:05d}_{files[i % len(files)].name}")
    source = packdata.open_source(folder, points=4096, variants=4, sampling="random")
    paths = {c: packdata.convert(source, tmp / f"pc-{t}", workers=2).path
             for c, t in TARGETS.items()}
    ds = packdata.open(paths["hdf5"], verify="off")
    points = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["points"])
    limit = VariantGather(points, ds.manifest)
    return limit, {f"lidar-{c} {v}": lambda c=c, v=v: timed(
        lambda: open_and_epoch(paths[c], v, CLOUD_BATCH)) for c in paths for v in ("full", "off")}


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=20_000, rounds=5, results="first_epoch.json")
    p.add_argument("--lidar", type=Path, default=None,
                   help="a folder of LAS/LAZ files: measure presampled point clouds instead")
    p.add_argument("--clouds", type=int, default=1280)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        limit, runs = (lidar_runs if args.lidar else cifar_runs)(args, Path(tmp))
        times = interleaved(args.rounds, {"limit": lambda: timed(lambda: drain(limit)), **runs})
        rows = {}
        for name in runs:
            wall = [ram[0] / t[0] for ram, t in zip(times["limit"], times[name])]
            cpu = [ram[1] / t[1] for ram, t in zip(times["limit"], times[name])]
            rows[name] = {"ratio": statistics.median(wall), "per_round": wall,
                          "cpu_ratio": statistics.median(cpu), "cpu_per_round": cpu}
            print(f"{name:16s} open + first epoch / in-RAM limit: {rows[name]['ratio']:.2f} "
                  f"(in CPU time of this process: {rows[name]['cpu_ratio']:.2f})", flush=True)
    write_results(args.json, {"command": command_line(),
                              **({"clouds": args.clouds, "points": 4096, "variants": 4,
                                  "batch": CLOUD_BATCH} if args.lidar else
                                 {"count": args.count, "batch": 256}),
                              "rounds": args.rounds, "load_average": os.getloadavg(),
                              "rows": rows})


if __name__ == "__main__":
    main()
