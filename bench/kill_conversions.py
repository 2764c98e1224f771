"""Kill anywhere: conversions SIGKILLed at random points (the main process, one worker, or the
whole process group) or sent SIGTERM (as `kill` does), then checked.

    python bench/kill_conversions.py [--kills 100] [--seed 0] [--json bench/results/kill.json]
                                     [--containers tar] [--targets worker term] [--delays 0.8 1.3]
                                     [--real-worker-kills 100] [--aimed 4] [--count 500]

Each trial forks a child that becomes its own process group and runs ``packdata convert`` (the
command line, in the child) on 500 real CIFAR-10 PNGs (packdata/demo_data) with 2 workers into
one container. The child traces what it is doing into memory it shares with the harness (hooks
installed in the child only: :class:`Trace`): its phase (listing the inputs, loading them in the
workers, closing the worker pool, finishing the output, publishing it) and, for each worker,
whether it is inside a task. A trial's signal goes, after a delay (up to 1.2 times a clean
conversion's duration, measured warm for that container: the median of 3 forked conversions
after one untimed one), to its target; the phase and, for a worker kill, the victim's state are
read the instant before the signal: ``before`` (it has started no task yet), ``during`` (inside
a task: a real kill of a working worker), ``between`` (idle, with tasks still to hand out),
``at shutdown`` (idle once every task was handed out), or ``no worker`` (none alive: no kill).
SIGTERM trials are also aimed (``--aimed N``): the child stops itself at a point (the start of
each phase, the N-th block loaded), the harness sends SIGTERM and lets it go on, so every phase
is signalled by construction, not by chance.

A conversion still running 30 s after the signal is hung: its threads' stacks are dumped
(faulthandler, SIGUSR1) with the kernel's wait channel of each of its processes, then it is
killed. Then, per trial:

- every process of the group is gone within 5 s (workers die with their parent); after SIGTERM
  the whole group within 2 s, with one ``interrupted`` line and exit status 130 (or the
  complete dataset, when the signal came after it was published);
- ``packdata.open(DST)`` either refuses (no dataset) or opens a complete dataset whose keys and
  checksums equal a clean conversion's and whose every record verifies;
- leftovers beside DST (``.DST.partial-*``) remain only if the main process was SIGKILLed, and
  then the next conversion removes them, says so, and completes.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import json
import mmap
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

import packdata
import packdata.containers
from packdata import atomic, interrupts
from packdata.cli import run as run_command
from packdata.cli.app import build_convert
from packdata.conversion import local, pool
from packdata.errors import DatasetError
from packdata.verification import verify

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
KILL_TARGETS = ("main", "worker", "group")
TARGETS_ALL = (*KILL_TARGETS, "term")
GONE_WITHIN_S = 5.0
TERM_WITHIN_S = 2.0  # a SIGTERMed conversion's group must be gone this soon
HANG_S = 30.0  # a conversion still running this long after a kill is counted as hung
PHASES = ("starting", "listing", "loading", "pool closing", "finishing", "publishing", "done")
LIFE = ("before", "during", "between", "at shutdown", "no worker")


class Trace:
    """What a conversion is doing, in an anonymous shared map made before the fork: the main
    process's phase (an index of :data:`PHASES`), the blocks to load, and a slot per worker
    (by pid): its pid, whether it is inside a task, how many it has started. Written by hooks
    the child installs (:meth:`install`), read by the harness at the instant of a signal."""

    SLOTS = 64

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, 8 * (4 + 3 * self.SLOTS))
        self.a = np.frombuffer(self.map, dtype=np.int64)
        self.stop_at: tuple[str, int] | None = None  # (phase, n): the child stops itself there

    def set_phase(self, name: str, n: int = 0) -> None:
        self.a[0] = PHASES.index(name)
        if self.stop_at == (name, n):
            os.kill(os.getpid(), signal.SIGSTOP)  # the harness signals, then continues us

    @property
    def phase(self) -> str:
        return PHASES[int(self.a[0])]

    def _slot(self, pid: int) -> int:
        return 4 + 3 * (pid % self.SLOTS)

    def task(self, inside: bool) -> None:
        s = self._slot(os.getpid())
        self.a[s] = os.getpid()
        self.a[s + 1] = inside
        self.a[s + 2] += inside

    def life(self, pid: int | None) -> str:
        """Where worker ``pid`` is in its life (see the module doc)."""
        if pid is None:
            return "no worker"
        s = self._slot(pid)
        if self.a[s] != pid or not self.a[s + 2]:
            return "before"
        if self.a[s + 1]:
            return "during"
        started = sum(int(self.a[self._slot(p) + 2]) for p in self.workers())
        return "at shutdown" if started >= self.a[1] or self.a[0] >= PHASES.index(
            "pool closing") else "between"

    def workers(self) -> list[int]:
        return [int(self.a[4 + 3 * k]) for k in range(self.SLOTS) if self.a[4 + 3 * k]]

    def install(self) -> None:
        """Hooks in this (the child) process: module functions wrapped, their names kept, so
        that the workers, forked from it, run the same wrappers."""
        trace = self
        load_blocks, load_block = local.load_blocks, local._load_block
        close, finish, publish = pool.WorkerPool.close, local._Records.finish, atomic.publish

        def traced_load_blocks(source, blocks, workers, *args, **kwargs):
            blocks = list(blocks)
            trace.a[1] = len(blocks)
            trace.set_phase("loading")
            for n, loaded in enumerate(load_blocks(source, blocks, workers, *args, **kwargs)):
                yield loaded
                if trace.stop_at == ("loading", n + 1):
                    trace.set_phase("loading", n + 1)

        @functools.wraps(load_block)
        def traced_load_block(items, *args, **kwargs):
            trace.task(True)
            try:
                return load_block(items, *args, **kwargs)
            finally:
                trace.task(False)

        def traced_close(pool_self, *args, **kwargs):
            trace.set_phase("pool closing")
            return close(pool_self, *args, **kwargs)

        def traced_finish(records, *args, **kwargs):
            trace.set_phase("finishing")
            return finish(records, *args, **kwargs)

        def traced_publish(tmp, dst, *args, **kwargs):
            trace.set_phase("publishing")
            return publish(tmp, dst, *args, **kwargs)

        local.load_blocks, local._load_block = traced_load_blocks, traced_load_block
        pool.WorkerPool.close, local._Records.finish = traced_close, traced_finish
        atomic.publish = traced_publish


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


def _command(src: Path, dst: Path, container: str) -> list[str]:
    shards = ["--shard-size", "100"] if container == "tar" else []
    return ["convert", str(src), str(dst), "--workers", "2", *shards]


def start_conversion(src: Path, dst: Path, container: str, source=None,
                     stacks: Path | None = None, trace: Trace | None = None,
                     output: Path | None = None) -> int:
    """Fork a child converting ``src`` into ``dst`` with ``packdata convert`` (or ``source``
    through the library); it leads a new process group. With ``stacks``, SIGUSR1 makes it
    write every thread's stack there; with ``trace``, it traces itself there; its output goes
    to ``output``."""
    if source is None:
        build_convert()  # the command built once, here, not in every child (seconds of imports)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setpgid(0, 0)
            if output is not None:
                fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                # (a test's capture replaces sys.stdout and sys.stderr, which the command writes to)
                sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115
            if stacks is not None:
                faulthandler.register(signal.SIGUSR1, file=stacks.open("w"), all_threads=True)
            if trace is not None:
                trace.install()
                trace.set_phase("listing")
            if source is not None:
                options = {"shard_size": "100"} if container == "tar" else None
                packdata.convert(source, dst, workers=2, container_options=options)
            else:
                interrupts.install()  # as `packdata` does before anything else
                code = run_command(_command(src, dst, container))
            if trace is not None:
                trace.set_phase("done")
        except BaseException:  # noqa: BLE001 - the harness needs the exit status (and why)
            code = 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
                sys.stderr.flush()
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


def _signal(pid: int, target: str, trace: Trace) -> dict:
    """Send ``target``'s signal; what the conversion was doing the instant before."""
    seen: dict = {"phase": trace.phase}
    if target == "group":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return seen
    victim = pid
    if target == "worker":
        workers = children_of(pid)
        victim = workers[0] if workers else None  # none yet, or the pool already ended
        seen["life"] = trace.life(victim)
    if victim is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGTERM if target == "term" else signal.SIGKILL)
    return seen


