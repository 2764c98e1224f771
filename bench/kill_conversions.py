"""Kill anywhere: conversions SIGKILLed at random points (the main process, one worker, or the
whole process group), then checked.

    python bench/kill_conversions.py [--kills 100] [--seed 0] [--json bench/results/kill.json]
                                     [--containers tar] [--targets worker] [--delays 0.8 1.3]

Each trial forks a child that becomes its own process group and converts 500 real CIFAR-10 PNGs
(packdata/demo_data) with 2 workers into one container; after a random delay (up to 1.2 times a
clean conversion's duration, measured warm for that container: the median of 3 forked
conversions after one untimed one) the harness SIGKILLs the target. Every trial's target and
delay are recorded. A conversion still running 30 s after the kill is hung: its threads' stacks
are dumped (faulthandler, SIGUSR1) with the kernel's wait channel of each of its processes, then
it is killed. Then, per trial:

- every process of the group is gone within 5 s (workers die with their parent);
- ``packdata.open(DST)`` either refuses (no dataset) or opens a complete dataset whose keys and
  checksums equal a clean conversion's and whose every record matches its CRC-32;
- leftovers beside DST (``.DST.partial-*``) remain only if the main process was SIGKILLed, and
  then the next conversion removes them, says so, and completes.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

import packdata
import packdata.containers
from packdata.errors import DatasetError
from packdata.verification import verify

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


def start_conversion(src: Path, dst: Path, container: str, source=None,
                     stacks: Path | None = None) -> int:
    """Fork a child converting ``src`` (or ``source``) into ``dst``; it leads a new process
    group. With ``stacks``, SIGUSR1 makes it write every thread's stack there."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setpgid(0, 0)
            if stacks is not None:
                faulthandler.register(signal.SIGUSR1, file=stacks.open("w"), all_threads=True)
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


def wait_channels(pid: int) -> dict[int, str]:
    """What each live process of group ``pid`` waits on in the kernel (futex_wait: a lock or
    semaphore; pipe_read: a pipe), by pid."""
    out = {}
    for member in group_members(pid):
        with contextlib.suppress(OSError):
            out[member] = Path(f"/proc/{member}/wchan").read_text()
    return out


def trial(src: Path, dst: Path, container: str, target: str, delay: float,
          reference: packdata.Manifest) -> dict:
    """One conversion killed after ``delay`` seconds; the checks listed in the module doc."""
    stacks = dst.parent / "stacks.txt"
    pid = start_conversion(src, dst, container, stacks=stacks)
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
            channels = wait_channels(pid)
            with contextlib.suppress(ProcessLookupError):  # workers inherit the handler
                os.killpg(pid, signal.SIGUSR1)
            time.sleep(1.0)
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
        result["wait_channels"] = {str(k): v for k, v in channels.items()}
        result["stacks"] = stacks.read_text().splitlines() if stacks.exists() else []
    with contextlib.suppress(FileNotFoundError):
        stacks.unlink()
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


def clean_seconds(src: Path, dst: Path, container: str, runs: int = 3) -> float:
    """A clean conversion's time as a trial sees it (fork to exit), warm: one untimed
    conversion first (imports, page cache), then the median of ``runs``."""
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        pid = start_conversion(src, dst, container)
        _, status = os.waitpid(pid, 0)
        if i:
            times.append(time.perf_counter() - start)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            raise RuntimeError(f"a clean {container} conversion failed")
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    return statistics.median(times)


def run(work: Path, container: str, kills: int, rng: random.Random, count: int = 500,
        targets: tuple[str, ...] = KILL_TARGETS, delays: tuple[float, float] = (0.0, 1.2)) -> dict:
    src = make_source(work / f"src-{container}", count)
    dst = work / container / TARGETS[container]
    dst.parent.mkdir()
    options = {"shard_size": "100"} if container == "tar" else None
    reference = packdata.convert(packdata.open_source(src), work / f"ref-{TARGETS[container]}",
                                 workers=2, container_options=options).manifest
    clean_s = clean_seconds(src, dst, container)
    counts: Counter = Counter()
    failures, trials = [], []
    for _ in range(kills):
        if dst.exists():  # start each trial from nothing at DST (a rerun may have made it)
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        target = rng.choice(targets)
        delay = rng.uniform(delays[0] * clean_s, delays[1] * clean_s)
        r = trial(src, dst, container, target, delay, reference)
        trials.append({"target": target, "delay": r["delay"], "opened": r["opened"],
                       "leftovers": r["leftovers"], "main_killed": r["main_killed"],
                       "hung": any("hung" in f for f in r["failures"])})
        counts[f"{target} killed"] += 1
        counts["opened complete" if r["opened"] else "refused"] += 1
        counts["leftovers"] += bool(r["leftovers"])
        counts["hung"] += any("hung" in f for f in r["failures"])
        if r["leftovers"] or rng.random() < 0.25:
            r["failures"] += rerun(src, dst, container)
            counts["reruns"] += 1
        if r["failures"]:
            failures.append(r)
    return {"kills": kills, "clean_seconds": round(clean_s, 3),
            "delay_range_s": [round(delays[0] * clean_s, 3), round(delays[1] * clean_s, 3)],
            "counts": dict(counts), "failed_trials": len(failures), "failures": failures[:5],
            "trials": trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="per container")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--containers", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--targets", nargs="+", choices=KILL_TARGETS, default=list(KILL_TARGETS))
    parser.add_argument("--delays", nargs=2, type=float, default=[0.0, 1.2], metavar=("LO", "HI"),
                        help="kill after LO..HI times the clean conversion's time")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for container in args.containers:
            results[container] = run(Path(tmp), container, args.kills,
                                     random.Random(f"{args.seed}-{container}"),
                                     targets=tuple(args.targets), delays=tuple(args.delays))
            print(container, json.dumps({k: v for k, v in results[container].items()
                                         if k not in ("failures", "trials")}), flush=True)
            for failure in results[container]["failures"]:
                print(json.dumps(failure, indent=1), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(portable(json.dumps({
            "command": "python bench/kill_conversions.py " + " ".join(sys.argv[1:]),
            "containers": results}, indent=2), tmp))


def portable(text: str, tmp: str) -> str:
    """Results without this machine's paths: the checkout, the temporary folder and the Python
    installation named as ROOT, TMP and PYTHON."""
    lib = str(Path(os.__file__).parent)
    return text.replace(str(ROOT), "ROOT").replace(tmp, "TMP").replace(lib, "PYTHON")


if __name__ == "__main__":
    main()
