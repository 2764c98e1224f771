"""Augmented CIFAR-10 samples/s from a packed container: per-sample CPU transforms vs packdata's
batched augmentation, in one run.

    PYTHONPATH=. python bench/bench_augment.py            # real CIFAR-10 test PNGs under ../shared

(a) the tutorial's per-sample transforms (crop pad 4, flip, [colour jitter,] ToTensor, Normalize)
    in a stock DataLoader with 0 and 2 workers; (b) packdata.loader with the batched recipe on
    the CPU, torch and kornia backends; colour-jitter-only rates at batch 256 for both backends;
    (c) on CUDA, when a GPU is present: streamed (DeviceLoader) and resident with the torch
    backend, streamed with both backends with colour jitter, and colour-jitter-only rates on the
    GPU for both backends (which backend ``"auto"`` should pick there). Every configuration
    is measured once per round, rounds repeated ``--repeat`` times (so load from other jobs hits
    all alike); figures are medians, ratios the median of each round's (b) / best (a).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import packdata
from packdata.augment import CIFAR10_MEAN, CIFAR10_STD, ColorJitter, Compose, cifar_recipe
from packdata.bench.baselines import ClassicCifarTransform
from packdata.bench.throughput import sample_rate

DATA = Path("../shared/data/cifar10/test-png")
DEMO = Path(packdata.__file__).parent / "demo_data" / "cifar10"
JITTER = 0.4


def classic(path: Path, batch: int, workers: int, jitter: float) -> DataLoader:
    ds = packdata.open(path, transform=ClassicCifarTransform(CIFAR10_MEAN, CIFAR10_STD,
                                                             jitter=jitter))
    return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0)


def jitter_only(path: Path, backend: str, batch: int, repeat: int, device: str = "cpu") -> float:
    images = packdata.open(path)[list(range(batch))][0]
    images = images.repeat(-(-batch // len(images)), 1, 1, 1)[:batch].to(device)
    aug = Compose([ColorJitter(JITTER, JITTER, JITTER, JITTER / 4)], seed=0, backend=backend)
    rates = []
    for _ in range(repeat):
        aug(images)
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            float(aug(images)[0, 0, 0, 0])  # waits for a GPU's kernels, as a training step would
            n += batch
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="flat PNG folder + labels file")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="minimum per measurement")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads in the main process (workers use 1); more "
                             "threads collapse when other jobs share the cores")
    parser.add_argument("--json", type=Path, default=Path("bench/results/augment.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = args.data if args.data.is_dir() else DEMO
    work = Path(tempfile.mkdtemp(prefix="bench-augment-"))
    labels = data.parent / "labels.json"  # ../shared keeps the labels beside the PNG folder
    source = packdata.open_source(data, labels=labels if labels.is_file() else None)
    path = packdata.convert(source, work / "cifar.lmdb", workers=2).path
    count, b, rep, sec = len(packdata.open(path)), args.batch, args.repeat, args.seconds
    configs = []  # (group, name, loader): all measured once per round, rounds interleaved
    for jit, label in ((0.0, "crop+flip+normalise"), (JITTER, "+ colour jitter")):
        for workers in (0, 2):
            configs.append((f"a) per-sample {label}", f"DataLoader, {workers} workers",
                            classic(path, b, workers, jit)))
        for backend in ("torch", "kornia"):
            configs.append((f"b) batched CPU {label}", f"packdata.loader, backend={backend}",
                            packdata.loader(packdata.open(path), b, shuffle=True, feeder=False,
                                            augment=cifar_recipe(jitter=jit, seed=0,
                                                                 backend=backend))))
        # the same batched recipe in 2 DataLoader workers: both cores, but float32 batches
        # then cross processes
        configs.append((f"b) batched CPU {label}", "2 workers, backend=torch", packdata.loader(
            packdata.open(path, batch_transform=cifar_recipe(jitter=jit, seed=0, backend="torch")),
            b, shuffle=True, num_workers=2, feeder=False)))
    gpu = torch.cuda.is_available()
    gpu_rows = [("c) GPU crop+flip+normalise", "streamed (DeviceLoader)", 0.0, "torch", {}),
                ("c) GPU crop+flip+normalise", "resident", 0.0, "torch", {"resident": True}),
                ("c) GPU + colour jitter", "streamed, backend=torch", JITTER, "torch", {}),
                ("c) GPU + colour jitter", "streamed, backend=kornia", JITTER, "kornia", {})]
    if gpu:
        for group, name, jit, backend, options in gpu_rows:
            configs.append((group, name, packdata.loader(
                packdata.open(path), b, shuffle=True, device="cuda",
                augment=cifar_recipe(jitter=jit, seed=0, backend=backend),
                **({} if options else {"feeder": False}), **options)))
    rates: dict[tuple[str, str], list[float]] = {(g, n): [] for g, n, _ in configs}
    for _ in range(rep):
        for group, name, dl in configs:
            rates[group, name].append(sample_rate(lambda dl=dl: dl, min_seconds=sec))
        for backend in ("torch", "kornia"):
            for device in ("cpu", "cuda") if gpu else ("cpu",):
                where = "" if device == "cpu" else ", on the GPU"
                rates.setdefault(("colour jitter only", f"batch {b}, backend={backend}{where}"),
                                 []).append(jitter_only(path, backend, b, 1, device))
    if not gpu:
        for group, name, *_ in gpu_rows:
            rates[group, name] = []
    for (group, name), got in rates.items():
        shown = f"{statistics.median(got):12,.0f}" if got else "not run on a GPU"
        print(f"{group:<36} {name:<36} {shown:>16}", flush=True)

    def ratio(label: str, backend: str) -> float:
        """Median over rounds of (b) / best (a), each round's figures taken together."""
        per_round = [
            rates[f"b) batched CPU {label}", f"packdata.loader, backend={backend}"][i]
            / max(rates[f"a) per-sample {label}", f"DataLoader, {w} workers"][i] for w in (0, 2))
            for i in range(rep)]
        return statistics.median(per_round)

    ratios = {label: {be: ratio(label, be) for be in ("torch", "kornia")}
              for label in ("crop+flip+normalise", "+ colour jitter")}
    for label, by in ratios.items():
        print(f"(b)/(a) {label}: " + ", ".join(f"{be} {x:.1f}x" for be, x in by.items()))
    result = {
        "data": data.name, "samples": count, "batch": b, "repeat": rep,
        "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0], "torch": torch.__version__, "gpu": gpu,
        "rows": [{"group": g, "name": n, "samples_per_s": statistics.median(r) if r else None,
                  "rounds": r} for (g, n), r in rates.items()],
        "ratio_b_over_a": ratios,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)

if __name__ == "__main__":
    main()