def trial(src: Path, dst: Path, container: str, target: str, delay: float,
          reference: packdata.Manifest, stop_at: tuple[str, int] | None = None) -> dict:
    """One conversion signalled after ``delay`` seconds (or, given ``stop_at``, where it stops
    itself); the checks listed in the module doc."""
    stacks, output = dst.parent / "stacks.txt", dst.parent / "output.txt"
    trace = Trace()
    trace.stop_at = stop_at
    pid = start_conversion(src, dst, container, stacks=stacks, trace=trace, output=output)
    stopped = False
    if stop_at is None:
        time.sleep(delay)
    else:  # wait for the child to stop itself where it was told (or to end without stopping)
        _, status = os.waitpid(pid, os.WUNTRACED)
        stopped = os.WIFSTOPPED(status)
    seen = _signal(pid, target, trace)
    signalled = time.monotonic()
    if stopped:
        os.kill(pid, signal.SIGCONT)
    deadline, hung = signalled + HANG_S, False
    done = (pid, status) if stop_at is not None and not stopped else (0, 0)
    while not done[0] and not (done := os.waitpid(pid, os.WNOHANG))[0]:
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
        time.sleep(0.002)
    status = done[1]
    main_killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and not hung
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := group_members(pid)) and time.monotonic() < deadline:
        time.sleep(0.002)
    gone_s = time.monotonic() - signalled if not left else None
    lines = output.read_text(errors="replace").strip().splitlines() if output.exists() else []
    result = {"target": target, "delay": round(delay, 3), "main_killed": main_killed,
              **seen, "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else
              -os.WTERMSIG(status), "gone_s": None if gone_s is None else round(gone_s, 3),
              "last_line": lines[-1] if lines else "", "stray_processes": len(left),
              "failures": []}
    if stop_at is not None:
        result["aimed"] = list(stop_at) if stopped else None
    if hung:
        result["failures"].append(f"the conversion hung: no exit {HANG_S} s after the signal")
        result["wait_channels"] = {str(k): v for k, v in channels.items()}
        result["stacks"] = stacks.read_text().splitlines() if stacks.exists() else []
    for path in (stacks, output):
        path.unlink(missing_ok=True)
    _check_dataset(dst, reference, result)
    left_over = partials(dst)
    result["leftovers"] = len(left_over)
    if left_over and not main_killed:
        result["failures"].append(f"leftovers without a SIGKILL of the main process: {left_over}")
    if left:
        result["failures"].append(f"{len(left)} processes alive {GONE_WITHIN_S} s after the kill")
    if target == "term":
        _check_term(result)
    return result


