"""What the three examples share: arguments, the timed epoch loop, the side-by-side table, JSON.

Each example trains one model twice from the same seed — once on the usual per-file data path
("baseline"), once on packdata ("packdata") — and changes nothing else. Every training step is
timed with :class:`packdata.StepTimer`: the wait for the batch (reading, decoding, augmenting,
moving it to the device) is the data-loading time, the rest is the training step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

import packdata
from packdata.bench.report import json_safe
from packdata.errors import PackdataError
from packdata.loading.device import resolve_device
from packdata.sources import detect_kind

LOADERS = ("baseline", "packdata")


class ExampleError(PackdataError, ValueError):
    """The example cannot run on what it was given (wrong kind of dataset, bad option)."""


def parser(description: str, *, batch_size: int, epochs: int) -> argparse.ArgumentParser:
    """The options every example takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", type=Path, required=True, help="the dataset folder")
    p.add_argument("--loader", choices=(*LOADERS, "both"), default="both",
                   help="data path to train on; 'both' runs baseline then packdata (default)")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the results to this JSON file")
    p.add_argument("--workdir", type=Path,
                   help="where the packdata container is written (default: a temporary folder)")
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader worker processes of the baseline (default 0)")
    return p


def loaders_of(choice: str) -> list[str]:
    return list(LOADERS) if choice == "both" else [choice]


def device_of(name: str) -> torch.device:
    return resolve_device(name)


def check_kind(path: Path, expected: str, what: str) -> None:
    """Refuse a dataset of the wrong kind, saying what was found there."""
    if not path.exists():
        raise ExampleError(f"{path}: no such file or directory")
    try:
        found = detect_kind(path)
    except PackdataError as exc:
        raise ExampleError(f"{path}: expected {what}; {exc}") from None
    if found != expected:
        suffixes: dict[str, int] = {}
        for f in (p for p in path.rglob("*") if p.is_file()):
            suffixes[f.suffix.lower() or "(none)"] = suffixes.get(f.suffix.lower() or "(none)", 0) + 1
        listing = ", ".join(f"{n} {s}" for s, n in sorted(suffixes.items(), key=lambda x: -x[1])[:4])
        raise ExampleError(f"{path}: expected {what}, found {found} data ({listing} files)")


@contextlib.contextmanager
def workdir_of(args: argparse.Namespace) -> Iterator[Path]:
    """``--workdir`` (made if missing, kept), or a temporary directory removed at the end."""
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        yield args.workdir
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def convert_once(dst: Path, source: Callable[[], Any]) -> tuple[packdata.PackedDataset, float | None]:
    """``dst`` opened, converted from ``source()`` first unless a previous run left it (in
    ``--workdir``): the dataset and the conversion's seconds (None when reused)."""
    if dst.exists():
        return packdata.open(dst), None
    start = time.perf_counter()
    packdata.convert(source(), dst)
    return packdata.open(dst), time.perf_counter() - start


