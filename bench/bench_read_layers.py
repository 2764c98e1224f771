"""Where a batch's time goes: each layer of the read path timed over the same shuffled batches.

    python bench/bench_read_layers.py [--data ../shared/data/cifar10/test-png] [--count 50000]
        [--rounds 15] [--json bench/results/read_layers.json]

Converts ``--count`` real CIFAR-10 PNGs (repeated) into every container, opens each as users do
(every record checked) and reads one epoch, so that what follows is a later epoch (a record
checked once is not hashed again). Then, in interleaved rounds, one epoch of shuffled batches of
256 (each a random draw, indices in the sampler's order) through each layer, outermost last:

- ``limit``: bench_containers' in-RAM limit (``SortedGather``), which the Speed table divides by;
- ``gather``: packdata's native gather alone (``packdata.checksum.gather``), where each batch's
  records lie worked out beforehand, into new arrays each batch as a read makes them;
- ``container read``: the container's own reader, which in a later epoch reads through its
  batch plan (``packdata/containers/plan.py``: a lookup per field, the arrays made, the gather);
- ``checked read``: the checking reader around it (``ds.reader``), its records already checked;
- ``get_batch``: ``ds.get_batch(indices)``: the sample kind's tensors;
- ``packdata.loader``: ``packdata.loader(ds, 256, shuffle=True)``, its own shuffled batches;
- ``__getitems__ + collate``: what the stock DataLoader calls for a batch, without the
  DataLoader: ``default_collate(ds.__getitems__(indices))``, the indices a list of Python ints
  as its sampler gives them (the drop-in's hand-over: the list read as indices, the rows handed
  over, the batch found again by the collate);
- ``stock DataLoader``: ``DataLoader(ds, 256, shuffle=True)``;
- ``torch sampler``: that DataLoader's sampler alone (``BatchSampler(RandomSampler(ds), 256,
  False)``), its index lists built and dropped;
- ``torch profiler scope``: the scope that DataLoader's iterator opens around every batch it
  hands out (``torch.autograd.profiler.record_function``, entered and left once a batch), alone.

Reported per container: each layer's median µs per batch and what it adds to the layer inside
it (the stock DataLoader: beyond ``get_batch`` and its sampler; beyond those and its profiler
scope; and beyond its sampler, its profiler scope and ``__getitems__ + collate``: the rest of
torch's iterator, in Python). Needs the C extension (the
gather row); a later epoch only: first epochs and fresh processes are bench_first_epoch's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _shared import CIFAR_PNG, command_line, drain, interleaved, parser, write_results
from bench_containers import BATCH, TARGETS, SortedGather, build_folder
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, default_collate

import packdata
from packdata import checksum
from packdata.containers.base import native_arguments, new_arrays

#: each layer and the layer inside it (what its own cost is counted against)
INSIDE: dict[str, str | None] = {
    "gather": None, "container read": "gather", "checked read": "container read",
    "get_batch": "checked read", "packdata.loader": "get_batch",
    "__getitems__ + collate": "get_batch"}


def shuffled_batches(count: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(count)
    return [order[start : start + BATCH] for start in range(0, count, BATCH)]


def per_batch(run, batches: int):
    """A run of one epoch, returning its seconds per batch."""
    def timed() -> float:
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) / batches
    return timed


def layers(ds: packdata.PackedDataset, limit: SortedGather, seed: int) -> dict:
    """One epoch of each layer over ``ds`` (see the module docstring)."""
    checked = ds.reader
    plain = checked.inner  # the container's own reader, under the checking one
    # each layer its own draws: one that read the same batches just before another would leave
    # their rows in the CPU's caches for it
    # (the loaders draw their own)
    own = {layer: shuffled_batches(len(ds), 10 * seed + k)
           for k, layer in enumerate(("gather", "container read", "checked read", "get_batch",
                                      "__getitems__ + collate"))}
    lists = [idx.tolist() for idx in own["__getitems__ + collate"]]  # as torch's sampler gives
    batches = own["gather"]
    gathers = []
    for idx in batches:
        sources = plain.row_sources(plain.check_indices(idx))
        templates = new_arrays(plain.manifest.fields, [name for name, _, _ in sources], len(idx))
        views, rows, _ = native_arguments(sources, templates)
        gathers.append((views, rows, list(templates.values())))
    n = len(batches)
    # built once, after the epoch main() read: each iteration the next epoch
    loader = packdata.loader(ds, BATCH, shuffle=True, epoch=1, feeder=False)
    stock = DataLoader(ds, batch_size=BATCH, shuffle=True)
    # each batch dropped before the next is read, as a training loop does (batches kept alive
    # would make every read map fresh memory)
    return {
        "limit": per_batch(lambda: drain(limit), n),
        "gather": per_batch(lambda: drain(checksum.gather(v, r, [np.empty_like(t) for t in ts])
                                          for v, r, ts in gathers), n),
        "container read": per_batch(
            lambda: drain(plain.read(idx) for idx in own["container read"]), n),
        "checked read": per_batch(lambda: drain(checked.read(idx) for idx in own["checked read"]),
                                  n),
        "get_batch": per_batch(lambda: drain(ds.get_batch(idx) for idx in own["get_batch"]), n),
        "packdata.loader": per_batch(lambda: drain(loader), n),
        "__getitems__ + collate": per_batch(
            lambda: drain(default_collate(ds.__getitems__(idx)) for idx in lists), n),
        "stock DataLoader": per_batch(lambda: drain(stock), n),
        "torch sampler": per_batch(
            lambda: drain(BatchSampler(RandomSampler(ds), BATCH, drop_last=False)), n),
        "torch profiler scope": per_batch(lambda: drain(map(profiler_scope, range(n))), n),
    }


def profiler_scope(_: int) -> None:
    """The profiler scope torch's DataLoader iterator opens and closes around each batch."""
    with torch.autograd.profiler.record_function("enumerate(DataLoader)#__next__"):
        pass


