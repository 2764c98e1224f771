"""``packdata check-resume``: prove that packdata's loading stack resumes mid-epoch exactly.

For each scenario (a sampler, a world size, a worker setup) and each trial: run two epochs on
every simulated rank uninterrupted; run again, stop every rank after a random number of batches,
save the loader state, rebuild everything (another ``num_workers``, sometimes another world
size), load the state and run on. Samples are identified by a checksum of their bytes. A trial
passes when every rank got the same number of batches, each epoch served every sample exactly
once (up to the stated remainder rule: fewer than ``world size`` repeats that pad the last
batches, or with ``drop_last`` fewer than ``world size × batch size`` left out and none
repeated), two uninterrupted runs agree (a seeded order), and at the same world size the order
after resume equals the uninterrupted order. StreamingDataset runs on the same simulated ranks
(its order depends on the number of DataLoader workers: after a resume at another
``num_workers`` only once-each is asked of that epoch, and the next must equal an uninterrupted
one at the new number), and its state must be refused at another world size.
"""

from __future__ import annotations

import json
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packdata.errors import ArgumentError
from packdata.loading.buckets import LengthBucketBatchSampler
from packdata.loading.sampling import EpochBatchSampler
from packdata.units import plural

# (world size, num_workers, workers): in-process; two thread workers; DataLoader processes
SETUPS: tuple[tuple[int, int, str | None], ...] = ((1, 0, None), (2, 2, "thread"),
                                                   (3, 2, "process"))
SamplerFactory = Callable[[Any, int, int], Any]  # (dataset, rank, world size) → batch sampler


@dataclass
class ScenarioResult:
    """One scenario's trials: what ran and every failure found."""

    name: str
    trials: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def default_samplers(dataset: Any, batch_size: int, seed: int) -> dict[str, SamplerFactory]:
    """packdata's samplers: sequential, shuffled, shuffled with drop_last, and length-bucketed
    when the dataset has one variable-length field."""
    n = len(dataset)
    out: dict[str, SamplerFactory] = {
        "sequential": lambda ds, r, w: EpochBatchSampler(
            n, batch_size, shuffle=False, seed=seed, rank=r, world_size=w),
        "shuffled": lambda ds, r, w: EpochBatchSampler(
            n, batch_size, seed=seed, rank=r, world_size=w),
        "shuffled drop_last": lambda ds, r, w: EpochBatchSampler(
            n, batch_size, drop_last=True, seed=seed, rank=r, world_size=w),
    }
    manifest = getattr(dataset, "manifest", None)
    if manifest is not None and len(manifest.variable_fields) == 1:
        lengths = dataset.lengths()
        out["bucketed"] = lambda ds, r, w: LengthBucketBatchSampler(
            lengths, batch_size, seed=seed, rank=r, world_size=w)
    return out


def sample_ids(batch: Any) -> list[int]:
    """A checksum per sample of a batch (its tensors' bytes), to compare orders by. A batch is a
    tuple of parts (each a batched tensor or a list with one tensor per sample), a batched tensor,
    or a list of samples (variable-length documents)."""
    if isinstance(batch, list):
        samples = [s if isinstance(s, (tuple, list)) else (s,) for s in batch]
    else:
        parts = batch if isinstance(batch, tuple) else (batch,)
        samples = list(zip(*(list(p) for p in parts if isinstance(p, (torch.Tensor, list)))))
    out = []
    for sample in samples:
        crc = 0
        for t in sample:
            if isinstance(t, torch.Tensor):
                crc = zlib.crc32(np.ascontiguousarray(t.numpy()).data, crc)
        out.append(crc)
    return out


def check_resume(
    dataset: Any,
    *,
    samplers: dict[str, SamplerFactory] | None = None,
    setups: Sequence[tuple[int, int, str | None]] = SETUPS,
    processes: bool = True,
    trials: int = 2,
    seed: int = 0,
    batch_size: int = 64,
    log: Callable[[str], None] | None = None,
) -> list[ScenarioResult]:
    """Run every sampler under every ``(world size, num_workers, workers)`` setup for ``trials``
    random interruptions; resumes go to another setup of the list (another ``num_workers``, and
    every other trial another world size). ``dataset``: a dataset, or what
    :func:`packdata.open` takes. ``processes=False`` leaves out the setups with DataLoader
    worker processes (the slowest to start). Returns one result per scenario; an ArgumentError
    where the dataset is too small to interrupt every scenario at ``batch_size``."""
    if isinstance(dataset, (str, Path)):
        from packdata.loading.dataset import open_dataset

        dataset = open_dataset(dataset)
    setups = [s for s in setups if processes or s[2] != "process"]
    _check_size(dataset, setups, batch_size)
    with warnings.catch_warnings():  # rebuilding loaders is the point here
        warnings.simplefilter("ignore", UserWarning)
        return _check(dataset, samplers, setups, trials, seed, batch_size, log)


