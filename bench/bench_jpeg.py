"""ImageNet-style JPEGs of any size: random-resized crop to 224 + flip (training) and Resize 256 +
CenterCrop 224 (evaluation), batch 256, uint8 out, two threads or two workers per row.

    python tools/make_imagenet_like.py ./imagenet-like --count 10000
    python bench/bench_jpeg.py ./imagenet-like --count 5000 --rounds 3

Rows, all over the same first ``--count`` files, in one run with interleaved rounds:

- ``pil-files`` (the baseline): a per-file Dataset (Pillow open, torchvision's
  RandomResizedCrop rule transcribed, crop + bilinear resize, flip) in a stock DataLoader with
  2 workers;
- ``keep``: packdata over stored file bytes (HDF5, ``--encoding keep``), decode stage with 2
  threads, through :func:`packdata.loader` (and ``keep-stock``: a stock ``DataLoader(ds,
  batch_size=256)``);
- ``raw256``: packdata over pixels decoded at conversion (HDF5, ``--max-size 256``: shorter side
  <= 256, aspect kept), decode stage with 2 threads;
- ``dali-cpu``: DALI's CPU pipeline over the keep tar shards (``fn.decoders.image_random_crop``
  + resize, or decode + resize + crop), 2 threads — where nvidia-dali is installed.

Each row reads one whole epoch per round; a row's figure is its median round. CPU-seconds are the
user + system time of this process and every process under it (DataLoader workers included).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _shared import parser, write_results
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import packdata

BATCH = 256
THREADS = 2


def tree_cpu_seconds() -> float:
    """User + system CPU of this process and its live descendants, reaped children included."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            stats[int(entry)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return total / tick


# -- the baseline: one file per sample, Pillow, per-sample transforms, DataLoader workers --------

def torchvision_box(width: int, height: int, rand: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08–1, ratio 3/4–4/3)."""
    area = width * height
    for _ in range(10):
        target = area * rand.uniform(0.08, 1.0)
        aspect = math.exp(rand.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top, left = rand.randint(0, height - h), rand.randint(0, width - w)
            return left, top, left + w, top + h
    ratio = width / height
    w, h = (width, round(width / (3 / 4))) if ratio < 3 / 4 else (
        (round(height * 4 / 3), height) if ratio > 4 / 3 else (width, height))
    return (width - w) // 2, (height - h) // 2, (width - w) // 2 + w, (height - h) // 2 + h


class PillowFiles(Dataset):
    """What a torchvision ImageFolder user runs: open, convert, crop, resize, flip, to tensor."""

    def __init__(self, files: list[Path], labels: list[int], train: bool) -> None:
        self.files, self.labels, self.train = files, labels, train

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB")
            if self.train:
                box = torchvision_box(im.width, im.height, random.Random())
                im = im.crop(box).resize((224, 224), Image.Resampling.BILINEAR)
                if random.random() < 0.5:
                    im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            else:  # Resize(256) then CenterCrop(224)
                s = 256 / min(im.size)
                w, h = (256, int(256 * im.height / im.width)) if im.width <= im.height else (
                    int(256 * im.width / im.height), 256)
                im = im.resize((w, h), Image.Resampling.BILINEAR)
                left, top = int(round((w - 224) / 2)), int(round((h - 224) / 2))
                im = im.crop((left, top, left + 224, top + 224))
                del s
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)
        return x, self.labels[i]


# -- rows ------------------------------------------------------------------------------------

def make_rows(files: list[Path], labels: list[int], work: Path, train: bool) -> dict:
    """name -> a function returning one epoch's iterable of (images, labels) batches."""
    stage = (packdata.RandomResizedCrop(224, threads=THREADS, pin_memory=False) if train
             else packdata.CenterCrop(224, resize=256, threads=THREADS, pin_memory=False))
    rows: dict = {}
    base = DataLoader(PillowFiles(files, labels, train), batch_size=BATCH, shuffle=True,
                      num_workers=THREADS, persistent_workers=True, prefetch_factor=4)
    rows["pil-files"] = lambda: base
    keep = packdata.open(work / "keep.h5", decode=stage)
    raw = packdata.open(work / "raw256.h5", decode=stage)
    keep_loader = packdata.loader(keep, BATCH, shuffle=True, num_workers=0, feeder=False)
    raw_loader = packdata.loader(raw, BATCH, shuffle=True, num_workers=0, feeder=False)
    rows["keep"] = lambda: keep_loader  # built once: each iteration runs the next epoch
    rows["keep-stock"] = lambda: DataLoader(keep, batch_size=BATCH, shuffle=True)
    rows["raw256"] = lambda: raw_loader
    try:
        from packdata.dali import tar_loader

        dali = tar_loader(work / "keep-tar", BATCH, device="cpu", crop=stage, dtype="uint8",
                          num_threads=THREADS, index_dir=work / "dali-idx")
        rows["dali-cpu"] = lambda: dali
    except packdata.MissingExtraError:
        pass
    return rows


