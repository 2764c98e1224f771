"""Conversion's own cost, phase by phase and process by process: its serial share, and what more
cores give (Amdahl's prediction against what they gave).

    python bench/bench_convert_cost.py [--workers 1 2] [--count 50000] [--photos 3000]
        [--jpegs DIR] [--budget 170] [--json bench/results/convert_cost.json]

Conversions, each run by a fresh process (``packdata.convert`` called from Python, so that
start-up is measured apart, below), over inputs made once in a temporary folder:

- ``png-h5``: ``--count`` real CIFAR-10 PNGs (``--data``: ../shared/data/cifar10/test-png, or
  the sample packdata ships, packdata/demo_data/cifar10; repeated under new names) with their
  labels → ``.h5`` (decode-heavy: a PNG decode per 3 KB record);
- ``jpeg-max256-h5``: ``--photos`` photo JPEGs, ``--max-size 256`` → ``.h5`` (decode and resize);
- ``jpeg-keep-lmdb``: the same JPEGs, ``--encoding keep`` → ``.lmdb`` (bytes moved, no pixels),
  beside ``cp -r`` of the same folder into the same file system (a plain copy of its bytes);
- ``jpeg-keep-h5``: the same into ``.h5``, whose workers write the files' bytes in place (LMDB's
  puts are the converting process's).

The JPEGs: those of ``--jpegs DIR`` (e.g. made by tools/make_imagenet_like.py); else made here
by that tool where scikit-image and scikit-learn are installed; else photo-sized mosaics of the
CIFAR images (each JSON row says which).

Each conversion reports (packdata.conversion.costs) its parent's wall and CPU seconds per phase
(listing, key check, waiting for the header survey, the probe, hand-over of results, writing,
hashing, metadata, finish, commit; or, with one worker, the survey and loading done by the
parent itself), its workers' CPU seconds per phase (survey, load, pack, hashing, place), the
bytes handed over, read and written. The PNGs' header reads are also timed apart. From them:

- ``serial_share``: the parent's CPU seconds in the phases no worker takes (all but loading
  and the header survey) over the conversion's CPU seconds (parent and workers, start-up
  aside), per worker count (a loaded machine inflates wall time, not CPU); with one worker,
  also over its wall time;
- ``serial_over_one``: the parent's serial CPU seconds with each worker count over the CPU
  seconds of the conversion with one worker (what the workers cannot take, against the whole
  job);
- ``amdahl_16``: 1 / (s + (1 - s) / 16), the speed-up 16 workers would give over one if only
  that share stayed serial, with ``s`` the 2-worker runs' share — and, where the machine has
  the cores, ``speedup`` says what 16 gave.

Figures are medians over ``--rounds``, which alternate the worker counts.

Start-up apart: ``python -c pass``, ``packdata --help`` and a 200-file conversion from the shell,
wall and CPU seconds, median of 3 (``--startup-only``: just these, for each ``--packdata``
checkout, interleaved). The load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import CIFAR_PNG, build_folder, command_line, parser, write_results

ROOT = Path(__file__).resolve().parents[1]
CONVERSIONS = {
    "png-h5": ("png", "out.h5", {}),
    "jpeg-max256-h5": ("jpeg", "out.h5", {"max_size": 256}),
    "jpeg-keep-lmdb": ("jpeg", "out.lmdb", {"encoding": "keep"}),
    "jpeg-keep-h5": ("jpeg", "out.h5", {"encoding": "keep"}),
}


def child(folder: str, dst: str, workers: int, options: str) -> None:
    """One conversion in this fresh process: its costs and this process tree's CPU seconds."""
    from packdata.conversion.dispatch import convert
    from packdata.sources import open_source

    start = time.perf_counter()
    result = convert(open_source(folder, **json.loads(options)), dst, workers=workers)
    wall = time.perf_counter() - start
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall": wall, "seconds": result.seconds, "count": result.manifest.count,
                      "cpu_parent": me.ru_utime + me.ru_stime,
                      "cpu_workers": kids.ru_utime + kids.ru_stime,
                      "costs": result.costs.to_dict() if hasattr(result, "costs") else None}))


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def photo_jpegs(out: Path, count: int, png: Path) -> tuple[Path, str]:
    """``count`` photo-sized JPEGs in class folders, and how they were made."""
    try:
        import skimage  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        return _mosaics(out, count, png), "CIFAR mosaics (scikit-image not installed)"
    sys.path.insert(0, str(ROOT / "tools"))
    import make_imagenet_like

    make_imagenet_like.make(out, count, classes=100, seed=0)
    return out, "tools/make_imagenet_like.py --seed 0"


