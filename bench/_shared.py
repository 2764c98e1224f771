"""What the bench scripts share: their common flags, timing a call, interleaved rounds with
same-run ratios, and the results file.

Run a script as ``python bench/NAME.py`` (Python puts bench/ first on the import path, so
``from _shared import ...`` finds this module).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K")
T = TypeVar("T")

#: the real CIFAR-10 test images most benches read, relative to the repository root
CIFAR_PNG = Path("../shared/data/cifar10/test-png")
LIDAR_TREES = Path("../shared/data/lidar/trees")


def parser(doc: str | None, *, dataset: bool = False, data: Path | None = None,
           count: int | None = None, rounds: int | None = None,
           results: str | None = None) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with the flags most benches take: a
    ``dataset`` argument where asked for, ``--data``, ``--count`` and ``--rounds`` where their
    default is given, and always ``--json`` (by default bench/results/``results``, or none)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    if dataset:
        p.add_argument("dataset")
    if data is not None:
        p.add_argument("--data", type=Path, default=data)
    if count is not None:
        p.add_argument("--count", type=int, default=count)
    if rounds is not None:
        p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--json", type=Path, default=Path("bench/results") / results if results else None,
                   help="write the results here")
    return p


def build_folder(data: Path, out: Path, count: int) -> Path:
    """``count`` PNGs of ``data`` repeated, with their labels (labels.json inside ``data``, as
    packdata/demo_data has it, or beside it, as ../shared/data/cifar10 has it)."""
    import shutil

    inside = data / "labels.json"
    labels = json.loads((inside if inside.is_file() else data.parent / "labels.json").read_text())
    names = sorted(labels["labels"])
    out.mkdir(parents=True)
    table = {}
    for i in range(count):
        name = names[i % len(names)]
        new = f"{Path(name).stem}_{i:06d}.png"
        shutil.copyfile(data / name, out / new)
        table[new] = labels["labels"][name]
    (out / "labels.json").write_text(json.dumps({"classes": labels["classes"], "labels": table}))
    return out


def tile_clouds(src: Path, out: Path, count: int, link: bool = False) -> Path:
    """A folder of ``count`` point clouds: the LAS/LAZ files under ``src`` repeated round-robin
    under numbered names, each in the sub-folder (class) it has under ``src``; copied, or with
    ``link`` symbolic links. SystemExit naming ``src`` when it holds none."""
    import shutil

    files = sorted(p for p in src.rglob("*") if p.suffix.lower() in (".las", ".laz"))
    if not files:
        raise SystemExit(f"{src}: no .las or .laz files in this folder")
    for i in range(count):
        cloud = files[i % len(files)]
        folder = out / cloud.parent.relative_to(src)
        folder.mkdir(parents=True, exist_ok=True)
        tiled = folder / f"{i:05d}_{cloud.name}"
        if link:
            tiled.symlink_to(cloud.resolve())
        else:
            shutil.copy(cloud, tiled)
    return out


def drain(batches: Iterable[Any]) -> None:
    """Iterate ``batches`` to the end in a plain Python loop, as a training loop would."""
    for _ in batches:
        pass


def seconds(run: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call of ``run`` (what it returns is let go after the clock
    stops: return a dataset to leave its closing out of the time)."""
    start = time.perf_counter()
    kept = run()  # noqa: F841
    return time.perf_counter() - start


def cpu_seconds(children: bool = False) -> float:
    """CPU seconds of this process (what the machine's other jobs take does not count, page
    faults do), with ``children`` also those of its finished child processes (workers)."""
    if not children:
        return time.process_time()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(run: Callable[[], Any], children: bool = False) -> tuple[float, float]:
    """Wall seconds and CPU seconds (:func:`cpu_seconds`) of one call of ``run``."""
    wall, cpu = time.perf_counter(), cpu_seconds(children)
    kept = run()  # noqa: F841
    return time.perf_counter() - wall, cpu_seconds(children) - cpu


def interleaved(rounds: int, runs: Mapping[K, Callable[[], T]], *,
                progress: bool = True) -> dict[K, list[T]]:
    """Call every run once per round, in order, ``rounds`` times, so that drifts in the
    machine's load hit each alike: the results of each run, one per round."""
    out: dict[K, list[T]] = {key: [] for key in runs}
    for r in range(rounds):
        for key, run in runs.items():
            out[key].append(run())
        if progress:
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
    return out


def ratio_of_rounds(a: Sequence[float], b: Sequence[float]) -> tuple[float, list[float]]:
    """The median of the per-round ratios ``a[r] / b[r]`` and their range [min, max]: rounds
    run side by side, so each ratio is free of the load both sides shared."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(ratios), [min(ratios), max(ratios)]


def command_line() -> str:
    """The command that ran this script, as a results file records it."""
    return " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def write_results(path: Path | str, doc: Any, indent: int = 2) -> None:
    """Write ``doc`` as JSON to ``path``, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent))
