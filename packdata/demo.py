"""``packdata demo``: the whole story on a real CIFAR-10 sample shipped with the package.

Builds a one-PNG-per-sample folder, converts it into every container, and measures samples/s
delivered to a training loop against the per-file Dataset and an in-RAM numpy gather.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader

from packdata.bench.baselines import InMemoryBatches, PerFileImageDataset, tile_image_folder
from packdata.bench.throughput import sample_rate
from packdata.conversion.dispatch import convert
from packdata.loading.dataset import open_dataset
from packdata.loading.loader import loader
from packdata.sources import open_source

SAMPLE = Path(__file__).parent / "demo_data" / "cifar10"
TARGETS = {"lmdb": "cifar.lmdb", "hdf5": "cifar.h5", "tar": "cifar-tar"}
BATCH = 256


def run_demo(
    count: int = 10_000,
    workdir: Path | None = None,
    log: Callable[[str], Any] = print,
    min_seconds: float = 1.0,
) -> dict[str, Any]:
    """Convert and measure; returns ``{"count", "rows": [{"name", "samples_per_s", ...}]}``."""
    with tempfile.TemporaryDirectory(prefix="packdata-demo-") as tmp:
        root = Path(workdir) if workdir else Path(tmp)
        folder = root / "png"
        if not folder.exists():
            log(f"building a folder of {count:,} real CIFAR-10 PNGs in {folder}")
            tile_image_folder(SAMPLE, folder, count)
        rows: list[dict[str, Any]] = []

        per_file = PerFileImageDataset(folder, folder / "labels.json")
        log("measuring the per-file Dataset (PIL open + decode per sample)")
        base = sample_rate(
            lambda: DataLoader(per_file, batch_size=BATCH, shuffle=True), min_seconds=min_seconds
        )
        rows.append({"name": "per-file PNG Dataset", "samples_per_s": base})

        source = open_source(folder)
        arrays = None
        for container, name in TARGETS.items():
            result = convert(source, root / name, overwrite=True)
            log(f"converted to {container} in {result.seconds:.1f} s")
            ds = open_dataset(result.path)
            if arrays is None:
                arrays = tuple(t.numpy() for t in ds.get_batch(np.arange(len(ds))))
            # built once, as a training script builds it, and a first epoch run untimed (its
            # feeder starts, every record is checked once): later epochs are what training
            # repeats; each timing pass replays epoch 0's order on purpose (the same work)
            made = loader(ds, BATCH, shuffle=True, epoch=0)
            for _ in _epoch_zero(made):
                pass
            rate = sample_rate(lambda made=made: _epoch_zero(made), min_seconds=min_seconds)
            made.close()
            rows.append({"name": f"packdata {container}", "samples_per_s": rate,
                         "convert_s": result.seconds})
        log("measuring the in-RAM numpy gather")
        ram = sample_rate(lambda: InMemoryBatches(*arrays, BATCH), min_seconds=min_seconds)
        rows.append({"name": "numpy array in RAM", "samples_per_s": ram})
    for row in rows:
        row["vs_per_file"] = row["samples_per_s"] / base
        row["vs_ram"] = row["samples_per_s"] / ram
    return {"count": count, "batch_size": BATCH, "rows": rows}


def _epoch_zero(made: Any) -> Any:
    made.set_epoch(0)
    return made


def print_table(results: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{results['count']:,} CIFAR-10 images, batch {results['batch_size']}, "
                  "0 workers")
    table.add_column("loader")
    table.add_column("samples/s", justify="right")
    table.add_column("× per-file", justify="right")
    table.add_column("× RAM", justify="right")
    for row in results["rows"]:
        table.add_row(row["name"], f"{row['samples_per_s']:,.0f}", f"{row['vs_per_file']:.1f}",
                      f"{row['vs_ram']:.2f}")
    console.print(table)
