"""Cost in the number of records: conversion peak memory, open time and memory, per container.

    python bench/bench_scale_records.py [--counts 10000 100000 1000000]
        [--containers hdf5 lmdb tar] [--json bench/results/scale_records.json]

Synthetic documents from a generator (4 words each, one JSONL line, seeded) converted through
the public API (``packdata.convert(packdata.open_source(FILE, kind="text",
tokenizer="bytes"), DST, workers=1)``) in a fresh process each, whose peak resident memory is
reported; then, in another fresh process, ``packdata.open`` plus reading the first and last
record: seconds and resident memory added, cold (imports included) and warm (every module
already imported by a first open, as in a DataLoader worker).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from _shared import command_line, parser, write_results

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu"]
TARGETS = {"hdf5": "c.h5", "lmdb": "c.lmdb", "tar": "c-tar"}

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
    p.add_argument("--counts", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--containers", nargs="+", default=list(TARGETS))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="packdata-scale-") as tmp:
        for count in args.counts:
            src = corpus(Path(tmp) / f"corpus-{count}.jsonl", count)
            for container in args.containers:
                dst = Path(tmp) / f"{count}" / TARGETS[container]
                dst.parent.mkdir(exist_ok=True)
                peak = peak_mib([sys.executable, "-c", CONVERT, str(src), str(dst)])
                row = {"records": count, "container": container, "convert_peak_mib": peak}
                for mode in ("cold", "warm"):
                    out = subprocess.run([sys.executable, "-c", OPEN, str(dst), mode],
                                         capture_output=True, text=True, check=True).stdout
                    got = json.loads(out)
                    row[f"open_2_reads_s_{mode}"] = got["seconds"]
                    row[f"open_2_reads_rss_mib_{mode}"] = got["rss_added_mib"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_results(args.json, {"command": command_line(), "rows": rows})


if __name__ == "__main__":
    main()