def split_indices(count: int, every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic train/test split of sorted samples: every ``every``-th sample is test."""
    idx = np.arange(count)
    test = idx % every == every - 1
    return idx[~test], idx[test]


class SubsetBatches(Sampler[list[int]]):
    """A seeded batch sampler over a subset of a dataset's indices (e.g. its training split)."""

    def __init__(self, indices: Sequence[int], batch_size: int, *, shuffle: bool = True,
                 seed: int = 0) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.inner = packdata.EpochBatchSampler(len(self.indices), batch_size, shuffle=shuffle,
                                                seed=seed, rank=0, world_size=1)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.inner:
            yield self.indices[batch].tolist()

    def __len__(self) -> int:
        return len(self.inner)


StepResult = tuple[float, int, int | None]  # (summed loss, count it is over, correct or None)


def timed_epoch(batches: Iterable[Any], step: Callable[[Any], StepResult],
                device: torch.device, size: Callable[[Any], int] | None = None) -> dict[str, Any]:
    """One epoch: ``step(batch)`` trains on each batch; waits and steps timed by StepTimer."""
    timer = packdata.StepTimer(window=10**9, device=device)
    loss_sum, count, correct = 0.0, 0, 0
    step_losses = []
    has_accuracy = False
    start = time.perf_counter()
    kwargs = {} if size is None else {"size": size}
    for batch in timer.iterate(batches, **kwargs):
        loss, n, ok = step(batch)
        loss_sum, count = loss_sum + loss, count + n
        step_losses.append(loss / max(n, 1))
        if ok is not None:
            has_accuracy, correct = True, correct + ok
    seconds = time.perf_counter() - start
    s = timer.summary()
    return {
        "seconds": seconds, "steps": s["steps"], "samples": s["samples"],
        "load_share": s["load_share"], "load_ms": s["load_ms"], "train_ms": s["train_ms"],
        "loss": loss_sum / max(count, 1), "loss_count": count,
        "train_accuracy": correct / count if has_accuracy and count else None,
        "step_losses": step_losses,
    }


@dataclass
class Run:
    """One data path's training state: its batches, its step, and what it does around epochs."""

    train: Iterable[Any]
    step: Callable[[Any], StepResult]
    evaluate: Callable[[], dict[str, Any]]
    before_epoch: Callable[[int], None] = lambda epoch: None
    after_epoch: Callable[[dict[str, Any]], None] = lambda row: None


def train_interleaved(runs: dict[str, Run], epochs: int,
                      device: torch.device) -> dict[str, list[dict[str, Any]]]:
    """Train every run for ``epochs``, alternating epoch by epoch (baseline, packdata, baseline…)
    so that load from other jobs on the machine falls on both paths alike."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for epoch in range(epochs):
        for name, run in runs.items():
            run.before_epoch(epoch)
            row = timed_epoch(run.train, run.step, device)
            run.after_epoch(row)
            row.update(run.evaluate())
            print_epoch(name, epoch, row)
            results[name].append(row)
    return results


def print_epoch(loader: str, epoch: int, row: dict[str, Any]) -> None:
    parts = [f"[{loader}] epoch {epoch}: {row['seconds']:.2f} s",
             f"data loading {row['load_share']:.1%} of the step", f"loss {row['loss']:.4f}"]
    if row.get("test_accuracy") is not None:
        parts.append(f"test accuracy {row['test_accuracy']:.1%}")
    for key, label in (("tokens_per_s", "real tokens/s"), ("padding", "padding")):
        if row.get(key) is not None:
            parts.append(f"{label} {row[key]:,.0f}" if key == "tokens_per_s"
                         else f"{label} {row[key]:.1%}")
    print(", ".join(parts), flush=True)


def _cell(row: dict[str, Any] | None, key: str) -> str:
    if row is None or row.get(key) is None:
        return "—"
    v = row[key]
    if key in ("load_share", "test_accuracy", "padding"):
        return f"{v:.1%}"
    if key == "seconds":
        return f"{v:.2f}"
    if key == "tokens_per_s":
        return f"{v:,.0f}"
    return f"{v:.4f}"


COLUMNS = {"seconds": "s", "load_share": "loading", "loss": "loss",
           "test_accuracy": "test acc", "tokens_per_s": "tokens/s", "padding": "padding"}


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """A markdown table: one line per epoch, each loader's columns side by side."""
    names = list(results)
    keys = [k for k in COLUMNS if any(r.get(k) is not None for rows in results.values()
                                      for r in rows)]
    head = ["epoch"] + [f"{n} {COLUMNS[k]}" for n in names for k in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for e in range(max(len(rows) for rows in results.values())):
        cells = [str(e)]
        for n in names:
            row = results[n][e] if e < len(results[n]) else None
            cells += [_cell(row, k) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    totals = ["total s"] + [
        (f"{sum(r['seconds'] for r in results[n]):.2f}" if k == "seconds" else "")
        for n in names for k in keys]
    lines.append("| " + " | ".join(totals) + " |")
    return "\n".join(lines)


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.machine()),
    }


def finish(example: str, args: argparse.Namespace, device: torch.device,
           results: dict[str, list[dict[str, Any]]], extra: dict[str, Any]) -> dict[str, Any]:
    """Print the side-by-side table and write the JSON document; returns the document."""
    print()
    print(table(results))
    doc = {
        "example": example,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(device),
        "epochs": results, **extra,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(doc), indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return doc


def run_main(main: Callable[[list[str] | None], dict[str, Any]], argv: list[str] | None) -> int:
    """Run ``main``; a packdata error is one line on stderr and exit status 2."""
    try:
        main(argv)
    except PackdataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