def _check_dataset(dst: Path, reference: packdata.Manifest, result: dict) -> None:
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


def _check_term(result: dict) -> None:
    """A SIGTERMed conversion ends within TERM_WITHIN_S, its group with it: with one
    ``interrupted`` line, status 130 and no dataset; or killed by the signal (Python's default
    action) before its output was begun or once it was complete (a signal that arrives while
    the output is renamed into place is held until it is: the dataset opens, the same as a
    clean conversion's); or having completed."""
    if result["gone_s"] is None or result["gone_s"] > TERM_WITHIN_S:
        result["failures"].append(f"still running {TERM_WITHIN_S} s after SIGTERM "
                                  f"(gone after {result['gone_s']} s)")
    ended = {130: result["last_line"].startswith("interrupted") and not result["opened"],
             0: result["last_line"].startswith("wrote") and result["opened"],
             -signal.SIGTERM: True}  # nothing, or the complete dataset (_check_dataset)
    if not ended.get(result["exit"], False):
        result["failures"].append(f"ended with status {result['exit']} and "
                                  f"{result['last_line']!r}")


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
        pid = start_conversion(src, dst, container, output=dst.parent / "output.txt")
        _, status = os.waitpid(pid, 0)
        if i:
            times.append(time.perf_counter() - start)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            raise RuntimeError(f"a clean {container} conversion failed")
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    return statistics.median(times)


def aimed_points(blocks_aimed: int) -> list[tuple[str, int]]:
    """Where aimed SIGTERM trials stop the child: each phase's start, and after each of the
    first ``blocks_aimed`` blocks loaded."""
    return [("listing", 0), ("loading", 0), *[("loading", n) for n in range(1, blocks_aimed + 1)],
            ("pool closing", 0), ("finishing", 0), ("publishing", 0)]