def summary(rounds: dict[str, list[float]]) -> dict:
    us = {name: statistics.median(times) * 1e6 for name, times in rounds.items()}
    own = {name: us[name] - us[inner] for name, inner in INSIDE.items() if inner}
    own["stock DataLoader"] = us["stock DataLoader"] - us["get_batch"] - us["torch sampler"]
    own["stock DataLoader, beyond its profiler scope"] = (own["stock DataLoader"]
                                                          - us["torch profiler scope"])
    own["stock DataLoader, beyond its sampler, profiler scope and hand-over"] = (
        us["stock DataLoader"] - us["__getitems__ + collate"] - us["torch sampler"]
        - us["torch profiler scope"])
    return {"us_per_batch": us, "own_us_per_batch": own,
            "rounds_us": {name: [t * 1e6 for t in times] for name, times in rounds.items()}}


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=50_000, rounds=15, results="read_layers.json")
    args = p.parse_args()
    if not checksum.NATIVE_ROWS:
        raise SystemExit("packdata's C extension is not built here: the gather row needs it")
    results = {}
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        source = packdata.open_source(build_folder(args.data, Path(tmp) / "png", args.count))
        opened = {}
        for container, name in TARGETS.items():
            ds = packdata.open(packdata.convert(source, Path(tmp) / name, workers=2).path)
            drain(packdata.loader(ds, BATCH, shuffle=True, feeder=False))  # epoch 0: all checked
            opened[container] = ds
        first = next(iter(opened.values()))
        images, labels = first.get_batch(np.arange(len(first)))
        limit = SortedGather(images.numpy(), labels.numpy())
        runs = {}
        for container, ds in opened.items():
            for layer, run in layers(ds, limit, seed=len(runs)).items():
                runs[container, layer] = run
        measured = interleaved(args.rounds, runs)
        for container in opened:
            results[container] = summary({layer: times for (c, layer), times in measured.items()
                                          if c == container})
            line = "  ".join(f"{layer} {us:.1f}"
                             for layer, us in results[container]["us_per_batch"].items())
            print(f"{container}: {line} µs/batch", file=sys.stderr)
    doc = {"command": command_line(), "count": args.count, "batch": BATCH, "rounds": args.rounds,
           "containers": results}
    if args.json:
        write_results(args.json, doc)


if __name__ == "__main__":
    main()
