"""What checksums at read cost: packdata.open's default (verify="full") against verify="off".

    python bench/bench_verify.py [--data ../shared/data/cifar10/test-png] [--count 20000]
        [--rounds 5] [--epochs 5] [--only cifar-hdf5 ...] [--also-pure]
        [--json bench/results/verify.json]

Builds a folder of real CIFAR-10 PNGs (repeated to ``--count``), converts it into every container
(raw pixels), and ``--count``/4 text documents (the PEP fixtures repeated; byte tokens, variable
length, padded by PadCollate), then times a fresh
open and ``--epochs`` epochs through ``packdata.loader(ds, batch_size=256, shuffle=True)`` in the
main process, off and full back to back in each round (interleaved: the machine is shared).
Ratios reported (speed full / speed off, median of per-round ratios): over all epochs, the first
(open included: every record hashed once) and the later ones (records already checked: a bit
test per batch), in wall time and, for the first and later epochs, in this process's CPU
time (which the machine's other jobs do not inflate). Also times opening with "full" (8
records checked) against "off". By default records are gathered and checked by packdata's C
extension (a record hashed as it is copied). With ``--also-pure``, each round also runs "off" and
"full" as an install without the extension reads (``packdata.checksum.NATIVE_ROWS`` off:
numpy's gathers, then one xxhash call per record), and those ratios are reported beside (keys
``pure_*``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash
from _shared import CIFAR_PNG, command_line, interleaved, parser, write_results
from bench_containers import build_folder

import packdata
from packdata import checksum

BATCH = 256
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
PEPS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "text" / "peps"


def text_folder(out: Path, count: int) -> Path:
    """``count`` real documents: the PEP fixtures repeated under new names."""
    import itertools
    import shutil

    out.mkdir(parents=True)
    peps = sorted(PEPS.glob("*.txt"))
    for i, pep in zip(range(count), itertools.cycle(peps)):
        shutil.copyfile(pep, out / f"{pep.stem}_{i:06d}.txt")
    return out


def open_seconds(path: Path, level: str, repeats: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        packdata.open(path, verify=level)
    return (time.perf_counter() - start) / repeats


def epochs_seconds(path: Path, level: str, epochs: int, collate,
                   native: bool = True) -> tuple[list[float], list[float]]:
    """A fresh open (counted in the first epoch), then ``epochs`` epochs through
    ``packdata.loader``: wall seconds of each, and CPU seconds of this process (what the
    machine's other jobs take does not count); without ``native``, records are hashed from
    Python."""
    built = checksum.NATIVE_ROWS
    checksum.NATIVE_ROWS = built and native
    try:
        return _epochs_seconds(path, level, epochs, collate)
    finally:
        checksum.NATIVE_ROWS = built


def _epochs_seconds(path: Path, level: str, epochs: int, collate) -> tuple[list[float], list[float]]:
    start, cpu = time.perf_counter(), time.process_time()
    ds = packdata.open(path, verify=level)
    loader = packdata.loader(ds, batch_size=BATCH, shuffle=True, collate=collate, feeder=False)
    times, cpu_times = [], []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        now, cpu_now = time.perf_counter(), time.process_time()
        times.append(now - start)
        cpu_times.append(cpu_now - cpu)
        start, cpu = now, cpu_now
    return times, cpu_times


def hash_floor_seconds(path: Path, repeats: int = 200) -> float | None:
    """Seconds XXH3 takes over one batch's bytes as one contiguous buffer (None for variable-size
    records): what hashing a batch costs at the least."""
    ds = packdata.open(path, verify="off")
    fields = ds.manifest.fields
    if any(f.variable for f in fields.values()):
        return None
    n = min(BATCH, len(ds))
    batch = ds.reader.read(np.arange(n))
    table = np.concatenate([np.ascontiguousarray(batch[name]).reshape(n, -1).view(np.uint8)
                            for name in fields], axis=1)
    xxhash.xxh3_64_intdigest(table)
    start = time.perf_counter()
    for _ in range(repeats):
        xxhash.xxh3_64_intdigest(table)
    return (time.perf_counter() - start) / repeats


def bench_one(name: str, path: Path, rounds: int, epochs: int, also_pure: bool = False) -> dict:
    """Default (every record checked, "full") against "off", interleaved round by round (and
    with ``also_pure`` "full" hashed from Python, in the same rounds)."""
    collate = packdata.PadCollate() if name.startswith("text") else None
    runs = {level: lambda level=level: epochs_seconds(path, level, epochs, collate)
            for level in ("off", "full")}
    if also_pure:  # both levels as an install without the C extension reads
        runs["off_pure"] = lambda: epochs_seconds(path, "off", epochs, collate, native=False)
        runs["full_pure"] = lambda: epochs_seconds(path, "full", epochs, collate, native=False)
    both = interleaved(rounds, runs, progress=False)
    times = {level: [wall for wall, _ in runs] for level, runs in both.items()}
    cpu = {level: [spent for _, spent in runs] for level, runs in both.items()}
    n = len(packdata.open(path, verify="off"))

    def ratio(pick, of=times, full="full", off="off") -> float:
        """Speed checked over unchecked, the median of rounds."""
        return statistics.median(pick(o) / pick(f) for o, f in zip(of[off], of[full]))

    opens = {lv: open_seconds(path, lv) for lv in ("off", "full")}
    floor = hash_floor_seconds(path)
    batches = -(-n // BATCH)
    off_batch = statistics.median(sum(t[1:]) / ((epochs - 1) * batches) for t in times["off"]) \
        if epochs > 1 else None
    row = {"dataset": name, "samples": n, "epochs": epochs,
           "off_samples_per_s": statistics.median(n * epochs / sum(t) for t in times["off"]),
           "full_samples_per_s": statistics.median(n * epochs / sum(t) for t in times["full"]),
           "full_over_off_all_epochs": ratio(sum),
           "full_over_off_first_epoch": ratio(lambda t: t[0]),
           "full_over_off_later_epochs": ratio(lambda t: sum(t[1:])) if epochs > 1 else None,
           "cpu_full_over_off_first_epoch": ratio(lambda t: t[0], cpu),
           "cpu_full_over_off_later_epochs": ratio(lambda t: sum(t[1:]), cpu) if epochs > 1
           else None,
           "seconds_off": times["off"], "seconds_full": times["full"],
           "cpu_seconds_off": cpu["off"], "cpu_seconds_full": cpu["full"],
           "open_ms_off": opens["off"] * 1e3, "open_ms_full": opens["full"] * 1e3,
           "off_batch_us_later_epochs": off_batch * 1e6 if off_batch else None,
           "hash_floor_us_per_batch": floor * 1e6 if floor is not None else None,
           "hash_floor_over_off_batch": floor / off_batch if floor is not None and off_batch
           else None}
    if also_pure:
        pure, off = "full_pure", "off_pure"
        row.update({
            "pure_off_samples_per_s": statistics.median(n * epochs / sum(t) for t in times[off]),
            "pure_full_samples_per_s": statistics.median(n * epochs / sum(t) for t in times[pure]),
            "pure_full_over_off_all_epochs": ratio(sum, full=pure, off=off),
            "pure_full_over_off_first_epoch": ratio(lambda t: t[0], full=pure, off=off),
            "pure_full_over_off_later_epochs": ratio(lambda t: sum(t[1:]), full=pure, off=off)
            if epochs > 1 else None,
            "cpu_pure_full_over_off_first_epoch": ratio(lambda t: t[0], cpu, pure, off),
            "seconds_off_pure": times[off], "seconds_full_pure": times[pure],
            "cpu_seconds_off_pure": cpu[off], "cpu_seconds_full_pure": cpu[pure]})
    print(f"{name:12s} off {row['off_samples_per_s']:>10,.0f}/s  full "
          f"{row['full_samples_per_s']:>10,.0f}/s  full/off: all {row['full_over_off_all_epochs']:.2f}"
          f", first epoch {row['full_over_off_first_epoch']:.2f}, later "
          f"{row['full_over_off_later_epochs'] or 0:.2f} (in CPU time: first epoch "
          f"{row['cpu_full_over_off_first_epoch']:.2f}, later "
          f"{row['cpu_full_over_off_later_epochs'] or 0:.2f}); open off {row['open_ms_off']:.1f} ms, "
          f"full {row['open_ms_full']:.1f} ms", flush=True)
    if also_pure:
        print(f"{'':12s} without the C extension: off {row['pure_off_samples_per_s']:>10,.0f}/s "
              f"full {row['pure_full_samples_per_s']:>10,.0f}/s, "
              f"full/off: all {row['pure_full_over_off_all_epochs']:.2f}, first epoch "
              f"{row['pure_full_over_off_first_epoch']:.2f} (in CPU time "
              f"{row['cpu_pure_full_over_off_first_epoch']:.2f})", flush=True)
    if row["hash_floor_over_off_batch"] is not None:
        print(f"{'':12s} XXH3 over a batch in one call {row['hash_floor_us_per_batch']:.0f} µs = "
              f"{row['hash_floor_over_off_batch']:.2f} of an unchecked batch read "
              f"({row['off_batch_us_later_epochs']:.0f} µs)", flush=True)
    return row


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=20_000, rounds=5, results="verify.json")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--only", nargs="*", default=None, help="e.g. cifar-hdf5 text-lmdb")
    p.add_argument("--also-pure", action="store_true",
                   help='also time "full" hashing from Python, without the native batch routine')
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        sets = {}
        for name, source, options in (
            ("cifar", packdata.open_source(folder), {"shard_size": "5000"}),
            ("text", packdata.open_source(text_folder(Path(tmp) / "text-src", args.count // 4)),
             {"shard_size": "500"}),
        ):
            for container, target in TARGETS.items():
                if args.only and f"{name}-{container}" not in args.only:
                    continue
                sets[f"{name}-{container}"] = packdata.convert(
                    source, Path(tmp) / name / target, workers=2,
                    container_options=options if container == "tar" else None).path
        for name, path in sets.items():
            rows.append(bench_one(name, path, args.rounds, args.epochs, args.also_pure))
    write_results(args.json, {"command": command_line(), "batch_size": BATCH,
                              "rounds": args.rounds, "load_average": os.getloadavg(),
                              "native_rows": checksum.NATIVE_ROWS, "rows": rows})


if __name__ == "__main__":
    main()
