"""Conversion time and peak memory against dataset size: memory must not grow with the data.

    python bench/bench_convert.py [--data ../shared/data/cifar10/test-png] [--counts 10000 50000]

For each size, a folder of that many real CIFAR-10 PNGs is converted into every container by a
fresh process (2 workers); the table gives wall time, images/s and the peak resident memory of the
converting process and of its largest worker.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

# first, while this process is small: h5py's import runs `uname -p`, a child forked from this
# process whose peak is this process's size when it forks, and counted among the children read
# below as if it were a worker
import h5py  # noqa: F401
from _shared import CIFAR_PNG, parser, write_results
from bench_containers import TARGETS, build_folder


def child(folder: str, dst: str) -> None:
    import packdata

    result = packdata.convert(packdata.open_source(folder), dst, workers=2)
    print(json.dumps({
        "seconds": result.seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }))


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, results="convert.json")
    p.add_argument("--counts", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        for count in args.counts:
            folder = build_folder(args.data, Path(tmp) / f"png{count}", count)
            for container, name in TARGETS.items():
                dst = Path(tmp) / f"{count}-{name}"
                out = subprocess.run([sys.executable, __file__, "--child", str(folder), str(dst)],
                                     check=True, capture_output=True, text=True).stdout
                rows.append({"count": count, "container": container, **json.loads(out)})
                print(rows[-1], file=sys.stderr)
    write_results(args.json, rows)
    print("| images | container | seconds | images/s | peak RSS main (MiB) | peak RSS worker (MiB) |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['count']:,} | {r['container']} | {r['seconds']:.1f} | "
              f"{r['count'] / r['seconds']:,.0f} | {r['peak_rss_mib']:.0f} | "
              f"{r['peak_worker_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