def _mosaics(out: Path, count: int, png: Path) -> Path:
    """Photo-sized JPEGs (shorter side 256-500, quality 90) tiled from CIFAR images scaled up
    2x, made on every core: real image content where no photographs are installed."""
    from concurrent.futures import ProcessPoolExecutor

    files = sorted(png.glob("*.png"))[:4096]
    for c in range(100):
        (out / f"class_{c:03d}").mkdir(parents=True)
    step = 50
    with ProcessPoolExecutor() as pool:
        list(pool.map(_mosaic_block, [(out, files, a, min(a + step, count))
                                      for a in range(0, count, step)]))
    return out


def _mosaic_block(task: tuple[Path, list[Path], int, int]) -> None:
    import numpy as np
    from PIL import Image

    out, files, start, stop = task
    for i in range(start, stop):
        rng = np.random.default_rng([0, i])
        short = int(rng.integers(256, 501))
        w, h = int(short * rng.uniform(1.0, 1.5)), short
        tiles = -(-w // 64), -(-h // 64)
        canvas = Image.new("RGB", (tiles[0] * 64, tiles[1] * 64))
        for y in range(tiles[1]):
            for x in range(tiles[0]):
                with Image.open(files[int(rng.integers(len(files)))]) as im:
                    canvas.paste(im.convert("RGB").resize((64, 64), Image.Resampling.BICUBIC),
                                 (x * 64, y * 64))
        canvas.crop((0, 0, w, h)).save(out / f"class_{i % 100:03d}" / f"img_{i:06d}.jpg",
                                       quality=90)


def checkout_env(root: Path) -> dict[str, str]:
    """The environment with the checkout first on the path, before whatever the environment
    already adds (packages installed with pip's --target, say)."""
    paths = [str(root), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_child(folder: Path, dst: Path, workers: int, options: dict, root: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(folder), str(dst), str(workers),
                          json.dumps(options)], check=True, capture_output=True, text=True,
                         env=checkout_env(root)).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["bytes_written"] = size_of(dst)
    return row


def plain_copy(folder: Path, dst: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(folder), str(dst)], check=True)
    subprocess.run(["sync", "-f", str(dst)], check=False)
    return time.perf_counter() - start


def startup(png: Path, tmp: Path, root: Path) -> dict:
    """Wall seconds of a bare interpreter, ``packdata --help`` and a 200-file conversion."""
    small = tmp / "small"
    small.mkdir()
    for p in sorted(png.glob("*.png"))[:200]:
        os.link(p, small / p.name)
    env = checkout_env(root)
    commands = {"python": [sys.executable, "-c", "pass"],
                "help": [sys.executable, "-m", "packdata", "--help"],
                "convert_200": [sys.executable, "-m", "packdata", "convert", str(small),
                                str(tmp / "small.h5"), "--overwrite"]}
    times: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(3):
        for name, command in commands.items():
            start, used = time.perf_counter(), children_cpu()
            # from the checkout: `python -m` looks in the working folder first
            subprocess.run(command, check=True, capture_output=True, env=env, cwd=root)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(children_cpu() - used)
    return {**{k: statistics.median(v) for k, v in times.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}}


