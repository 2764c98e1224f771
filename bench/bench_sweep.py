"""`packdata bench --sweep` on 50,000 real CIFAR-10 images: how long the whole run takes.

    python bench/bench_sweep.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--workdir DIR] [--json bench/results/bench_sweep.json]

Builds a one-PNG-per-sample folder by repeating the real test images and converts it to LMDB
(not timed: that is `packdata convert`'s job), then runs the bench with its defaults (small CNN
on CPU, batch 256, 50 steps, 5 warm-up steps) plus the default sweep (num_workers 0…cores ×
prefetch_factor × persistent_workers, 9 configurations on 2 cores, each run 3 times in
interleaved rounds within the 60 s budget), and reports the wall time of the whole bench and of
the sweep alone, and whether the sweep found a winner beyond the spread or a tie.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from _shared import CIFAR_PNG, parser
from bench_containers import build_folder
from rich.console import Console

import packdata
from packdata.bench.report import print_report, sweep_summary, write_json
from packdata.bench.settings import BenchSettings
from packdata.bench.suite import run_bench


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, results="bench_sweep.json")
    p.add_argument("--workdir", type=Path, help="keep (and reuse) the folder and LMDB here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        root = args.workdir or Path(tmp)
        folder, lmdb = root / f"png-{args.count}", root / f"cifar-{args.count}.lmdb"
        if not folder.exists():
            build_folder(args.data, folder, args.count)
        if not lmdb.exists():
            packdata.convert(packdata.open_source(folder), lmdb, workers=os.cpu_count() or 1)
        start = time.perf_counter()
        result = run_bench(lmdb, BenchSettings(), sweep=True,
                           log=lambda m: print(f"[{time.perf_counter() - start:6.1f} s] {m}"))
        total = time.perf_counter() - start
    print_report(result, Console(width=120))
    sweep = result["sweep"]
    print(f"whole bench: {total:.0f} s; sweep of {len(sweep['rows'])} configurations × "
          f"{sweep['repeats']} runs: {sweep['seconds']:.0f} s on {os.cpu_count()} cores")
    for where in [result["dataset"], *(run["input"] for run in result["runs"])]:
        where["path"] = Path(where["path"]).name  # no machine paths in committed results
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json({"count": args.count, "time": time.strftime("%Y-%m-%d %H:%M"),
                "bench_seconds": total, "sweep_seconds": sweep["seconds"],
                "configurations": len(sweep["rows"]), "repeats": sweep["repeats"],
                "conclusion": sweep_summary(sweep), "result": result}, args.json)


if __name__ == "__main__":
    main()
