"""Open + first epoch against the in-RAM limit, per container, as a user starts training.

    python bench/bench_first_epoch.py [--data ../shared/data/cifar10/test-png] [--count 20000]
        [--rounds 5] [--lidar ../shared/data/lidar/trees --clouds 1280]
        [--json bench/results/first_epoch.json]

Converts ``--count`` real CIFAR-10 PNGs (repeated) into every container, then, in interleaved
rounds: one epoch of the in-RAM limit (shuffled batches of 256 gathered from arrays in RAM, each
batch's indices sorted: bench_containers' SortedGather), and for each container a fresh
``packdata.open`` (default verify: every record checked) plus one shuffled epoch of
``packdata.loader(ds, 256, shuffle=True)`` in the main process (each batch a random draw, as the
limit's: an epoch in index order would read the file front to back). Reported: the median of
per-round ratios (limit seconds / open-and-epoch seconds), in wall time and in this process's
CPU time (which the machine's other jobs do not inflate).

Each container is measured twice a round: reopened in this process (``reopen``: what a script
that opens per epoch pays; LMDB keeps one environment per file and process, and HDF5 and tar
keep their files' maps and what they read of the files' structure in the process
(packdata/kept.py), so the map, and the page-table entries of pages already read, outlive the
dataset), and opened for the first time in a fresh process (``process``: what a spawned
worker, a DDP rank or a new run pays; timed in the child from ``packdata.open`` to the end of
the epoch, the interpreter's start and the imports of numpy, torch, the container libraries and
every packdata module of the read side left out). With every record checked, both again with 2
reading threads (``num_workers=2``: what the hashing costs when split over two cores).

The floor of the fresh-process rows (``fresh map``): the limit's own gather of the same
batches, in a new process, from the HDF5 file mapped afresh instead of from arrays in RAM: what
mapping the pages an epoch reads costs (a first touch of each), before any reader's work.

With ``--lidar DIR`` the same for presampled point clouds instead: the LAS/LAZ files of DIR
tiled to ``--clouds`` clouds, converted with 4 variants of 4,096 points (random sampling), read
in batches of 16 (each record's variant for the epoch: ``select``), against a gather of the same
variants from an array of every record's K variants in RAM.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch
from _shared import (
    CIFAR_PNG,
    command_line,
    drain,
    interleaved,
    parser,
    tile_clouds,
    timed,
    write_results,
)
from bench_containers import TARGETS, SortedGather, build_folder

import packdata
from packdata import sources
from packdata.containers.base import gather_rows

CLOUD_BATCH = 16
FRESH = """
import importlib, json, pkgutil, sys, time
# imports left out of the time (numpy's random and ma are imported by its functions on first use)
import h5py, lmdb, numpy, numpy.ma, numpy.random, torch, xxhash, packdata
# every packdata module the read side can import lazily, imported now: where Python does not
# keep compiled bytecode (PYTHONDONTWRITEBYTECODE), a first import compiles its source, which
# an installed package does not pay
for module in pkgutil.walk_packages(packdata.__path__, "packdata."):
    if not module.name.startswith(("packdata.cli", "packdata.bench", "packdata.__main__")):
        importlib.import_module(module.name)
