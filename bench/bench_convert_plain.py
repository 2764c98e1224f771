"""Conversion against plain-library writers of the same containers, over the same decoded inputs,
with a profile of where packdata's time goes.

    python bench/bench_convert_plain.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--rounds 5] [--json bench/results/convert_plain.json]

Rows, interleaved ``--rounds`` times over the same CIFAR-10 PNGs (``--count`` of them, copied
with fresh names as bench_containers.py does when more are asked for than there are), each
timed from the folder's name to the closed output:

- ``plain lmdb`` / ``plain hdf5`` / ``plain tar``: the script a user would write with the plain
  library. It lists the folder (sorted ``glob``) and reads ``labels.json``; 2 forked processes
  decode each PNG with Pillow (``Pool.imap``, chunks of 64) into the bytes packdata stores (uint8
  C×H×W pixels, an int64 label); the main process writes them: LMDB one key per sample (pixels +
  label) in one write transaction; h5py an ``image`` and a ``label`` dataset created at their
  final size, written 1,024 samples at a time; tarfile an ``.image`` and a ``.cls`` member per
  sample in one tar file;
- ``packdata lmdb`` / ``hdf5`` / ``tar``: ``packdata.convert(packdata.open_source(folder), DST,
  workers=2)``: kind detection, listing, labels, the header survey, per-record checks and
  checksums, the manifest and the atomic commit included.

Each row also records its CPU seconds, of the timing process and its workers together: on a
machine shared with other work, wall time follows the CPU share a row gets, while CPU seconds
say whether both rows do the same work.

Then one more packdata LMDB conversion runs with its stages timed (wall seconds, and CPU seconds
of the converting process's main thread), beside the CPU seconds of its worker processes; no
profiler runs, so the stages cost what they cost in the rounds.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tarfile
import tempfile
import time
from functools import partial
from io import BytesIO
from multiprocessing import get_context
from pathlib import Path

import h5py
import lmdb
import numpy as np
from _shared import CIFAR_PNG, build_folder, command_line, parser, timed, write_results
from PIL import Image

import packdata
import packdata.containers.lmdb
import packdata.conversion.job
import packdata.conversion.local
import packdata.conversion.pool
import packdata.recordmeta
import packdata.sources.images

CONTAINERS = {"lmdb": "out.lmdb", "hdf5": "out.h5", "tar": "out-tar"}
CHUNK = 1024  # samples per h5py write


def _decode(path: Path) -> bytes:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1).tobytes()


def _inputs(folder: Path) -> tuple[list[Path], dict[str, int]]:
    """The folder's PNGs, sorted, and their labels."""
    return sorted(folder.glob("*.png")), json.loads((folder / "labels.json").read_text())["labels"]


def _decoded(files: list[Path], labels: dict[str, int]):
    """(file, label, C×H×W pixel bytes) of every PNG, decoded by 2 forked processes."""
    with get_context("fork").Pool(2) as pool:
        for path, pixels in zip(files, pool.imap(_decode, files, chunksize=64)):
            yield path, labels[path.name], pixels


def plain_lmdb(folder: Path, dst: Path) -> None:
    files, labels = _inputs(folder)
    env = lmdb.open(str(dst), map_size=1 << 36, lock=False)
    with env.begin(write=True) as txn:
        for i, (_, label, pixels) in enumerate(_decoded(files, labels)):
            txn.put(b"%010d" % i, pixels + np.int64(label).tobytes())
    env.sync()
    env.close()


def plain_hdf5(folder: Path, dst: Path) -> None:
    files, labels_of = _inputs(folder)
    with h5py.File(dst, "w") as f:
        images = f.create_dataset("image", (len(files), 3, 32, 32), dtype=np.uint8)
        labels = f.create_dataset("label", (len(files),), dtype=np.int64)
        chunk, label_chunk, start = [], [], 0
        for _, label, pixels in _decoded(files, labels_of):
            chunk.append(pixels)
            label_chunk.append(label)
            if len(chunk) == CHUNK:
                images[start : start + CHUNK] = np.frombuffer(
                    b"".join(chunk), np.uint8).reshape(-1, 3, 32, 32)
                labels[start : start + CHUNK] = label_chunk
                chunk, label_chunk, start = [], [], start + CHUNK
        if chunk:
            images[start:] = np.frombuffer(b"".join(chunk), np.uint8).reshape(-1, 3, 32, 32)
            labels[start:] = label_chunk


