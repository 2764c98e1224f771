"""What writing the DALI and wids indexes adds to a tar conversion.

    python bench/bench_index.py [--data ../shared/data/cifar10/test-png] [--rounds 5]

Converts the folder to tar shards (raw pixels, 1,000 records a shard) with the indexes and,
interleaved, with index writing switched off (the same code with the index calls replaced by
no-ops): the baseline of the same run. Reports the median of each and their ratio. On a shared
machine that ratio is noise-bound (conversions vary by tens of percent), so the conversions with
indexes also time the index calls themselves (write_idx, write_wids_index, wrapped with a
clock; per record the writer only appends the member key to a list): their share of that same
conversion's time is the figure to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import packdata
from packdata.containers.tar import writer as tar  # where the index writers are called


def clocked(fn, spent: list[float]):
    """``fn``, adding its wall time to ``spent[0]`` and its CPU time (this thread) to
    ``spent[1]``: on a busy machine the wall time also counts time the process waited."""
    def call(*args):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += time.thread_time() - cpu
    return call


def convert_once(src: Path, dst: Path, indexes: bool, spent: list[float]) -> float:
    names = ("write_idx", "write_wids_index")
    patches = [mock.patch.object(tar, n, clocked(getattr(tar, n), spent)) for n in names] \
        if indexes else [mock.patch.object(tar, "write_idx", lambda *a: None),
                         mock.patch.object(tar, "write_wids_index", lambda *a: None)]
    for p in patches:
        p.start()
    try:
        start = time.perf_counter()
        packdata.convert(packdata.open_source(src), dst, container="tar",
                         container_options={"shard_size": "1000"})
        return time.perf_counter() - start
    finally:
        for p in patches:
            p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10/test-png"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/index.json"))
    args = parser.parse_args()
    times: dict[str, list[float]] = {"with indexes": [], "without": []}
    shares, cpu_shares = [], []
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        for r in range(args.rounds):
            for label in (("with indexes", "without") if r % 2 else ("without", "with indexes")):
                dst = Path(tmp) / f"{label.replace(' ', '-')}-{r}"
                spent = [0.0, 0.0]
                times[label].append(convert_once(args.data, dst, label == "with indexes", spent))
                if label == "with indexes":
                    shares.append(spent[0] / times[label][-1])
                    cpu_shares.append(spent[1] / times[label][-1])
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"command": "python bench/bench_index.py", "rounds": args.rounds,
              "median_s": {k: round(v, 3) for k, v in med.items()},
              "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
              "ratio_of_medians": round(med["with indexes"] / med["without"], 4),
              "index_calls_share_of_conversion": {
                  "median": round(statistics.median(shares), 5), "max": round(max(shares), 5)},
              "index_calls_cpu_share_of_conversion": {
                  "median": round(statistics.median(cpu_shares), 5),
                  "max": round(max(cpu_shares), 5)}}
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
