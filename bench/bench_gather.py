"""Gathering a batch of records from a memory-mapped file: numpy against torch, idle and busy.

    python bench/bench_gather.py [--count 50000] [--rounds 7] [--json bench/results/gather.json]

The step every packdata read comes down to: the rows of a shuffled batch (256 sorted indices)
of ``--count`` records of 3,072 bytes (a CIFAR image) gathered into a new array, from

- an array in RAM, and the same bytes in a file mapped read-only (packdata's ``map_file``),
  laid out as (records, bytes);
- a byte window over the mapped file (row ``k`` is bytes ``k:k+3072``: how the tar and LMDB
  readers reach records at any offset), indexed by byte address;

by numpy's fancy indexing, ``np.take``, torch's ``index_select`` (on one thread, and on
torch's default intra-op threads) and packdata's ``gather_rows`` (packdata's native routine
where its C extension was built, else one of the others).
Each variant's microseconds per batch are the median of ``--rounds`` interleaved rounds; ratios
are to numpy's gather from RAM (busy: from the map) in the same rounds.
The CPU seconds per wall second say how many cores a variant keeps busy. Then the same rounds
for numpy and torch's gathers from the map while one busy-looping process per core competes
for the cores, as a training job's other processes do.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, drain, interleaved, parser, ratio_of_rounds, timed, write_results

from packdata import checksum
from packdata.containers.base import gather_rows, map_file
from packdata.containers.joined import byte_window

RECORD = 3072
BATCH = 256


def one_round(gather, batches: list[np.ndarray], threads: int):
    """A round of ``gather`` over ``batches`` on ``threads`` torch threads, returning (µs of
    wall time per batch, CPU seconds per wall second)."""
    def run() -> tuple[float, float]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            drain(map(gather, batches[:20]))
            wall, cpu = timed(lambda: drain(map(gather, batches)))
        finally:
            torch.set_num_threads(before)
        return wall / len(batches) * 1e6, cpu / wall
    return run


def rounds_of(variants: dict, batches: list[np.ndarray], rounds: int) -> dict:
    """Interleaved rounds of every variant on torch's default threads, then of torch's and
    packdata's on one thread (named "…, 1 thread")."""
    threads = torch.get_num_threads()
    runs = {name: one_round(gather, batches, threads) for name, gather in variants.items()}
    runs |= {f"{name}, 1 thread": one_round(gather, batches, 1)
             for name, gather in variants.items() if name.startswith(("torch", "packdata"))}
    return interleaved(rounds, runs, progress=False)


def main() -> None:
    args = parser(__doc__, count=50_000, rounds=7, results="gather.json").parse_args()
    rng = np.random.default_rng(0)
    ram = rng.integers(0, 256, (args.count, RECORD), dtype=np.uint8)
    order = rng.permutation(args.count)
    batches = [np.sort(order[a : a + BATCH]) for a in range(0, args.count - BATCH + 1, BATCH)]
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        path = Path(tmp) / "records.bin"
        path.write_bytes(ram.tobytes())
        mapped = map_file(path).reshape(args.count, RECORD)
        window = byte_window(map_file(path), RECORD)
        ram_t = torch.from_numpy(ram)

        def torch_take(source: np.ndarray, addresses: bool = False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only map, only read
                rows = torch.from_numpy(source)
            return lambda b: rows.index_select(0, torch.from_numpy(b * RECORD if addresses else b))

        variants = {
            "numpy fancy, RAM": lambda b: ram[b],
            "numpy fancy, map": lambda b: mapped[b],
            "np.take, map": lambda b: np.take(mapped, b, axis=0),
            "numpy fancy, byte window": lambda b: window[b * RECORD],
            "torch index_select, RAM": lambda b: ram_t.index_select(0, torch.from_numpy(b)),
            "torch index_select, map": torch_take(mapped),
            "torch index_select, byte window": torch_take(window, True),
            "packdata gather_rows, RAM": lambda b: gather_rows(ram, b),
            "packdata gather_rows, map": lambda b: gather_rows(mapped, b),
            "packdata gather_rows, byte window": lambda b: gather_rows(window, b * RECORD),
        }
        rows = summary(rounds_of(variants, batches, args.rounds), "numpy fancy, RAM")
        busy_variants = {name: variants[name] for name in (
            "numpy fancy, map", "torch index_select, map", "packdata gather_rows, map")}
        spinners = [mp.get_context("fork").Process(target=spin, daemon=True)
                    for _ in range(os.cpu_count() or 1)]
        for p in spinners:
            p.start()
        try:
            busy = rounds_of(busy_variants, batches[:40], args.rounds)
        finally:
            for p in spinners:
                p.kill()
        print("-- busy: one spinning process per core --")
        busy_rows = summary(busy, "numpy fancy, map")
    write_results(args.json, {"command": command_line(), "count": args.count,
                              "record_bytes": RECORD, "batch": BATCH, "rounds": args.rounds,
                              "torch_threads": threads, "load_average": os.getloadavg(),
                              "native_rows": checksum.NATIVE_ROWS,
                              "rows": rows, "busy_rows": busy_rows})


def spin() -> None:
    """A process that keeps one core busy."""
    while True:
        pass


def summary(runs: dict[str, list[tuple[float, float]]], base_name: str) -> dict[str, dict]:
    """Per variant: median µs per batch, median ratio to ``base_name`` in the same rounds
    (above 1: faster), median cores kept busy; printed as it goes."""
    base = [us for us, _ in runs[base_name]]
    rows = {}
    for name, got in runs.items():
        us = [u for u, _ in got]
        rows[name] = {"us_per_batch": statistics.median(us),
                      "vs_base": ratio_of_rounds(base, us)[0],
                      "cpu_per_wall": statistics.median(c for _, c in got)}
        print(f"{name:52s} {rows[name]['us_per_batch']:9.1f} µs  "
              f"×{rows[name]['vs_base']:.2f} {base_name}  "
              f"{rows[name]['cpu_per_wall']:.2f} cores", flush=True)
    return rows


if __name__ == "__main__":
    main()
