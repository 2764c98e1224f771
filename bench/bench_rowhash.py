"""What hashing a batch's records costs: the checksum's native routine against the ways it replaced.

    python bench/bench_rowhash.py [--rounds 7] [--json bench/results/rowhash.json]

A CIFAR batch in memory, 256 records of 3,072 random pixel bytes and an int64 label, hashed per
record (XXH3-64), in µs per batch (each round times many calls; the fastest round and the median
are kept, rounds interleaved): XXH3 over the batch's pixels in one call (what hashing the bytes
costs at the least); the pixels one xxhash call per row (``map``, rows_checksums without the
routine) and through packdata._rowhash; pixels and label laid side by side by ``np.concatenate``
then ``map`` (batch_checksums without the routine) and through the routine, each record copied
into one buffer, streamed from its two pieces, and as the routine chooses by default; and
batch_checksums itself with and without the routine. Then what a read's check costs: a batch
(sorted random indices, a new batch each call) gathered by the routine from 50,000 such records
in RAM (pixels and labels in two arrays, as HDF5 stores them) into the batch's arrays, alone and
checked as gathered (the routine given the batch's stored checksums by position, as a read
gives them, the bitmap cleared first: every record hashed, as in a first epoch: by default
about 64 KiB of records copied, then hashed; and each record hashed right after its copy), both
again without asking for the rows of records ahead of the one copied (``prefetch_bytes=0``);
and a point-cloud batch (16 rows of 48 KiB, one variant of four each), both ways. Then
records of two pieces (the second the 8-byte label) from 16 bytes to 64 KiB, copied against
streamed: where the routine's limit (``stream_above``) belongs.
"""

from __future__ import annotations

import itertools
import os
import statistics
import timeit

import numpy as np
import xxhash
from _shared import command_line, interleaved, parser, write_results

from packdata import checksum
from packdata.manifest import Field

BATCH = 256
COPY = {"stream_above": 1 << 40}
STREAM = {"stream_above": 0}


def per_batch_us(runs: dict, rounds: int) -> dict[str, dict[str, float]]:
    """µs per call of each of ``runs``: rounds interleaved, each timing about 20 ms of calls."""
    numbers = {name: max(1, int(0.02 / min(timeit.repeat(run, number=1, repeat=5))))
               for name, run in runs.items()}
    times = interleaved(rounds, {name: (lambda run=run, k=numbers[name]:
                                        timeit.timeit(run, number=k) / k * 1e6)
                                 for name, run in runs.items()}, progress=False)
    return {name: {"min_us": min(t), "median_us": statistics.median(t)} for name, t in times.items()}


def routine(columns: list, n: int, **limit):
    out = np.empty(n, dtype=np.uint64)
    return lambda: checksum._rowhash.rows(columns, out, **limit)