def _check_size(dataset: Any, setups: Sequence[tuple[int, int, str | None]],
                batch_size: int) -> None:
    """Refuse a dataset with fewer records than two batches on each rank of the largest world
    size (an interruption needs a batch before it and one after, drop_last included)."""
    world = max((s[0] for s in setups), default=1)
    n, need = len(dataset), 2 * world * batch_size
    if n >= need:
        return
    where = getattr(dataset, "path", "the dataset")
    fits = n // (2 * world)
    advice = f"pass --batch-size {fits} or less" if fits else \
        f"it needs at least {2 * world} records"
    raise ArgumentError(f"{where}: {plural(n, 'record')}, too few to interrupt every scenario "
                        f"at --batch-size {batch_size} (two batches on each of {world} ranks "
                        f"need {need:,}); {advice}")


def _check(dataset: Any, samplers: dict[str, SamplerFactory] | None, setups: Sequence[tuple],
           trials: int, seed: int, batch_size: int,
           log: Callable[[str], None] | None) -> list[ScenarioResult]:
    from packdata.loading.loader import Loader
    from packdata.loading.settings import LoaderSettings

    rng = np.random.default_rng(seed)
    samplers = samplers or default_samplers(dataset, batch_size, seed)
    everything = Counter(_all_ids(dataset, batch_size))
    results = []
    for name, factory in samplers.items():
        for s, (world, workers, kind) in enumerate(setups):
            result = ScenarioResult(f"{name}, {world} rank{'s' * (world > 1)}, "
                                    f"{workers} {kind or ''} workers".replace("  ", " "))
            start = time.perf_counter()

            def build(setup: tuple[int, int, str | None], rank: int, factory=factory) -> Loader:
                w, n, how = setup
                # the settings packdata.loader chooses for these workers: the feeder included
                return Loader(dataset, factory(dataset, rank, w),
                              LoaderSettings.resolve(dataset, num_workers=n, workers=how))

            for t in range(trials):
                other = setups[(s + 1 + t) % len(setups)] if len(setups) > 1 else setups[s]
                if t % 2 == 0:  # the same world size, another worker setup
                    other = (world, *other[1:])
                result.failures += _trial(build, setups[s], other, everything, rng)
                result.trials += 1
            result.seconds = time.perf_counter() - start
            results.append(result)
            if log:
                log(format_row(result))
    if getattr(dataset, "path", None) is not None:
        results += _check_stream(dataset, setups, trials, seed, batch_size, everything, rng, log)
    return results


def _check_stream(dataset: Any, setups: Sequence[tuple[int, int, str | None]], trials: int,
                  seed: int, batch_size: int, everything: Counter, rng: np.random.Generator,
                  log: Callable[[str], None] | None) -> list[ScenarioResult]:
    """StreamingDataset (shuffle buffer of 1,000) on each setup's simulated ranks, through
    DataLoader worker processes where the setup has them (else read in process): interrupted,
    resumed at the same ``num_workers`` (the order must continue unchanged) or another (each
    sample still once; the next epoch as uninterrupted at that ``num_workers``). A stream state
    loaded at another world size must be refused."""
    from packdata.loading.streaming import StreamingDataset

    def workers(setup: tuple[int, int, str | None]) -> int:
        return setup[1] if setup[2] == "process" else 0

    def build(setup: tuple[int, int, str | None], rank: int) -> Any:
        stream = StreamingDataset(dataset.path, shuffle_buffer=1000, seed=seed, rank=rank,
                                  world_size=setup[0])
        return stream.loader(batch_size, num_workers=workers(setup), collate_fn=collate)

    manifest = getattr(dataset, "manifest", None)
    collate = collate_parts if manifest is None or not manifest.variable_fields else list

    results = []
    for s, setup in enumerate(setups):
        world = setup[0]
        result = ScenarioResult(f"streaming, {world} rank{'s' * (world > 1)}, "
                                f"{workers(setup)} process workers")
        start = time.perf_counter()
        for t in range(trials):
            other = setups[(s + 1 + t) % len(setups)] if t % 2 else setup
            other = (world, workers(other), "process" if workers(other) else None)
            result.failures += _trial(build, (world, workers(setup), setup[2]), other,
                                      everything, rng, same_order=False)
            result.trials += 1
        result.failures += _refused_at_other_world(build, world)
        result.seconds = time.perf_counter() - start
        results.append(result)
        if log:
            log(format_row(result))
    return results


def collate_parts(samples: list[Any]) -> Any:
    """default_collate's batch with its parts as a tuple (it makes a list), as ``sample_ids``
    reads a batch; a lone part stays one batched tensor."""
    from torch.utils.data import default_collate

    batch = default_collate(samples)
    return tuple(batch) if isinstance(batch, list) else batch


