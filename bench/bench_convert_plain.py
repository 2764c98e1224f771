"""Conversion against a plain-library writer of the same container, over the same decoded inputs,
with a profile of where packdata's extra time goes.

    python bench/bench_convert_plain.py [--data ../shared/data/cifar10/test-png] [--count 10000]

Rows, interleaved ``--rounds`` times over the same CIFAR-10 PNGs (``--count`` of them, copied
with fresh names as bench_containers.py does when more are asked for than there are):

- ``plain-lmdb``: 2 forked processes decode each PNG with Pillow (``Pool.imap``, chunks of 64),
  the main process puts one key per sample (pixels + label byte) in one LMDB write transaction;
- ``packdata``: ``packdata.convert(packdata.open_source(folder), DST.lmdb, workers=2)``, timed
  from the call (listing, labels and the header scan included) to the committed output.

Then one more packdata conversion runs under cProfile (the converting process only; the workers'
decode is the same in both rows) and the cumulative seconds of its stages are reported.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import tempfile
from multiprocessing import get_context
from pathlib import Path

import lmdb
import numpy as np
from _shared import CIFAR_PNG, parser, seconds, write_results
from bench_containers import build_folder
from PIL import Image

import packdata

#: (label, file suffix, function) of the stages reported from the profile
STAGES = [
    ("open_source (kind detection)", "sources/__init__.py", "open_source"),
    ("listing, labels, header scan", "sources/images.py", "items"),
    ("  of which the header scan", "sources/images.py", "sizes_differ"),
    ("record loop in the main process", "conversion/local.py", "add"),
    ("  writer.append", "containers/lmdb.py", "append"),
    ("  record_checksum", "checksum.py", "record_checksum"),
    ("  field checks", "conversion/local.py", "_checked"),
    ("waiting for the workers", "conversion/pool.py", "_result"),
    ("manifest + commit", "conversion/local.py", "finish"),
    ("whole convert", "conversion/dispatch.py", "convert"),
]


def _decode(path: Path) -> bytes:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).tobytes()


def plain_lmdb(files: list[Path], labels: dict[str, int], dst: Path) -> None:
    env = lmdb.open(str(dst), map_size=1 << 32, lock=False)
    with get_context("fork").Pool(2) as pool, env.begin(write=True) as txn:
        for i, (path, pixels) in enumerate(zip(files, pool.imap(_decode, files, chunksize=64))):
            txn.put(b"%08d" % i, pixels + bytes([labels[path.name]]))
    env.sync()
    env.close()


def ours(folder: Path, dst: Path) -> None:
    packdata.convert(packdata.open_source(folder), dst, workers=2)


def stages(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = {}
    for label, suffix, name in STAGES:
        out[label] = sum(row[3] for (file, _, func), row in stats.items()
                         if func == name and file.endswith(suffix))
    return out


def main() -> None:
    args = parser(__doc__, data=CIFAR_PNG, count=10_000, rounds=3,
                  results="convert_plain.json").parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-convert-plain-") as tmp:
        work = Path(tmp)
        folder = build_folder(args.data, work / "src", args.count)
        labels = json.loads((folder / "labels.json").read_text())["labels"]
        files = sorted(folder.glob("*.png"))
        rounds = []
        for r in range(args.rounds):
            a = seconds(lambda r=r: plain_lmdb(files, labels, work / f"plain{r}.lmdb"))
            b = seconds(lambda r=r: ours(folder, work / f"ours{r}.lmdb"))
            rounds.append({"plain_lmdb_s": a, "packdata_s": b, "ratio": b / a})
            print(f"round {r}: plain LMDB {a:.2f} s, packdata {b:.2f} s ({b / a:.2f}x)")
        profile = cProfile.Profile()
        profile.enable()
        packdata.convert(packdata.open_source(folder), work / "profiled.lmdb", workers=2)
        profile.disable()
        split = stages(profile)
    report = {"count": len(files), "workers": 2, "cores": len(os.sched_getaffinity(0)),
              "load_average": os.getloadavg(), "rounds": rounds,
              "ratio_of_medians": statistics.median(r["packdata_s"] for r in rounds)
              / statistics.median(r["plain_lmdb_s"] for r in rounds),
              "profile_seconds": split}
    write_results(args.json, report)
    print(f"ratio of medians {report['ratio_of_medians']:.2f}x\n| stage (profiled run) | s |\n"
          "|---|---:|")
    for label, spent in split.items():
        print(f"| {label} | {spent:.3f} |")


if __name__ == "__main__":
    main()
