"""Point clouds: a raw LAS/LAZ epoch against a presampled container epoch, and FPS speed/coverage.

    python bench/bench_pointclouds.py [--data ../shared/data/lidar] [--clouds 320] [--points 4096]

1. Epochs. The real clouds under DATA (LAS/LAZ, 1k–110k points) are tiled into a folder of
   CLOUDS files (symlinks, class sub-folders by origin). The raw workflow is the usual Dataset:
   ``__getitem__`` reads the file with laspy and draws N random points (the cheapest per-item
   sampling; per-item FPS would be far slower). The packed workflow converts once (FPS, K
   variants) into HDF5 and LMDB and iterates ``packdata.loader``. Both run in this process with
   batch 32, shuffled; the table gives samples/s, bytes read per epoch and sizes on disk.
2. FPS. A 1,000,000-point cloud (autzen_trim.laz tiled 5×2 with 5 cm jitter) is reduced to N
   points by packdata's FPS on one core, and by the textbook O(n·k) loop (exact FPS); the
   coverage radius (largest distance from any input point to its nearest sample) of both, and of
   random and voxel sampling, is reported.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import laspy
import numpy as np
import torch
from _shared import parser, tile_clouds, write_results
from torch.utils.data import DataLoader, Dataset

import packdata
from packdata.containers.base import disk_size
from packdata.prep.pointsample import (
    coverage_radius,
    farthest_point_sample,
    farthest_point_sample_reference,
    voxel_sample,
)
from packdata.sources.pointclouds import VARIANT_FIELDS

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "lidar"


class RawLasDataset(Dataset):
    """The workflow packdata replaces: read and sample each cloud on every access."""

    def __init__(self, files: list[Path], labels: list[int], points: int) -> None:
        self.files, self.labels, self.points = files, labels, points

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        las = laspy.read(self.files[i])
        xyz = np.stack([las.x, las.y, las.z], axis=1).astype(np.float32)
        replace = len(xyz) < self.points
        idx = np.random.choice(len(xyz), self.points, replace=replace)
        return torch.from_numpy(xyz[idx]), self.labels[i]


def tile(data: Path, dst: Path, count: int) -> tuple[list[Path], list[int]]:
    """``count`` clouds linked under ``dst/<data's name>`` (class sub-folders of ``data`` kept)
    and each one's class: the index of its folder's name."""
    tile_clouds(data, dst / data.name, count, link=True)
    files = sorted(p for p in dst.rglob("*") if p.suffix.lower() in (".las", ".laz"))
    classes = sorted({f.parent.name for f in files})
    return files, [classes.index(f.parent.name) for f in files]


def epoch_seconds(loader, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = sum(len(batch[0]) for batch in loader)
        times.append(time.perf_counter() - start)
        assert n == len(loader.dataset)
    return times


def bench_epochs(args, tmp: Path) -> dict:
    files, labels = tile(args.data, tmp / "clouds", args.clouds)
    raw_bytes = sum(f.stat().st_size for f in files)
    raw = RawLasDataset(files, labels, args.points)
    raw_times = epoch_seconds(DataLoader(raw, batch_size=32, shuffle=True), args.raw_repeats)
    result = {"clouds": len(files), "points": args.points, "variants": args.variants,
              "raw": {"epoch_s": raw_times, "samples_per_s": len(files) / statistics.median(raw_times),
                      "bytes_read_per_epoch": raw_bytes, "bytes_on_disk": raw_bytes},
              "packed": {}}
    for target in ("clouds.h5", "clouds.lmdb"):
        start = time.perf_counter()
        source = packdata.open_source(tmp / "clouds", points=args.points, sampling="fps",
                                      variants=args.variants, normalize="center")
        converted = packdata.convert(source, tmp / target, workers=args.workers)
        convert_s = time.perf_counter() - start
        ds = packdata.open(converted.path)
        loader = packdata.loader(ds, batch_size=32, shuffle=True, feeder=False)
        times = epoch_seconds(loader, args.packed_repeats)
        # a read gathers the served variant of the per-variant fields (select), the rest whole
        read = sum(f.nbytes // (args.variants if name in VARIANT_FIELDS else 1)
                   for name, f in ds.manifest.fields.items())
        served = ds.manifest.fields["points"].nbytes // args.variants
        result["packed"][converted.manifest.container] = {
            "convert_s": convert_s, "epoch_s": times,
            "samples_per_s": len(ds) / statistics.median(times),
            "bytes_read_per_epoch": read * len(ds),
            "bytes_served_per_epoch": served * len(ds),
            "bytes_on_disk": disk_size(converted.path),
        }
    return result


def cloud_1m(data: Path) -> np.ndarray:
    las = laspy.read(data / "laspy-samples" / "autzen_trim.laz")
    xyz = np.stack([las.x, las.y, las.z], axis=1)
    extent = xyz.max(axis=0) - xyz.min(axis=0)
    rng = np.random.default_rng(0)
    tiles = np.concatenate([xyz + [i * extent[0], j * extent[1], 0]
                            for i in range(5) for j in range(2)])
    tiles += rng.normal(0, 0.05, tiles.shape)
    return tiles[rng.permutation(len(tiles))[:1_000_000]]


def bench_fps(args) -> dict:
    torch.set_num_threads(1)
    xyz = cloud_1m(args.data)
    k = args.points
    times, cpu, chosen = [], [], None
    for _ in range(args.fps_repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        chosen = farthest_point_sample(xyz, k, start=0)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)  # on a shared machine, wall time overstates
    start = time.perf_counter()
    exact = farthest_point_sample_reference(xyz, k, start=0)
    exact_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    radius = {"fps": coverage_radius(xyz, chosen), "exact_fps": coverage_radius(xyz, exact),
              "voxel": coverage_radius(xyz, voxel_sample(xyz, k, rng)),
              "random": coverage_radius(xyz, rng.choice(len(xyz), k, replace=False))}
    return {"input_points": len(xyz), "k": k, "fps_s": times, "fps_cpu_s": cpu,
            "exact_fps_s": exact_s,
            "same_choices": float((chosen == exact).mean()), "coverage_radius_m": radius,
            "coverage_ratio_fps_to_exact": radius["fps"] / radius["exact_fps"]}


def main() -> None:
    p = parser(__doc__, data=DEFAULT_DATA, results="pointclouds.json")
    p.add_argument("--clouds", type=int, default=320)
    p.add_argument("--points", type=int, default=4096)
    p.add_argument("--variants", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--raw-repeats", type=int, default=2)
    p.add_argument("--packed-repeats", type=int, default=5)
    p.add_argument("--fps-repeats", type=int, default=3)
    p.add_argument("--skip-fps", action="store_true")
    p.add_argument("--skip-epochs", action="store_true")
    args = p.parse_args()
    epochs = None
    if not args.skip_epochs:
        with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
            epochs = bench_epochs(args, Path(tmp))
    fps = None if args.skip_fps else bench_fps(args)
    out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "python": sys.version.split()[0], "device": "cpu"},
           "epochs": epochs, "fps": fps}
    write_results(args.json, out)

    if epochs:
        print_epochs(epochs)
    if fps:
        print_fps(fps)


def print_epochs(epochs: dict) -> None:
    raw = epochs["raw"]
    print(f"{epochs['clouds']} clouds, N={epochs['points']}, K={epochs['variants']} (CPU)")
    print("| workflow | epoch s (median) | samples/s | speed-up | MiB read/epoch | MiB on disk |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| raw laspy + random sample | {statistics.median(raw['epoch_s']):.2f} | "
          f"{raw['samples_per_s']:,.0f} | 1× | {raw['bytes_read_per_epoch'] / 2**20:.1f} | "
          f"{raw['bytes_on_disk'] / 2**20:.1f} |")
    for name, p in epochs["packed"].items():
        print(f"| packed {name} (fps, converted in {p['convert_s']:.1f} s) | "
              f"{statistics.median(p['epoch_s']):.4f} | {p['samples_per_s']:,.0f} | "
              f"{p['samples_per_s'] / raw['samples_per_s']:,.0f}× | "
              f"{p['bytes_read_per_epoch'] / 2**20:.1f} | {p['bytes_on_disk'] / 2**20:.1f} |")


def print_fps(fps: dict) -> None:
    r = fps["coverage_radius_m"]
    runs = ", ".join(f"{t:.2f}" for t in fps["fps_s"])
    cpu = ", ".join(f"{t:.2f}" for t in fps["fps_cpu_s"])
    print(f"\nFPS {fps['input_points']:,} → {fps['k']:,} points, one core: packdata "
          f"{min(fps['fps_s']):.2f} s wall (runs {runs}; CPU {cpu}), textbook loop "
          f"{fps['exact_fps_s']:.1f} s; same choices {fps['same_choices']:.1%}")
    print("coverage radius (m): " + ", ".join(f"{k} {v:.3f}" for k, v in r.items())
          + f"; fps / exact = {fps['coverage_ratio_fps_to_exact']:.4f}")


if __name__ == "__main__":
    main()