def plain_tar(folder: Path, dst: Path) -> None:
    files, labels = _inputs(folder)
    dst.mkdir()
    with tarfile.open(dst / "data.tar", "w") as tar:
        for path, label, pixels in _decoded(files, labels):
            for suffix, payload in (("image", pixels), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{path.stem}.{suffix}")
                info.size = len(payload)
                tar.addfile(info, BytesIO(payload))


PLAIN = {"lmdb": plain_lmdb, "hdf5": plain_hdf5, "tar": plain_tar}


def ours(folder: Path, dst: Path) -> None:
    packdata.convert(packdata.open_source(folder), dst, workers=2)


#: (stage, object, attribute) of the converting process's stages timed in the profiled run
STAGES = [
    ("listing, labels", packdata.sources.images.ImageSource, "items"),
    ("header survey (read by the workers)", packdata.conversion.job, "survey"),
    ("waiting for the workers' blocks", packdata.conversion.pool.WorkerPool, "_result"),
    ("storing blocks (writer, keys, checksums)", packdata.conversion.local._Records, "add_block"),
    ("  writer.append_rows", packdata.containers.lmdb.LMDBWriter, "append_rows"),
    ("  keys and checksums spooled", packdata.recordmeta.MetaSpool, "append_block"),
    ("manifest + commit", packdata.conversion.local._Records, "finish"),
    ("  LMDB finish (offsets, record arrays, sync)", packdata.containers.lmdb.LMDBWriter,
     "finish"),
]


def profiled(folder: Path, dst: Path) -> dict[str, dict[str, float]]:
    """One packdata LMDB conversion with each stage's wall and main-thread CPU seconds."""
    spent = {label: [0.0, 0.0] for label, _, _ in STAGES}
    originals = []
    for label, owner, name in STAGES:
        fn = owner.__dict__[name]
        originals.append((owner, name, fn))

        def wrapper(*args, _fn=fn, _label=label, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_label][0] += time.perf_counter() - wall
                spent[_label][1] += time.thread_time() - cpu

        setattr(owner, name, wrapper)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    try:
        opened = time.perf_counter()
        source = packdata.open_source(folder)
        opened = time.perf_counter() - opened
        packdata.convert(source, dst, workers=2)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stages = {"open_source (kind detection)": {"wall_s": opened, "main_thread_cpu_s": None}}
    stages |= {label: {"wall_s": w, "main_thread_cpu_s": c} for label, (w, c) in spent.items()}
    stages["whole conversion"] = {"wall_s": time.perf_counter() - wall,
                                  "main_thread_cpu_s": time.thread_time() - cpu}
    stages["converting process, all threads (CPU)"] = {
        "wall_s": None, "main_thread_cpu_s": time.process_time() - process}
    stages["worker processes (CPU)"] = {
        "wall_s": None, "main_thread_cpu_s": (after.ru_utime + after.ru_stime)
        - (children.ru_utime + children.ru_stime)}
    return stages


def main() -> None:
    args = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=5,
                  results="convert_plain.json").parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-convert-plain-") as tmp:
        work = Path(tmp)
        folder = build_folder(args.data, work / "src", args.count)
        rounds = []
        for r in range(args.rounds):
            row = {}
            for container, name in CONTAINERS.items():
                plain, plain_cpu = timed(partial(PLAIN[container], folder, work / f"plain{r}-{name}"),
                                         children=True)
                packed, packed_cpu = timed(partial(ours, folder, work / f"ours{r}-{name}"),
                                           children=True)
                row[container] = {"plain_s": plain, "packdata_s": packed, "ratio": packed / plain,
                                  "plain_cpu_s": plain_cpu, "packdata_cpu_s": packed_cpu,
                                  "cpu_ratio": packed_cpu / plain_cpu}
            rounds.append(row)
            print(f"round {r}: " + ", ".join(
                f"{c} plain {v['plain_s']:.2f} s, packdata {v['packdata_s']:.2f} s "
                f"({v['ratio']:.2f}x)" for c, v in row.items()), flush=True)
        stages = profiled(folder, work / "profiled.lmdb")
    summary = {}
    for container in CONTAINERS:
        ratios = [r[container]["ratio"] for r in rounds]
        summary[container] = {
            "plain_s_median": statistics.median(r[container]["plain_s"] for r in rounds),
            "packdata_s_median": statistics.median(r[container]["packdata_s"] for r in rounds),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cpu_ratio_median": statistics.median(r[container]["cpu_ratio"] for r in rounds)}
    report = {"command": command_line(), "count": args.count, "workers": 2,
              "cores": len(os.sched_getaffinity(0)),
              "load_average": os.getloadavg(), "rounds": rounds, "summary": summary,
              "profile_lmdb": stages}
    write_results(args.json, report)
    print("| container | plain s | packdata s | ratio (median, min–max) | CPU ratio |\n"
          "|---|---:|---:|---:|---:|")
    for container, s in summary.items():
        print(f"| {container} | {s['plain_s_median']:.2f} | {s['packdata_s_median']:.2f} | "
              f"{s['ratio_median']:.2f} ({s['ratio_min']:.2f}–{s['ratio_max']:.2f}) | "
              f"{s['cpu_ratio_median']:.2f} |")
    print("\n| stage (packdata LMDB, timed run) | wall s | main-thread CPU s |\n|---|---:|---:|")
    for label, v in stages.items():
        wall, cpu = v["wall_s"], v["main_thread_cpu_s"]
        print(f"| {label} | {'' if wall is None else f'{wall:.3f}'} | "
              f"{'' if cpu is None else f'{cpu:.3f}'} |")


if __name__ == "__main__":
    main()