def children_cpu() -> float:
    """CPU seconds of this process's finished children (and theirs)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def header_reads(folder: Path, root: Path) -> dict:
    """CPU seconds of the header reads alone (the survey, which chooses the PNGs' layout), in
    one fresh process: a conversion's workers share them (phase "survey")."""
    code = ("import json, time; from packdata.sources import open_source; "
            "from packdata.conversion.survey import survey; "
            f"source = open_source({str(folder)!r}); items = source.items(); "
            "t = time.process_time(); survey(source, items, workers=1); "
            "print(json.dumps(time.process_time() - t))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=checkout_env(root)).stdout
    return {"cpu": json.loads(out), "files": sum(1 for _ in folder.glob("*.png"))}


def conversion_cpu(row: dict) -> float:
    """CPU seconds of the conversion itself: its parent's phases and its workers' (not the
    interpreter's start or imports)."""
    costs = row["costs"]
    return sum(p["cpu"] for p in costs["parent"].values()) + sum(costs["workers"].values())


def summary(rows: list[dict]) -> dict:
    """Per conversion, medians over the rounds: the serial share (the parent's serial CPU over
    the conversion's CPU, and over its wall time), speed-ups, and Amdahl's prediction for 16
    workers from the 2-worker runs' serial share."""
    out: dict[str, dict] = {}
    for name in CONVERSIONS:
        runs: dict[int, list[dict]] = {}
        for r in rows:
            if r["conversion"] == name:
                runs.setdefault(r["workers"], []).append(r)
        if 1 not in runs:
            continue
        wall = {w: statistics.median(r["wall"] for r in rs) for w, rs in sorted(runs.items())}
        entry: dict = {"wall": wall, "speedup": {w: wall[1] / t for w, t in wall.items()}}
        if runs[1][0]["costs"] is None:  # a packdata that does not report its costs
            out[name] = entry
            continue
        share = {w: statistics.median(r["costs"]["serial_cpu"] / conversion_cpu(r) for r in rs)
                 for w, rs in runs.items()}
        entry["serial_share"] = share
        one = statistics.median(conversion_cpu(r) for r in runs[1])
        entry["serial_over_one"] = {w: statistics.median(r["costs"]["serial_cpu"] for r in rs)
                                    / one for w, rs in runs.items()}
        entry["serial_share_of_wall"] = statistics.median(
            r["costs"]["serial_cpu"] / r["wall"] for r in runs[1])
        if 2 in share:
            entry["amdahl_16"] = 1 / (share[2] + (1 - share[2]) / 16)
        out[name] = entry
    return out


def startup_only(roots: list[Path], args: argparse.Namespace) -> None:
    """Start-up of each checkout, ``--rounds`` interleaved rounds."""
    doc: dict = {"command": command_line(), "load_before": load(), "startup": {}}
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp_name:
        tmp = Path(tmp_name)
        png = build_folder(args.data, tmp / "png", 200)
        for r in range(args.rounds):
            for n, root in enumerate(roots):
                where = tmp / f"{n}-{r}"
                where.mkdir()
                label = "this" if root == ROOT else root.name
                doc["startup"].setdefault(label, []).append(startup(png, where, root))
    doc["load_after"] = load()
    if args.json:
        write_results(args.json, doc)
    print(json.dumps(doc, indent=1))


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=1, results="convert_cost.json")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--photos", type=int, default=3000)
    p.add_argument("--jpegs", type=Path, help="a folder of JPEGs to use instead of making them")
    p.add_argument("--only", nargs="+", choices=list(CONVERSIONS), default=list(CONVERSIONS))
    p.add_argument("--budget", type=float, default=170.0,
                   help="seconds: no further conversion starts past this (the rest is listed)")
    p.add_argument("--packdata", type=Path, default=ROOT,
                   help="the checkout whose packdata runs (e.g. an earlier one, to compare)")
    p.add_argument("--startup-only", nargs="*", type=Path, metavar="CHECKOUT",
                   help="only the start-up, of this repository and each CHECKOUT given")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        folder, dst, workers, options = args.child
        child(folder, dst, int(workers), options)
        return
    if args.startup_only is not None:
        startup_only([ROOT, *args.startup_only], args)
        return
    began = time.perf_counter()
    doc: dict = {"command": command_line(), "cores": os.cpu_count(), "load_before": load(),
                 "rows": [], "copies": [], "not_run": []}
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = {"png": build_folder(args.data, tmp / "png", args.count)}
        if any(CONVERSIONS[c][0] == "jpeg" for c in args.only):
            if args.jpegs:
                inputs["jpeg"], doc["jpegs"] = args.jpegs, str(args.jpegs)
            else:
                inputs["jpeg"], doc["jpegs"] = photo_jpegs(tmp / "jpeg", args.photos, args.data)
        doc["inputs"] = {k: {"files": sum(1 for f in v.rglob("*") if f.suffix in (".png", ".jpg")),
                             "bytes": size_of(v)} for k, v in inputs.items()}
        doc["startup"] = startup(inputs["png"], tmp, args.packdata)
        doc["png_header_reads"] = header_reads(inputs["png"], args.packdata)
        print(f"start-up: {doc['startup']}", file=sys.stderr)
        for r in range(args.rounds):
            for workers in args.workers:
                for name in args.only:
                    kind, target, options = CONVERSIONS[name]
                    if time.perf_counter() - began > args.budget:
                        doc["not_run"].append({"conversion": name, "workers": workers})
                        continue
                    dst = tmp / f"{name}-{workers}-{r}" / target
                    dst.parent.mkdir()
                    row = run_child(inputs[kind], dst, workers, options, args.packdata)
                    row.update(conversion=name, workers=workers, round=r, load=load(),
                               bytes_read=doc["inputs"][kind]["bytes"])
                    doc["rows"].append(row)
                    shutil.rmtree(dst.parent)
                    print(f"{name} workers={workers}: {row['wall']:.2f} s", file=sys.stderr)
                    if name == "jpeg-keep-lmdb":
                        copied = tmp / f"copy-{workers}-{r}"
                        doc["copies"].append({"workers": workers, "round": r,
                                              "seconds": plain_copy(inputs[kind], copied),
                                              "keep_seconds": row["wall"]})
                        shutil.rmtree(copied)
    doc["load_after"] = load()
    doc["summary"] = summary(doc["rows"])
    if doc["copies"]:
        doc["summary"]["keep_over_copy"] = {w: statistics.median(
            c["keep_seconds"] / c["seconds"] for c in doc["copies"] if c["workers"] == w)
            for w in sorted({c["workers"] for c in doc["copies"]})}
    doc["seconds"] = time.perf_counter() - began
    if args.json:
        write_results(args.json, doc)
    print(json.dumps(doc["summary"], indent=1))


if __name__ == "__main__":
    main()
