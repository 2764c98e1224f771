"""Containers vs the per-file Dataset vs an in-RAM numpy gather, on 50,000 real CIFAR-10 PNGs.

    python bench/bench_containers.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--json bench/results/containers.json]

Builds a one-PNG-per-sample folder by repeating the real test images, converts it into every
container (2 workers, timed, peak memory of the conversion process tree), then measures
samples/s delivered to a loop that touches every batch (batch 256; 0 and 2 DataLoader workers).
All rates of one run are also given as ratios to the per-file baseline and to the RAM gather
measured in the same run, since absolute numbers move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

import packdata
import packdata.containers.base
from packdata.bench.baselines import InMemoryBatches, PerFileImageDataset
from packdata.bench.throughput import sample_rate

BATCH = 256
TARGETS = {"lmdb": "cifar.lmdb", "hdf5": "cifar.h5", "tar": "cifar-tar"}


def build_folder(data: Path, out: Path, count: int) -> Path:
    labels = json.loads((data.parent / "labels.json").read_text())
    names = sorted(labels["labels"])
    out.mkdir(parents=True)
    table = {}
    for i in range(count):
        name = names[i % len(names)]
        new = f"{Path(name).stem}_{i:06d}.png"
        shutil.copyfile(data / name, out / new)
        table[new] = labels["labels"][name]
    (out / "labels.json").write_text(json.dumps({"classes": labels["classes"], "labels": table}))
    return out


def peak_rss_mib() -> float:
    """Peak resident memory of this process and, separately, its largest child (MiB)."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(me, kids) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10/test-png"))
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/containers.json"))
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        per_file = PerFileImageDataset(folder, folder / "labels.json")
        base = {}
        for workers in (0, 2):
            base[workers] = sample_rate(
                lambda w=workers: DataLoader(per_file, batch_size=BATCH, shuffle=True,
                                             num_workers=w, persistent_workers=w > 0),
                min_seconds=args.seconds,
            )
            rows.append({"loader": "per-file PNG Dataset", "workers": workers,
                         "samples_per_s": base[workers]})
            print(rows[-1], file=sys.stderr)

        source = packdata.open_source(folder)
        arrays = None
        for container, name in TARGETS.items():
            before = peak_rss_mib()
            result = packdata.convert(source, Path(tmp) / name, workers=2)
            ds = packdata.open(result.path)
            if arrays is None:
                everything = ds.reader.read(np.arange(len(ds)))
                arrays = (everything["image"], everything["label"])
            for workers in (0, 2):
                rate = sample_rate(
                    lambda ds=ds, w=workers: packdata.loader(
                        ds, BATCH, num_workers=w, persistent_workers=w > 0),
                    min_seconds=args.seconds,
                )
                rows.append({"loader": f"packdata {container}", "workers": workers,
                             "samples_per_s": rate, "convert_s": result.seconds,
                             "peak_rss_mib_before_after": [before, peak_rss_mib()],
                             "bytes_on_disk": packdata.containers.base.disk_size(result.path)})
                print(rows[-1], file=sys.stderr)
            del ds
        ram = sample_rate(lambda: InMemoryBatches(*arrays, BATCH), min_seconds=args.seconds)
        rows.append({"loader": "numpy array in RAM", "workers": 0, "samples_per_s": ram})

    for row in rows:
        row["vs_per_file_same_workers"] = row["samples_per_s"] / base[row["workers"]]
        row["vs_per_file_best"] = row["samples_per_s"] / max(base.values())
        row["vs_ram"] = row["samples_per_s"] / ram
    report = {"count": args.count, "batch_size": BATCH, "cpus": os.cpu_count(),
              "time": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print("| loader | workers | samples/s | × per-file (best) | × RAM | convert s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        conv = f"{r['convert_s']:.1f}" if "convert_s" in r else ""
        print(f"| {r['loader']} | {r['workers']} | {r['samples_per_s']:,.0f} | "
              f"{r['vs_per_file_best']:.1f} | {r['vs_ram']:.2f} | {conv} |")


if __name__ == "__main__":
    main()