path, verify, batch, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
wall, cpu = time.perf_counter(), time.process_time()
ds = packdata.open(path, verify=verify)
for _ in packdata.loader(ds, batch, shuffle=True, num_workers=workers, feeder=False):
    pass
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]))
"""
# the floor of a first open: the limit's gather, from the file mapped afresh in a new process
FRESH_MAP = """
import json, sys, time
import numpy, torch, packdata
from packdata.containers.base import gather_rows, map_file
path, offset, count, row_bytes, batch = sys.argv[1], *(int(a) for a in sys.argv[2:6])
served = numpy.load(sys.argv[6])
order = numpy.random.default_rng().permutation(len(served))
wall, cpu = time.perf_counter(), time.process_time()
rows = map_file(path)[offset : offset + count * row_bytes].reshape(count, row_bytes)
for start in range(0, len(order), batch):
    gather_rows(rows, served[numpy.sort(order[start : start + batch])])
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]))
"""


def open_and_epoch(path: Path, verify: str, batch: int = 256,
                   workers: int = 0) -> packdata.PackedDataset:
    ds = packdata.open(path, verify=verify)
    drain(packdata.loader(ds, batch, shuffle=True, num_workers=workers, feeder=False))
    return ds


def in_new_process(script: str, *args: object) -> tuple[float, float]:
    """Wall and CPU seconds that ``script`` timed and printed, run in a new process."""
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)],
                          capture_output=True, text=True, check=True)
    wall, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, cpu


def runs_of(paths: dict[str, Path], prefix: str, batch: int) -> dict:
    """Every container and level, reopened here and first opened in a fresh process; and, every
    record checked, the same with 2 reading threads (``num_workers=2``)."""
    runs = {}
    for c, path in paths.items():
        for v, workers in (("full", 0), ("off", 0), ("full", 2)):
            name = f"{prefix}{c} {v}" + (f", {workers} threads" if workers else "")
            runs[f"{name} reopen"] = lambda p=path, v=v, w=workers: timed(
                lambda: open_and_epoch(p, v, batch, w))
            runs[f"{name} process"] = lambda p=path, v=v, w=workers: in_new_process(
                FRESH, p, v, batch, w)
    return runs


def fresh_map_run(path: Path, field: str, served: np.ndarray, rows_per_record: int,
                  batch: int, tmp: Path):
    """The floor of a first open in a new process: the limit's gather of the ``served`` row of
    each record (rows of HDF5 dataset ``field``, ``rows_per_record`` a record) from the file
    mapped afresh, where every page the epoch reads is mapped on first touch."""
    offset, count, row_bytes = stored_rows(path, field, rows_per_record)
    plan = tmp / f"{field}-served.npy"
    np.save(plan, served)
    return lambda: in_new_process(FRESH_MAP, path, offset, count, row_bytes, batch, plan)


def stored_rows(path: Path, field: str, rows_per_record: int) -> tuple[int, int, int]:
    """(byte offset, rows, bytes a row) of HDF5 dataset ``field`` in the file at ``path``,
    ``rows_per_record`` rows a record (a point cloud's variants)."""
    with h5py.File(path, "r") as f:
        stored = f[field]
        rows = stored.shape[0] * rows_per_record
        return (stored.id.get_offset(), rows,
                stored.dtype.itemsize * int(np.prod(stored.shape[1:])) // rows_per_record)


class VariantGather:
    """The point-cloud limit: shuffled batches, each batch's indices sorted, of the variant
    each record serves in epoch 0, gathered from every record's K variants in RAM by the gather
    the readers use (``gather_rows``, over rows of one variant each)."""

    def __init__(self, points: np.ndarray, manifest, seed: int = 0) -> None:
        self.points, self.manifest = points, manifest
        self.k = points.shape[1]
        self.variant_rows = np.ascontiguousarray(points).reshape(
            len(points) * self.k, -1).view(np.uint8)
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        select = sources.get("pointcloud").select
        order = self.rng.permutation(len(self.points))
        for start in range(0, len(order), CLOUD_BATCH):
            idx = np.sort(order[start : start + CLOUD_BATCH])
            rows = idx * self.k + select(self.manifest, idx, 0)["points"]
            yield torch.from_numpy(gather_rows(self.variant_rows, rows, dtype=self.points.dtype,
                                               shape=self.points.shape[2:]))


def cifar_runs(args, tmp: Path):
    folder = build_folder(args.data, tmp / "png", args.count)
    source = packdata.open_source(folder)
    paths = {c: packdata.convert(source, tmp / t, workers=2).path for c, t in TARGETS.items()}
    ds = packdata.open(paths["hdf5"], verify="off")
    images = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["image"])
    limit = SortedGather(images, np.arange(len(ds), dtype=np.int64))
    floor = fresh_map_run(paths["hdf5"], "image", np.arange(len(ds)), 1, 256, tmp)
    return limit, {"fresh map process": floor, **runs_of(paths, "", 256)}


def lidar_runs(args, tmp: Path):
    folder = tile_clouds(args.lidar, tmp / "clouds", args.clouds)
    source = packdata.open_source(folder, points=4096, variants=4, sampling="random")
    paths = {c: packdata.convert(source, tmp / f"pc-{t}", workers=2).path
             for c, t in TARGETS.items()}
    ds = packdata.open(paths["hdf5"], verify="off")
    points = np.ascontiguousarray(ds.reader.read(np.arange(len(ds)))["points"])
    limit = VariantGather(points, ds.manifest)
    k = points.shape[1]
    served = np.arange(len(ds)) * k + sources.get("pointcloud").select(
        ds.manifest, np.arange(len(ds)), 0)["points"]
    floor = fresh_map_run(paths["hdf5"], "points", served, k, CLOUD_BATCH, tmp)
    return limit, {"lidar-fresh map process": floor, **runs_of(paths, "lidar-", CLOUD_BATCH)}


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
            what = "map + gather" if "fresh map" in name else "open + first epoch"
            print(f"{name:32s} {what} / in-RAM limit: {rows[name]['ratio']:.2f} "
                  f"(in CPU time of this process: {rows[name]['cpu_ratio']:.2f})", flush=True)
    write_results(args.json, {"command": command_line(),
                              **({"clouds": args.clouds, "points": 4096, "variants": 4,
                                  "batch": CLOUD_BATCH} if args.lidar else
                                 {"count": args.count, "batch": 256}),
                              "rounds": args.rounds, "load_average": os.getloadavg(),
                              "rows": rows})


if __name__ == "__main__":
    main()
