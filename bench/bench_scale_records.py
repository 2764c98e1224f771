"""Cost in the number of records: conversion peak memory, open time and memory, DataLoader
workers' memory, per container.

    python bench/bench_scale_records.py [--counts 10000 1000000 10000000]
        [--containers hdf5 lmdb tar] [--json bench/results/scale_records.json]

Synthetic documents from a generator (4 words each, one JSONL line, seeded) converted through
the public API (``packdata.convert(packdata.open_source(FILE, kind="text",
tokenizer="bytes"), DST, workers=1)``) in a fresh process each, whose peak resident memory is
reported; then, in another fresh process, ``packdata.open`` plus reading the first and last
record: seconds and resident memory added, cold (imports included) and warm (every module
already imported by a first open, as in a DataLoader worker); then, in a third fresh process,
an epoch of a stock DataLoader with 4 forked workers (persistent, batch 256) over a fixed
subset of the records (:data:`EPOCH_RECORDS` spread evenly over the dataset, so the reads reach
every part of it), and the memory of the workers read from ``/proc/PID/smaps_rollup`` before
they exit: summed PSS (shared pages split among their users) and USS (pages only that worker
holds). Rows are written to the JSON as they are measured.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import command_line, parser, write_results

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu"]
TARGETS = {"hdf5": "c.h5", "lmdb": "c.lmdb", "tar": "c-tar"}
EPOCH_RECORDS = 100_000

CONVERT = """
import sys, packdata
src = packdata.open_source(sys.argv[1], kind="text", tokenizer="bytes")
packdata.convert(src, sys.argv[2], workers=1)
"""
OPEN = """
import gc, json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
import numpy, torch, packdata
if sys.argv[2] == "warm":
    ds = packdata.open(sys.argv[1]); ds[0]; del ds; gc.collect()
before, start = rss(), time.perf_counter()
ds = packdata.open(sys.argv[1])
ds[0], ds[len(ds) - 1]
print(json.dumps({"seconds": time.perf_counter() - start, "rss_added_mib": rss() - before}))
"""
WORKERS = """
import json, os, sys
import numpy as np, torch, packdata
from torch.utils.data import DataLoader, Subset

def count(rows):
    return len(rows)

def rollup(pid):
    got = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                got[name] = int(rest.split()[0]) / 1024
    return got

def children():
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry))
    return found

ds = packdata.open(sys.argv[1])
subset = Subset(ds, np.linspace(0, len(ds) - 1, min(len(ds), int(sys.argv[2]))).astype(int).tolist())
loader = DataLoader(subset, batch_size=256, num_workers=4, persistent_workers=True,
                    collate_fn=count, multiprocessing_context="fork")
seen = sum(loader)
assert seen == len(subset), seen
pids = children()
assert len(pids) == 4, pids
rolls = [rollup(p) for p in pids]
print(json.dumps({"records": seen, "pss_mib": sum(r["Pss"] for r in rolls),
                  "uss_mib": sum(r["Private_Clean"] + r["Private_Dirty"] for r in rolls)}))
"""


def corpus(path: Path, count: int) -> Path:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(count):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(4))}) + "\n")
    return path


def peak_mib(args: list[str]) -> float:
    """Run ``args``; the peak resident memory of that process (MiB)."""
    proc = subprocess.Popen(args, env={**os.environ})
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{args} failed ({status})")
    return usage.ru_maxrss / 1024


def main() -> None:
    p = parser(__doc__, results="scale_records.json")
    p.add_argument("--counts", type=int, nargs="+", default=[10_000, 1_000_000, 10_000_000])
    p.add_argument("--containers", nargs="+", default=list(TARGETS))
    args = p.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="packdata-scale-") as tmp:
        # the corpus (34 bytes a document) and the three datasets of the largest count
        free, need = shutil.disk_usage(tmp).free, max(args.counts) * 34 * 8
        if free < need:
            raise SystemExit(f"{tmp}: {free >> 20} MiB free, about {need >> 20} MiB needed")
        for count in args.counts:
            src = corpus(Path(tmp) / f"corpus-{count}.jsonl", count)
            for container in args.containers:
                dst = Path(tmp) / f"{count}" / TARGETS[container]
                dst.parent.mkdir(exist_ok=True)
                start = time.perf_counter()
                peak = peak_mib([sys.executable, "-c", CONVERT, str(src), str(dst)])
                row = {"records": count, "container": container, "convert_peak_mib": peak,
                       "convert_s": time.perf_counter() - start,
                       "load_average": [round(x, 2) for x in os.getloadavg()]}
                for mode in ("cold", "warm"):
                    out = subprocess.run([sys.executable, "-c", OPEN, str(dst), mode],
                                         capture_output=True, text=True, check=True).stdout
                    got = json.loads(out)
                    row[f"open_2_reads_s_{mode}"] = got["seconds"]
                    row[f"open_2_reads_rss_mib_{mode}"] = got["rss_added_mib"]
                out = subprocess.run([sys.executable, "-c", WORKERS, str(dst),
                                      str(EPOCH_RECORDS)],
                                     capture_output=True, text=True, check=True).stdout
                got = json.loads(out.splitlines()[-1])
                row.update({"epoch_records": got["records"],
                            "workers_4_pss_mib": got["pss_mib"],
                            "workers_4_uss_mib": got["uss_mib"]})
                shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
                rows.append(row)
                print(json.dumps(row), flush=True)
                write(args.json, rows)
            src.unlink()


def write(path: Path, rows: list[dict]) -> None:
    write_results(path, {
        "command": command_line(),
        "epoch": f"stock DataLoader, 4 forked persistent workers, batch 256, over "
                 f"{EPOCH_RECORDS:,} records spread evenly over the dataset",
        "rows": rows})


if __name__ == "__main__":
    main()
