"""Kill anywhere: conversions SIGKILLed at random points (the main process, one worker, or the
whole process group), then checked.

    python bench/kill_conversions.py [--kills 100] [--seed 0] [--json bench/results/kill.json]

Each trial forks a child that becomes its own process group and converts 500 real CIFAR-10 PNGs
(packdata/demo_data) with 2 workers into one container; after a random delay (up to 1.2 times a
clean conversion's duration) the harness SIGKILLs the target. Then, per trial:

- every process of the group is gone within 5 s (workers die with their parent);
- ``packdata.open(DST)`` either refuses (no dataset) or opens a complete dataset whose keys and
  checksums equal a clean conversion's and whose every record matches its CRC-32;
- leftovers beside DST (``.DST.partial-*``) remain only if the main process was SIGKILLed, and
  then the next conversion removes them, says so, and completes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

import packdata
import packdata.containers
from packdata.errors import DatasetError
from packdata.verify import verify

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
KILL_TARGETS = ("main", "worker", "group")
GONE_WITHIN_S = 5.0
HANG_S = 30.0  # a conversion still running this long after a kill is counted as hung


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def start_conversion(src: Path, dst: Path, container: str, source=None) -> int:
    """Fork a child converting ``src`` (or ``source``) into ``dst``; it leads a new process
    group."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setpgid(0, 0)
            options = {"shard_size": "100"} if container == "tar" else None
            packdata.convert(source or packdata.open_source(src), dst, workers=2,
                             container_options=options)
        except BaseException:  # noqa: BLE001 - the harness only needs the exit status
            code = 1
        os._exit(code)
    with contextlib.suppress(OSError):  # set here too, so a kill right away finds the group
        os.setpgid(pid, pid)
    return pid


def partials(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.glob(f".{dst.name}.partial-*"))


def trial(src: Path, dst: Path, container: str, target: str, delay: float,
          reference: packdata.Manifest) -> dict:
    """One conversion killed after ``delay`` seconds; the checks listed in the module doc."""
    pid = start_conversion(src, dst, container)
    time.sleep(delay)
    victim = None
    if target == "group":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    elif target == "main":
        victim = pid
    else:
        workers = children_of(pid)
        victim = workers[0] if workers else None  # none yet, or the pool already ended
    if victim is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    deadline, hung = time.monotonic() + HANG_S, False
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:  # the conversion no longer progresses: end it
            hung = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    status = done[1]
    main_killed = os.WIFSIGNALED(status) and not hung
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := group_members(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    result = {"target": target, "delay": round(delay, 3), "main_killed": main_killed,
              "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
              "stray_processes": len(left), "failures": []}
    if hung:
        result["failures"].append(f"the conversion hung: no exit {HANG_S} s after the kill")
    try:
        ds = packdata.open(dst)
    except DatasetError as exc:
        result["opened"] = False
        if dst.exists():  # refused, but something is at DST: it must not block a rerun
            result["refused_at_dst"] = str(exc)
    else:
        result["opened"] = True
        report = verify(dst)
        same = ds.manifest.keys == reference.keys and np.array_equal(ds.manifest.checksums,
                                                                     reference.checksums)
        if not same or not report.ok:
            result["failures"].append("a dataset that opens differs from a clean conversion")
    left_over = partials(dst)
    result["leftovers"] = len(left_over)
    if left_over and not main_killed:
        result["failures"].append(f"leftovers without a SIGKILL of the main process: {left_over}")
    if left:
        result["failures"].append(f"{len(left)} processes alive {GONE_WITHIN_S} s after the kill")
    return result


def rerun(src: Path, dst: Path, container: str) -> list[str]:
    """A conversion after a trial: it must complete, remove and report every leftover."""
    before = partials(dst)
    options = {"shard_size": "100"} if container == "tar" else None
    try:
        result = packdata.convert(packdata.open_source(src), dst, workers=2, overwrite=True,
                                  container_options=options)
    except packdata.PackdataError as exc:
        try:
            packdata.containers.for_existing(dst)
            why = ""
        except packdata.PackdataError as cause:
            why = f" (because: {cause})"
        return [f"the rerun failed: {exc}{why}"]
    failures = []
    if sorted(Path(p).name for p in result.removed_stale) != before:
        failures.append(f"removed {result.removed_stale}, left over were {before}")
    if partials(dst):
        failures.append(f"leftovers after a complete conversion: {partials(dst)}")
    if not verify(dst).ok:
        failures.append("the rerun's dataset does not verify")
    return failures


def make_source(out: Path, count: int = 500) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import copy_sample

    return copy_sample(out, count=count)


def run(work: Path, container: str, kills: int, rng: random.Random, count: int = 500) -> dict:
    src = make_source(work / f"src-{container}", count)
    dst = work / container / TARGETS[container]
    dst.parent.mkdir()
    start = time.perf_counter()
    options = {"shard_size": "100"} if container == "tar" else None
    reference = packdata.convert(packdata.open_source(src), work / f"ref-{TARGETS[container]}",
                                 workers=2, container_options=options).manifest
    clean_s = time.perf_counter() - start
    counts: Counter = Counter()
    failures = []
    for _ in range(kills):
        if dst.exists():  # start each trial from nothing at DST (a rerun may have made it)
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        target = rng.choice(KILL_TARGETS)
        r = trial(src, dst, container, target, rng.uniform(0, 1.2 * clean_s), reference)
        counts[f"{target} killed"] += 1
        counts["opened complete" if r["opened"] else "refused"] += 1
        counts["leftovers"] += bool(r["leftovers"])
        counts["hung"] += any("hung" in f for f in r["failures"])
        if r["leftovers"] or rng.random() < 0.25:
            r["failures"] += rerun(src, dst, container)
            counts["reruns"] += 1
        if r["failures"]:
            failures.append(r)
    return {"kills": kills, "clean_seconds": round(clean_s, 2), "counts": dict(counts),
            "failed_trials": len(failures), "failures": failures[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="per container")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for container in TARGETS:
            results[container] = run(Path(tmp), container, args.kills,
                                     random.Random(f"{args.seed}-{container}"))
            print(container, json.dumps({k: v for k, v in results[container].items()
                                         if k != "failures"}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python bench/kill_conversions.py " + " ".join(sys.argv[1:]),
            "containers": results}, indent=2))


if __name__ == "__main__":
    main()