def gather_runs(rng: np.random.Generator, records: int = 50_000) -> dict:
    """A read's gather from ``records`` CIFAR records in RAM, alone and checked as gathered."""
    pixels = rng.integers(0, 256, (records, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, records).reshape(records, 1).view(np.uint8)
    sums = checksum.rows_checksums(np.concatenate([pixels, labels], axis=1))
    order = rng.permutation(records)
    batches = itertools.cycle([np.sort(order[a : a + BATCH]) for a in range(0, records, BATCH)
                               if a + BATCH <= records])
    outs = [np.empty((BATCH, 3072), np.uint8), np.empty((BATCH, 8), np.uint8)]
    verified = np.zeros((records + 7) // 8, np.uint8)

    def gather(**limit):  # limit: the routine's block_bytes or prefetch_bytes
        def run():
            idx = next(batches)
            checksum._rowhash.gather([pixels, labels], [idx, idx], outs, **limit)
        return run

    def checked(**limit):  # each record hashed as gathered, the bitmap cleared first
        def run():
            idx = next(batches)
            verified[:] = 0
            first, _ = checksum._rowhash.gather([pixels, labels], [idx, idx], outs, idx,
                                                sums[idx], verified, **limit)
            assert first == -1
        return run

    def clear():  # the bitmap's clearing, timed apart: subtract it from the checked rows
        next(batches)
        verified[:] = 0

    return {"read: gather of a batch from RAM, native": gather(),
            "read: gather, every record checked as gathered": checked(),
            "read: the same, each record hashed right after its copy": checked(block_bytes=1),
            "read: gather, no rows asked for ahead (prefetch_bytes=0)": gather(prefetch_bytes=0),
            "read: gather checked, no rows asked for ahead": checked(prefetch_bytes=0),
            "read: the bitmap's clearing alone (in every checked row)": clear}


def large_row_runs(rng: np.random.Generator, records: int = 1280, parts: int = 4) -> dict:
    """A point-cloud epoch's gather: batches of 16 records, one of ``parts`` stored variants of
    4,096 xyz float32 points (48 KiB) each, from RAM; the routine asks for the first 4 KiB of
    each row ahead, against no rows asked for."""
    rows = rng.integers(0, 256, (records * parts, 4096 * 12), dtype=np.uint8)
    batches = itertools.cycle([np.sort(rng.permutation(records)[:16]) * parts
                               + rng.integers(0, parts, 16) for _ in range(80)])
    out = [np.empty((16, rows.shape[1]), np.uint8)]

    def run(**limit):
        return lambda: checksum._rowhash.gather([rows], [next(batches)], out, **limit)

    return {"48 KiB rows: gather of 16, native": run(),
            "48 KiB rows: no rows asked for ahead": run(prefetch_bytes=0)}


def main() -> None:
    args = parser(__doc__, rounds=7, results="rowhash.json").parse_args()
    if not checksum.NATIVE_ROWS:
        raise SystemExit("packdata._rowhash was not built: nothing to measure")
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (BATCH, 32, 32, 3), dtype=np.uint8)
    label = rng.integers(0, 10, BATCH)
    pixels, label_bytes = image.reshape(BATCH, -1), label.reshape(BATCH, 1).view(np.uint8)
    fields = {"image": Field("|u1", (32, 32, 3)), "label": Field("<i8", ())}
    batch = {"image": image, "label": label}

    def pure_batch_checksums():
        checksum.NATIVE_ROWS = False
        try:
            return checksum.batch_checksums(batch, fields, BATCH)
        finally:
            checksum.NATIVE_ROWS = True

    runs = {
        "pixels: one XXH3 call over the whole batch": lambda: xxhash.xxh3_64_intdigest(pixels),
        "pixels: map, one xxhash call per row":
            lambda: np.fromiter(map(xxhash.xxh3_64_intdigest, pixels), np.uint64, BATCH),
        "pixels: native routine": routine([pixels], BATCH),
        "pixels + label: np.concatenate, then map": lambda: np.fromiter(
            map(xxhash.xxh3_64_intdigest, np.concatenate([pixels, label_bytes], axis=1)),
            np.uint64, BATCH),
        "pixels + label: native routine, each record copied":
            routine([pixels, label_bytes], BATCH, **COPY),
        "pixels + label: native routine, each record streamed":
            routine([pixels, label_bytes], BATCH, **STREAM),
        "pixels + label: native routine, default": routine([pixels, label_bytes], BATCH),
        "batch_checksums, native": lambda: checksum.batch_checksums(batch, fields, BATCH),
        "batch_checksums, pure path": pure_batch_checksums,
    }
    runs.update(gather_runs(rng))
    runs.update(large_row_runs(rng))
    rows = [{"name": name, **t} for name, t in per_batch_us(runs, args.rounds).items()]
    for row in rows:
        print(f"{row['min_us']:8.1f} µs (median {row['median_us']:7.1f})  {row['name']}")
    sizes = []
    for record in (16, 64, 256, 512, 1024, 1536, 2048, 3080, 16384, 65536):
        head = rng.integers(0, 256, (BATCH, record - 8), dtype=np.uint8)
        t = per_batch_us({"copied": routine([head, label_bytes], BATCH, **COPY),
                          "streamed": routine([head, label_bytes], BATCH, **STREAM)}, args.rounds)
        sizes.append({"record_bytes": record, "copied_us": t["copied"]["min_us"],
                      "streamed_us": t["streamed"]["min_us"]})
        print(f"{record:6d} bytes in two pieces: copied {t['copied']['min_us']:8.1f} µs, streamed "
              f"{t['streamed']['min_us']:8.1f} µs", flush=True)
    write_results(args.json, {"command": command_line(), "batch_size": BATCH,
                              "rounds": args.rounds, "load_average": os.getloadavg(),
                              "stream_above": checksum._rowhash.STREAM_ABOVE,
                              "rows": rows, "two_pieces": sizes})


if __name__ == "__main__":
    main()
