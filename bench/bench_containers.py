"""Containers vs the per-file Dataset vs an in-RAM numpy gather, on 50,000 real CIFAR-10 PNGs.

    python bench/bench_containers.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--json bench/results/containers.json]

Builds a one-PNG-per-sample folder by repeating the real test images, converts it into every
container (2 workers, timed, peak memory of the conversion process tree), then measures
samples/s delivered to a loop that touches every batch (batch 256), for each container:

- ``packdata.loader`` with 0 workers, 2 workers (its default kind: threads in the training
  process) and 2 worker processes (``workers="process"``);
- the drop-in stock ``DataLoader(ds, batch_size=256, shuffle=True)``, 0 and 2 worker processes;

against the limit: an in-RAM gather of each batch's sorted indices (within-batch order is free
in SGD), by the gather the readers use (``gather_rows``). Rates are medians of interleaved
rounds; each ratio is the median of per-round ratios (each round times the RAM gather and every
loader back to back), since absolute numbers move with the machine's load. Loaders are built
once, so worker processes persist across passes.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _shared import CIFAR_PNG, build_folder, command_line, parser, write_results
from torch.utils.data import DataLoader

import packdata
import packdata.containers.base
from packdata.bench.baselines import PerFileImageDataset
from packdata.bench.throughput import sample_rate

BATCH = 256
TARGETS = {"lmdb": "cifar.lmdb", "hdf5": "cifar.h5", "tar": "cifar-tar"}


LOADERS = {  # name -> how a user builds it over a packed dataset
    "packdata.loader": lambda ds, w: packdata.loader(ds, BATCH, shuffle=True, num_workers=w,
                                                     feeder=False),
    "packdata.loader processes": lambda ds, w: packdata.loader(
        ds, BATCH, shuffle=True, num_workers=w, workers="process"),
    "stock DataLoader": lambda ds, w: DataLoader(ds, batch_size=BATCH, shuffle=True,
                                                 num_workers=w, persistent_workers=w > 0),
}
CONFIGS = [("packdata.loader", 0), ("packdata.loader", 2), ("packdata.loader processes", 2),
           ("stock DataLoader", 0), ("stock DataLoader", 2)]


class SortedGather:
    """The limit: shuffled batches gathered from N×C×H×W arrays in RAM, each batch's indices
    sorted, by the gather packdata's readers use (``gather_rows``: its native routine where the
    C extension was built): what the same batches cost with every byte already in RAM."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, seed: int = 0) -> None:
        self.images, self.labels = images, labels
        self.image_rows, self.label_rows = rows_of(images), rows_of(labels)
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        gather = packdata.containers.base.gather_rows
        order = self.rng.permutation(len(self.images))
        for start in range(0, len(order), BATCH):
            idx = np.sort(order[start : start + BATCH])
            images = gather(self.image_rows, idx, dtype=self.images.dtype,
                            shape=self.images.shape[1:])
            labels = gather(self.label_rows, idx, dtype=self.labels.dtype,
                            shape=self.labels.shape[1:])
            yield torch.from_numpy(images), torch.from_numpy(labels)


def rows_of(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's records as rows of bytes (what ``gather_rows`` takes)."""
    return np.ascontiguousarray(array).reshape(len(array), -1).view(np.uint8)


def peak_rss_mib() -> float:
    """Peak resident memory of this process and, separately, its largest child (MiB)."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(me, kids) / 1024


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=5, results="containers.json")
    p.add_argument("--seconds", type=float, default=1.0)
    args = p.parse_args()

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
        # N×C×H×W, as the loaders serve them: a gather is the contiguous batch
        arrays = tuple(t.numpy() for t in datasets["hdf5"].get_batch(np.arange(args.count)))
        loaders = {(c, name, w): LOADERS[name](ds, w)
                   for c, ds in datasets.items() for name, w in CONFIGS}

        # Interleaved rounds: each loader is timed right beside the RAM gather, and its ratio
        # is the median of per-round ratios, so machine noise hits both sides alike.
        rates: dict[tuple, list[float]] = {}
        for r in range(args.rounds):
            rates.setdefault(("ram",), []).append(
                sample_rate(lambda r=r: SortedGather(*arrays, seed=r), min_seconds=args.seconds))
            for key, dl in loaders.items():
                rates.setdefault(key, []).append(
                    sample_rate(lambda dl=dl: dl, min_seconds=args.seconds))
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        ram = float(np.median(rates["ram",]))

        def ratio(key: tuple, base: tuple) -> float:
            return float(np.median([v / b for v, b in zip(rates[key], rates[base])]))

        for (container, name, workers) in loaders:
            key = (container, name, workers)
            rows.append({"loader": f"{name} {container}", "workers": workers,
                         "samples_per_s": float(np.median(rates[key])),
                         "vs_ram_median_of_rounds": ratio(key, ("ram",)),
                         "vs_packdata_loader_w0": ratio(key, (container, "packdata.loader", 0)),
                         "vs_same_loader_w0": ratio(key, (container, name.replace(
                             " processes", ""), 0)),
                         **converted[container]})
        rows.append({"loader": "gather of sorted indices in RAM (gather_rows)", "workers": 0,
                     "samples_per_s": ram, "vs_ram_median_of_rounds": 1.0})
        del datasets, loaders

    for row in rows:
        row["vs_per_file_same_workers"] = row["samples_per_s"] / base[row["workers"]]
        row["vs_per_file_best"] = row["samples_per_s"] / max(base.values())
        row.setdefault("vs_ram_median_of_rounds", row["samples_per_s"] / ram)
    report = {"command": command_line(), "count": args.count, "batch_size": BATCH,
              "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "time": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    write_results(args.json, report)
    print("| loader | workers | samples/s | × per-file (best) | × RAM | × packdata.loader w=0 "
          "| × same w=0 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        extra = [f"{r[k]:.2f}" if k in r else "" for k in ("vs_packdata_loader_w0",
                                                           "vs_same_loader_w0")]
        print(f"| {r['loader']} | {r['workers']} | {r['samples_per_s']:,.0f} | "
              f"{r['vs_per_file_best']:.1f} | {r['vs_ram_median_of_rounds']:.2f} | "
              f"{' | '.join(extra)} |")
    for c, conv in converted.items():
        print(f"convert {c}: {conv['convert_s']:.1f} s, {conv['bytes_on_disk'] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