def epoch(make) -> tuple[int, float, float]:
    cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
    n = 0
    for images, _ in make():
        assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.uint8
        n += images.shape[0]
    return n, time.perf_counter() - t0, tree_cpu_seconds() - cpu0


def subset(src: Path, count: int, out: Path) -> tuple[list[Path], list[int]]:
    """The first ``count`` images (by index in their name) as a class-folder tree of links."""
    files = sorted(src.rglob("*.jpg"), key=lambda p: p.name)[:count]
    classes = sorted({p.parent.name for p in files})
    for p in files:
        (out / p.parent.name).mkdir(parents=True, exist_ok=True)
        (out / p.parent.name / p.name).symlink_to(p.resolve())
    return files, [classes.index(p.parent.name) for p in files]


def main() -> None:
    p = parser(__doc__, count=5000, rounds=3, results="jpeg.json")
    p.add_argument("src", type=Path, help="class folders of JPEGs (tools/make_imagenet_like.py)")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-jpeg-") as tmp:
        work = Path(tmp)
        files, labels = subset(args.src, args.count, work / "src")
        sizes = np.array([Image.open(f).size for f in files])
        conversions = {}
        for name, options, target in (("keep", {"encoding": "keep"}, "keep.h5"),
                                      ("keep-tar", {"encoding": "keep"}, "keep-tar"),
                                      ("raw256", {"max_size": 256}, "raw256.h5")):
            t0 = time.perf_counter()
            result = packdata.convert(packdata.open_source(work / "src", **options), work / target,
                                      workers=THREADS)
            size = sum(p.stat().st_size for p in result.path.rglob("*")) if result.path.is_dir() \
                else result.path.stat().st_size
            conversions[name] = {"seconds": time.perf_counter() - t0, "bytes": size}
        report = {"count": len(files), "mean_wh": sizes.mean(0).round(1).tolist(),
                  "mean_file_kib": float(np.mean([f.stat().st_size for f in files]) / 1024),
                  "batch": BATCH, "threads": THREADS, "rounds": args.rounds,
                  "pillow": Image.__version__, "cores": len(os.sched_getaffinity(0)),
                  "load_average_at_start": os.getloadavg(),
                  "conversions": conversions, "paths": {}}
        for path_name, train in (("train", True), ("eval", False)):
            rows = make_rows(files, labels, work, train)
            for name, make in rows.items():  # warm-up: workers, DALI pipeline, page cache
                for k, _ in enumerate(make()):
                    if k == 2 and not name.startswith("dali"):  # DALI epochs cannot be cut short
                        break
            runs: dict = {name: [] for name in rows}
            for r in range(args.rounds):
                order = list(rows)
                random.Random(r).shuffle(order)
                for name in order:
                    runs[name].append(epoch(rows[name]))
            table = {}
            for name, results in runs.items():
                rates = [n / s for n, s, _ in results]
                cpu = [c / n * 1000 for n, _, c in results]
                table[name] = {"images_per_s": statistics.median(rates),
                               "cpu_s_per_1000": statistics.median(cpu), "rounds": results}
            baseline = table["pil-files"]["images_per_s"]
            for row in table.values():
                row["x_baseline"] = row["images_per_s"] / baseline
            report["paths"][path_name] = table
            print(f"\n{path_name}: {len(files)} images, batch {BATCH}, {THREADS} threads/workers")
            print("| row | images/s | × pil-files | CPU-s per 1,000 |\n|---|---:|---:|---:|")
            for name, row in table.items():
                print(f"| {name} | {row['images_per_s']:,.0f} | {row['x_baseline']:.2f} | "
                      f"{row['cpu_s_per_1000']:.2f} |")
    report["load_average_at_end"] = os.getloadavg()
    write_results(args.json, report)
    print(json.dumps(conversions))


if __name__ == "__main__":
    main()
