"""Training parity: the three examples on the per-file baseline and on packdata, same seeds.

    python bench/bench_parity.py [--data ../shared/data] [--only cifar|text|lidar]

Runs each example of ``examples/`` with ``--loader both`` (baseline, then packdata, from the same
seed and initial weights) on the real data of DATA and checks the parity targets:

- CIFAR-10 (``cifar10/test-png``, 9,000 train / 1,000 test): over ``--seeds`` seeds, packdata's
  mean test accuracy after ``--cifar-epochs`` epochs within 2 points of the baseline's, or within
  the larger of the two seed spreads (max − min); packdata's data-loading share of the step
  ≤ 5 % (the baseline's beside it).
- Text (``text/peps``, GPT-2 ``tokenizer/gpt2``, one line per sequence): held-out loss per real
  token after the same epochs (the same tokens) within 2 % of the padded baseline, with ≥ 2× the
  baseline's real tokens per second in training.
- LiDAR (``lidar/``, cut into labelled pieces by ``tools/make_fixtures.tile_clouds``): the
  presampled epoch's data-loading share ≤ 5 % (the raw one's beside it).

Everything runs on the CPU in this process, one example after another; the containers are
converted once into a temporary folder (conversion time is reported apart, not in the epochs).
Writes ``bench/results/parity-PART.json`` per part: every epoch of every run, and the
summary printed (paths under DATA and the temporary folder written as ``DATA`` and ``TMP``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"


def example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name: str, argv: list[str]) -> dict[str, Any]:
    print(f"\n$ python examples/{name}.py {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    doc = example(name).main(argv)
    doc["wall_seconds"] = time.perf_counter() - start
    return doc


def spread(values: list[float]) -> float:
    return max(values) - min(values)


def mean_share(rows: list[dict[str, Any]]) -> float:
    """Data-loading share over all epochs after the first (the first warms caches up)."""
    rows = rows[1:] or rows
    load = sum(r["load_share"] * r["seconds"] for r in rows)
    return load / sum(r["seconds"] for r in rows)


def cifar(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    runs = []
    for seed in range(args.seeds):
        runs.append(run("cifar10_cnn", [
            "--data", str(args.data / "cifar10" / "test-png"),
            "--labels", str(args.data / "cifar10" / "labels.json"), "--epochs", str(args.cifar_epochs),
            "--model", args.cifar_model, "--batch-size", "64", "--lr", str(args.cifar_lr),
            "--device", "cpu",
            "--seed", str(seed), "--workdir", str(work / "cifar")]))
        partial = args.out_dir / "parity-cifar.partial.json"  # seeds so far, if a run is cut short
        partial.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    acc = {k: [r["epochs"][k][-1]["test_accuracy"] * 100 for r in runs] for k in ("baseline", "packdata")}
    share = {k: [mean_share(r["epochs"][k]) for r in runs] for k in ("baseline", "packdata")}
    secs = {k: [sum(e["seconds"] for e in r["epochs"][k]) for r in runs] for k in ("baseline", "packdata")}
    gap = abs(statistics.mean(acc["packdata"]) - statistics.mean(acc["baseline"]))
    allowed = max(2.0, spread(acc["baseline"]), spread(acc["packdata"]))
    summary = {
        "model": args.cifar_model, "lr": args.cifar_lr, "epochs": args.cifar_epochs, "seeds": args.seeds,
        "test_accuracy_pct": {k: {"mean": statistics.mean(v), "spread": spread(v), "runs": v}
                              for k, v in acc.items()},
        "load_share": {k: statistics.mean(v) for k, v in share.items()},
        "train_seconds": {k: statistics.mean(v) for k, v in secs.items()},
        "accuracy_gap_points": gap, "accuracy_allowed_points": allowed,
        "accuracy_ok": gap <= allowed, "load_share_ok": statistics.mean(share["packdata"]) <= 0.05,
        "convert_seconds": runs[0].get("convert_seconds"),
    }
    return {"summary": summary, "runs": runs}


def text(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    peps = sorted((args.data / "text" / "peps").glob("*.txt"))[:: args.text_every]
    folder = work / "peps"
    folder.mkdir(parents=True, exist_ok=True)
    for path in peps:
        shutil.copyfile(path, folder / path.name)
    doc = run("text_lm", [
        "--data", str(folder), "--tokenizer", str(args.data / "tokenizer" / "gpt2" / "tokenizer.json"),
        "--epochs", str(args.text_epochs), "--batch-size", "64", "--device", "cpu",
        "--workdir", str(work / "text")])
    base, packed = doc["epochs"]["baseline"], doc["epochs"]["packdata"]
    rate = {k: sum(r["loss_count"] for r in rows) / sum(r["seconds"] for r in rows)
            for k, rows in (("baseline", base), ("packdata", packed))}
    loss_gap = packed[-1]["test_loss"] / base[-1]["test_loss"] - 1
    summary = {
        "documents": len(peps), "lines": doc["lines"], "epochs": args.text_epochs,
        "real_tokens_per_epoch": base[0]["loss_count"],
        "held_out_loss": {"baseline": base[-1]["test_loss"], "packdata": packed[-1]["test_loss"]},
        "train_loss_last_epoch": {"baseline": base[-1]["loss"], "packdata": packed[-1]["loss"]},
        "padding": {"baseline": statistics.mean(r["padding"] for r in base),
                    "packdata": statistics.mean(r["padding"] for r in packed)},
        "real_tokens_per_s": rate, "speedup": rate["packdata"] / rate["baseline"],
        "load_share": {"baseline": mean_share(base), "packdata": mean_share(packed)},
        "loss_gap": loss_gap, "loss_ok": abs(loss_gap) <= 0.02,
        "speedup_ok": rate["packdata"] / rate["baseline"] >= 2,
        "convert_seconds": doc.get("convert_seconds"),
    }
    return {"summary": summary, "runs": [doc]}


def lidar(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_fixtures import tile_clouds

    pieces = tile_clouds(args.data / "lidar", work / "pieces", max_pieces=args.lidar_pieces,
                         max_points=8192, min_points=args.lidar_points)
    doc = run("lidar_pointnet", [
        "--data", str(work / "pieces"), "--epochs", str(args.lidar_epochs), "--points",
        str(args.lidar_points), "--variants", "4", "--batch-size", "32", "--device", "cpu",
        "--workdir", str(work / "lidar")])
    share = {k: mean_share(rows) for k, rows in doc["epochs"].items()}
    secs = {k: statistics.mean(r["seconds"] for r in rows[1:] or rows)
            for k, rows in doc["epochs"].items()}
    summary = {
        "pieces": pieces, "points": args.lidar_points, "variants": 4, "epochs": args.lidar_epochs,
        "load_share": share, "epoch_seconds": secs,
        "test_accuracy_pct": {k: rows[-1]["test_accuracy"] * 100 for k, rows in doc["epochs"].items()},
        "load_share_ok": share["packdata"] <= 0.05, "convert_seconds": doc.get("convert_seconds"),
    }
    return {"summary": summary, "runs": [doc]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--only", choices=("cifar", "text", "lidar"), action="append")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--cifar-epochs", type=int, default=3)
    p.add_argument("--cifar-model", default="small-cnn")
    p.add_argument("--cifar-lr", type=float, default=0.05, help="peak; decays linearly to 0")
    p.add_argument("--text-every", type=int, default=100, help="use every N-th PEP (sorted by name)")
    p.add_argument("--text-epochs", type=int, default=2)
    p.add_argument("--lidar-pieces", type=int, default=16)
    p.add_argument("--lidar-points", type=int, default=1024)
    p.add_argument("--lidar-epochs", type=int, default=10)
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results",
                   help="each part writes parity-PART.json here")
    args = p.parse_args()
    parts = {"cifar": cifar, "text": text, "lidar": lidar}
    environment = {"torch": torch.__version__, "python": platform.python_version(),
                   "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                   "machine": platform.machine(), "cuda": torch.cuda.is_available()}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or parts:
            start = time.perf_counter()
            result = parts[name](args, Path(tmp) / name)
            doc = {"command": " ".join(["python bench/bench_parity.py", *sys.argv[1:]]),
                   "environment": environment, "seconds": time.perf_counter() - start, **result}
            print(f"\n== {name}: " + json.dumps(result["summary"], indent=1))
            out = args.out_dir / f"parity-{name}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            written = json.dumps(doc, indent=1) + "\n"
            # no machine paths in the results: the data folder and the temporary folder by name
            written = written.replace(str(args.data), "DATA").replace(str(Path(tmp)), "TMP")
            out.write_text(written)
            print(f"wrote {out}")
            (args.out_dir / f"parity-{name}.partial.json").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
