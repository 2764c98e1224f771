"""Containers vs the per-file Dataset vs an in-RAM numpy gather, on 50,000 real CIFAR-10 PNGs.

    python bench/bench_containers.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--json bench/results/containers.json]

Builds a one-PNG-per-sample folder by repeating the real test images, converts it into every
container (2 workers, timed, peak memory of the conversion process tree), then measures
samples/s delivered to a loop that touches every batch (batch 256; 0 and 2 DataLoader workers).
Rates are medians of interleaved rounds; each container's ratio to the RAM gather is the median
of per-round ratios (each round times the RAM gather and every container back to back), since
absolute numbers move with the machine's load.
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
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/containers.json"))
    args = parser.parse_args()

    rows = []
    converted: dict[str, dict] = {}
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
        datasets = {}
        for container, name in TARGETS.items():
            before = peak_rss_mib()
            result = packdata.convert(source, Path(tmp) / name, workers=2)
            datasets[container] = packdata.open(result.path)
            converted[container] = {
                "convert_s": result.seconds, "peak_rss_mib_before_after": [before, peak_rss_mib()],
                "bytes_on_disk": packdata.containers.base.disk_size(result.path)}
        everything = datasets["hdf5"].reader.read(np.arange(args.count))
        arrays = (everything["image"], everything["label"])

        # Interleaved rounds: each container is timed right beside the RAM gather, and its
        # ratio is the median of per-round ratios, so machine noise hits both sides alike.
        rates: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            rates.setdefault(("ram", 0), []).append(
                sample_rate(lambda: InMemoryBatches(*arrays, BATCH), min_seconds=args.seconds))
            for container, ds in datasets.items():
                for workers in (0, 2):
                    rates.setdefault((container, workers), []).append(sample_rate(
                        lambda ds=ds, w=workers: packdata.loader(
                            ds, BATCH, num_workers=w, persistent_workers=w > 0),
                        min_seconds=args.seconds))
        ram = float(np.median(rates["ram", 0]))
        for (container, workers), values in rates.items():
            if container == "ram":
                continue
            ratios = [v / r for v, r in zip(values, rates["ram", 0])]
            rows.append({"loader": f"packdata {container}", "workers": workers,
                         "samples_per_s": float(np.median(values)),
                         "vs_ram_median_of_rounds": float(np.median(ratios)),
                         **converted[container]})
        rows.append({"loader": "numpy array in RAM", "workers": 0, "samples_per_s": ram,
                     "vs_ram_median_of_rounds": 1.0})
        del datasets

    for row in rows:
        row["vs_per_file_same_workers"] = row["samples_per_s"] / base[row["workers"]]
        row["vs_per_file_best"] = row["samples_per_s"] / max(base.values())
        row.setdefault("vs_ram_median_of_rounds", row["samples_per_s"] / ram)
    report = {"count": args.count, "batch_size": BATCH, "cpus": os.cpu_count(),
              "time": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print("| loader | workers | samples/s | × per-file (best) | × RAM | convert s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        conv = f"{r['convert_s']:.1f}" if "convert_s" in r else ""
        print(f"| {r['loader']} | {r['workers']} | {r['samples_per_s']:,.0f} | "
              f"{r['vs_per_file_best']:.1f} | {r['vs_ram_median_of_rounds']:.2f} | {conv} |")


if __name__ == "__main__":
    main()
