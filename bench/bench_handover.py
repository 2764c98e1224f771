"""Where a stock DataLoader's batches cost CPU with worker processes, against none (Linux).

    python bench/bench_handover.py DATASET [--rounds 5] [--epochs 20] [--json out.json]

DATASET is any packdata dataset of raw records (e.g. ``packdata convert ./cifar-png cifar.h5``).
Each round times ``DataLoader(ds, 256, shuffle=True)`` with ``num_workers=0`` and with
``num_workers=2, persistent_workers=True`` back to back, and reads the CPU time each process
spent per batch (the training process from ``time.process_time``, each worker from
``/proc/PID/stat``, in clock ticks: run enough epochs for a few hundred batches). On a machine
whose cores are shared, the rate with workers follows the CPU all processes spend per batch,
not the training process's alone.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from _shared import interleaved, parser, ratio_of_rounds, write_results
from torch.utils.data import DataLoader

import packdata

BATCH = 256
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def timed(loader: DataLoader, epochs: int, workers: list[int]) -> dict[str, float]:
    """Batches per second and CPU milliseconds per batch, here and in each worker."""
    here, there = time.process_time(), [cpu_seconds(p) for p in workers]
    start, batches = time.perf_counter(), 0
    for _ in range(epochs):
        for _batch in loader:
            batches += 1
    wall = time.perf_counter() - start
    spent = [cpu_seconds(p) - t for p, t in zip(workers, there)]
    return {"samples_per_s": batches * BATCH / wall,
            "training_process_cpu_ms_per_batch": (time.process_time() - here) / batches * 1e3,
            "workers_cpu_ms_per_batch": sum(spent) / batches * 1e3}


def main() -> None:
    p = parser(__doc__, dataset=True, rounds=5)
    p.add_argument("--epochs", type=int, default=20, help="per loader and round")
    args = p.parse_args()
    ds = packdata.open(args.dataset)
    loaders = {0: DataLoader(ds, batch_size=BATCH, shuffle=True),
               2: DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                             persistent_workers=True)}
    for _batch in loaders[2]:  # start the workers
        pass
    pids = {0: [], 2: [w.pid for w in loaders[2]._iterator._workers]}
    rows = interleaved(args.rounds, {
        workers: lambda loader=loader, workers=workers: timed(loader, args.epochs, pids[workers])
        for workers, loader in loaders.items()})
    ratio, (low, high) = ratio_of_rounds([b["samples_per_s"] for b in rows[2]],
                                         [a["samples_per_s"] for a in rows[0]])
    report = {"dataset": Path(args.dataset).name, "batch_size": BATCH, "rounds": args.rounds,
              "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "workers_2_vs_0_median_of_rounds": ratio, "ratio_range": [low, high]}
    for workers, runs in rows.items():
        report[f"num_workers={workers}"] = {k: statistics.median(run[k] for run in runs)
                                            for k in runs[0]}
        row = report[f"num_workers={workers}"]
        print(f"num_workers={workers}: {row['samples_per_s']:,.0f} samples/s, CPU per batch "
              f"{row['training_process_cpu_ms_per_batch']:.3f} ms here + "
              f"{row['workers_cpu_ms_per_batch']:.3f} ms in workers")
    print(f"num_workers=2 / num_workers=0: {ratio:.2f} ({low:.2f}–{high:.2f})")
    if args.json:
        write_results(args.json, report)


if __name__ == "__main__":
    main()