def _refused_at_other_world(build: Callable, world: int) -> list[str]:
    from packdata.errors import ResumeError

    loader = build((world, 0, None), 0)
    next(iter(loader))
    state = loader.state_dict()
    try:
        build((world + 1, 0, None), 0).load_state_dict(state)
    except ResumeError as exc:
        if "world_size" in str(exc):
            return []
        return [f"a state of {world} ranks loaded at {world + 1} was refused without naming "
                f"the world size: {exc}"]
    return [f"a stream state of {world} ranks was accepted at {world + 1} ranks"]


def _trial(build: Callable, setup: tuple, other: tuple, everything: Counter,
           rng: np.random.Generator, *, same_order: bool = True) -> list[str]:
    """One interruption. ``same_order``: the order does not depend on the worker setup (so a
    resume at the same world size must continue it unchanged); when it does (streams), that is
    asked only of a resume at the same setup, and the next epoch is compared with an
    uninterrupted one at the new setup."""
    world, new_world = setup[0], other[0]
    reference = [[_epoch(loader) for _ in range(2)] for loader in
                 (build(setup, r) for r in range(world))]
    fails = []
    counts = {len(ref[0]) for ref in reference}
    if len(counts) > 1:
        fails.append(f"ranks got unequal batch counts {[len(ref[0]) for ref in reference]}")
    batches = min(len(ref[0]) for ref in reference)
    drop_last = bool(getattr(getattr(build(setup, 0), "batch_sampler", None), "drop_last", False))
    fails += _exactly_once([b for ref in reference for b in ref[0]], everything, world,
                           drop_last, "uninterrupted epoch")
    if batches < 2:
        return fails + [f"too few batches ({batches}) to interrupt"]
    k = int(rng.integers(1, batches))
    first, states = [], []
    for r in range(world):
        loader = build(setup, r)
        it = iter(loader)
        first.append([next(it) for _ in range(k)])
        states.append(json.loads(json.dumps(loader.state_dict())))
        del it
    if any(st != states[0] for st in states):
        fails.append("ranks saved different states")
    if [[sample_ids(b) for b in f] for f in first] != [ref[0][:k] for ref in reference]:
        fails.append("two uninterrupted runs differ (is the order seeded?)")
    resumed = []
    for r in range(new_world):
        loader = build(other, r)
        loader.load_state_dict(states[0])
        resumed.append([_epoch(loader) for _ in range(2)])
    if len({len(res[0]) for res in resumed}) > 1:
        fails.append(f"after resume ranks got unequal batch counts "
                     f"{[len(res[0]) for res in resumed]}")
    where = f"resume at batch {k} from {world} to {new_world} ranks"
    if setup[1:] != other[1:]:
        where += f", {setup[1]} to {other[1]} workers"
    exact = new_world == world and (same_order or setup == other)
    if exact and [res[0] for res in resumed] != [ref[0][k:] for ref in reference]:
        fails.append(f"{where}: the rest of the epoch differs from the uninterrupted order")
    if new_world == world:
        after = [ref[1] for ref in reference] if exact else [
            _epoch(_at_epoch(build(other, r), 1)) for r in range(world)]
        if [res[1] for res in resumed] != after:
            fails.append(f"{where}: the next epoch differs from the uninterrupted one")
    served = [sample_ids(b) for f in first for b in f] + [b for res in resumed for b in res[0]]
    fails += _exactly_once(served, everything, max(world, new_world), drop_last, where)
    return fails


def _at_epoch(loader: Any, epoch: int) -> Any:
    loader.set_epoch(epoch)
    return loader


def _epoch(loader: Any) -> list[list[int]]:
    return [sample_ids(batch) for batch in loader]


def _all_ids(dataset: Any, batch_size: int) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(dataset), 1024):
        ids += sample_ids(dataset.get_batch(np.arange(start, min(start + 1024, len(dataset)))))
    return ids


def _exactly_once(batches: list[list[int]], everything: Counter, world: int, drop_last: bool,
                  where: str) -> list[str]:
    served = Counter(i for b in batches for i in b)
    missing = sum((everything - served).values())
    repeated = sum((served - everything).values())
    batch = max((len(b) for b in batches), default=1)
    if drop_last and (repeated or missing >= 2 * world * batch):
        return [f"{where}: {missing} samples left out, {repeated} repeated (drop_last allows "
                f"fewer than {2 * world * batch} out, none repeated)"]
    if not drop_last and (missing or repeated >= 2 * world):
        return [f"{where}: {missing} samples left out, {repeated} repeated (allowed: none out, "
                f"fewer than {2 * world} repeated as padding)"]
    return []


def format_row(result: ScenarioResult) -> str:
    """One scenario as a line of the report: its name last, so that the columns before it
    align whatever the names' lengths."""
    verdict = "PASS" if result.ok else "FAIL"
    trials = plural(result.trials, "trial")
    line = f"{verdict}  {trials:<9} {result.seconds:6.1f} s  {result.name}"
    return line + "".join(f"\n      {f}" for f in result.failures[:3])