def run(work: Path, container: str, kills: int, rng: random.Random, count: int = 500,
        targets: tuple[str, ...] = KILL_TARGETS, delays: tuple[float, float] = (0.0, 1.2),
        real_worker_kills: int = 0, aimed: int = 0) -> dict:
    """``kills`` trials (targets drawn from ``targets``), then worker kills until
    ``real_worker_kills`` of them hit a worker inside a task (at most 5 times as many trials),
    then ``aimed`` rounds of SIGTERMs at every point of :func:`aimed_points`."""
    src = make_source(work / f"src-{container}", count)
    dst = work / container / TARGETS[container]
    dst.parent.mkdir()
    options = {"shard_size": "100"} if container == "tar" else None
    reference = packdata.convert(packdata.open_source(src), work / f"ref-{TARGETS[container]}",
                                 workers=2, container_options=options).manifest
    clean_s = clean_seconds(src, dst, container)
    # every phase and worker state counted, zeros too (the results' readers need no defaults)
    workers = "worker" in targets or real_worker_kills
    counts: Counter = Counter({f"phase: {p}": 0 for p in PHASES}
                              | ({f"worker: {w}": 0 for w in LIFE} if workers else {}))
    failures, trials = [], []

    def one(target: str, stop_at: tuple[str, int] | None = None) -> dict:
        if dst.exists():  # start each trial from nothing at DST (a rerun may have made it)
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        delay = rng.uniform(delays[0] * clean_s, delays[1] * clean_s) if stop_at is None else 0
        r = trial(src, dst, container, target, delay, reference, stop_at)
        hung = any("hung" in f for f in r["failures"])
        trials.append({k: r.get(k) for k in ("target", "delay", "phase", "life", "aimed",
                                             "exit", "gone_s", "opened", "leftovers",
                                             "main_killed") if k in r} | {"hung": hung})
        counts[f"{target} {'signalled' if target == 'term' else 'killed'}"] += 1
        counts["term aimed"] += bool(r.get("aimed"))  # stopped where it was aimed, signalled
        counts["opened complete" if r["opened"] else "refused"] += 1
        counts["leftovers"] += bool(r["leftovers"])
        counts["hung"] += hung
        counts[f"phase: {r['phase']}"] += 1
        if "life" in r:
            counts[f"worker: {r['life']}"] += 1
        if r["leftovers"] or rng.random() < 0.25:
            r["failures"] += rerun(src, dst, container)
            counts["reruns"] += 1
        if r["failures"]:
            failures.append(r)
        return r

    for _ in range(kills):
        one(rng.choice(targets))
    tries = 0
    while counts["worker: during"] < real_worker_kills and tries < 5 * real_worker_kills:
        one("worker")
        tries += 1
    for _ in range(aimed):
        for point in aimed_points(3):
            one("term", point)
    terms = [t for t in trials if t["target"] == "term"]
    return {"kills": kills, "clean_seconds": round(clean_s, 3),
            "delay_range_s": [round(delays[0] * clean_s, 3), round(delays[1] * clean_s, 3)],
            "counts": dict(counts), "failed_trials": len(failures), "failures": failures[:5],
            "term_gone_s_max": max((t["gone_s"] or HANG_S for t in terms), default=None),
            "trials": trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="per container")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--containers", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS_ALL, default=list(KILL_TARGETS))
    parser.add_argument("--delays", nargs=2, type=float, default=[0.0, 1.2], metavar=("LO", "HI"),
                        help="kill after LO..HI times the clean conversion's time")
    parser.add_argument("--real-worker-kills", type=int, default=0,
                        help="then kill workers until this many were inside a task")
    parser.add_argument("--count", type=int, default=500, help="PNGs converted")
    parser.add_argument("--aimed", type=int, default=0,
                        help="then this many rounds of SIGTERMs aimed at every phase")
    args = parser.parse_args()
    results, load_at_start = {}, os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for container in args.containers:
            results[container] = run(Path(tmp), container, args.kills,
                                     random.Random(f"{args.seed}-{container}"), args.count,
                                     targets=tuple(args.targets), delays=tuple(args.delays),
                                     real_worker_kills=args.real_worker_kills, aimed=args.aimed)
            print(container, json.dumps({k: v for k, v in results[container].items()
                                         if k not in ("failures", "trials")}), flush=True)
            for failure in results[container]["failures"]:
                print(json.dumps(failure, indent=1), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(portable(json.dumps({
            "command": "python bench/kill_conversions.py " + " ".join(sys.argv[1:]),
            "load_average_at_start": [round(x, 2) for x in load_at_start],
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "containers": results}, indent=2), tmp))


def portable(text: str, tmp: str) -> str:
    """Results without this machine's paths: the checkout, the temporary folder and the Python
    installation named as ROOT, TMP and PYTHON."""
    lib = str(Path(os.__file__).parent)
    return text.replace(str(ROOT), "ROOT").replace(tmp, "TMP").replace(lib, "PYTHON")


if __name__ == "__main__":
    main()
