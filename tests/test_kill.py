"""Kill anywhere, bounded for CI: conversions SIGKILLed at random points (main process, a
worker, the whole group) never leave a partial dataset that opens, nor processes, nor
leftovers a rerun does not clean up and report. The long run is bench/kill_conversions.py."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packdata.sources.images import ImageSource
from tests.conftest import load_script

kill = load_script(Path(__file__).resolve().parents[1] / "bench" / "kill_conversions.py", "kill_conversions")
full_disk = load_script(Path(__file__).resolve().parents[1] / "bench" / "full_disk.py", "full_disk")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux process groups and /proc")


@pytest.mark.parametrize("container", ["lmdb", "hdf5", "tar"])
def test_random_kills_leave_no_partial_dataset(tmp_path, container):
    result = kill.run(tmp_path, container, kills=3, rng=random.Random(container), count=200)
    assert result["failed_trials"] == 0, result["failures"]
    assert sum(result["counts"].get(f"{t} killed", 0) for t in kill.KILL_TARGETS) == 3


@pytest.mark.parametrize("container", ["lmdb", "hdf5", "tar"])
def test_sigterm_at_every_phase_ends_the_conversion_at_once_leaving_nothing(tmp_path, container):
    """`kill` (SIGTERM) of `packdata convert` at each phase, aimed, not by chance: the child
    stops itself there (listing its inputs, loading the first blocks in its workers, closing
    its pool, finishing the output, renaming it into place), is sent SIGTERM and continues.
    Every time its whole process group is gone within 2 s, with one `interrupted` line and no
    dataset, or (a signal held while the output is renamed into place) with the complete
    dataset; nothing is left beside it."""
    import packdata

    src = kill.make_source(tmp_path / "src", 500)  # two blocks: a pool of two workers
    options = {"shard_size": "100"} if container == "tar" else None
    reference = packdata.convert(packdata.open_source(src), tmp_path / f"ref-{container}",
                                 workers=2, container_options=options).manifest
    dst = tmp_path / "out" / kill.TARGETS[container]
    dst.parent.mkdir()
    phases = set()
    for point in kill.aimed_points(1):
        if dst.exists():
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        result = kill.trial(src, dst, container, "term", 0, reference, point)
        assert result["failures"] == [], result
        assert result["aimed"] == list(point), result  # it stopped where it was told
        phases.add(result["phase"])
    assert phases == {"listing", "loading", "pool closing", "finishing", "publishing"}


class SlowImages(ImageSource):
    """Tasks of 4 images taking 2 s each: workers are busy when their parent dies."""

    def blocks(self, items):
        return [items[i : i + 4] for i in range(0, len(items), 4)]

    def load(self, item):
        time.sleep(0.5)
        return super().load(item)


def test_workers_die_with_a_sigkilled_parent(tmp_path, png_folder):
    dst = tmp_path / "out.lmdb"
    pid = kill.start_conversion(png_folder, dst, "lmdb", source=SlowImages(png_folder))
    deadline = time.monotonic() + 10
    while len(kill.children_of(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    workers = kill.children_of(pid)
    assert len(workers) == 2
    time.sleep(0.3)  # the workers are inside a task
    kill.os.kill(pid, kill.signal.SIGKILL)
    kill.os.waitpid(pid, 0)
    deadline = time.monotonic() + 1.0  # a worker's task alone lasts 2 s
    while kill.group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kill.group_members(pid) == []
    assert kill.rerun(png_folder, dst, "lmdb") == []  # cleans the leftover up and says so


@pytest.mark.parametrize("target", ["o.lmdb", "o.h5", "o-tar"])
def test_a_full_disk_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, png_folder,
                                                                   target):
    """The output may not grow past 150 kB (RLIMIT_FSIZE, as a full filesystem would stop it):
    packdata convert says so in one line naming DST, and nothing is left beside it."""
    import json
    import os
    import resource
    import signal

    from typer.testing import CliRunner

    from packdata.cli import app

    out = tmp_path / "out"
    out.mkdir()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))
        result = CliRunner().invoke(app, ["convert", str(png_folder), str(out / target),
                                          "--workers", "1"])
        os.write(write_fd, json.dumps([result.exit_code, result.output]).encode())
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        code, output = json.loads(f.read())
    assert code == 2
    (line,) = output.strip().splitlines()
    assert line.startswith(f"error: {out / target}: cannot write the output (")
    assert line.endswith("); nothing was left behind")
    assert ("Input/output error" if target.endswith("lmdb") else "File too large") in line
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("container", ["lmdb", "hdf5", "tar"])
def test_a_full_filesystem_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, png_folder,
                                                                         container):
    """A real full disk (ENOSPC): `packdata convert` onto tmpfs filesystems too small for its
    output, filled at spread points (the records, the index and record arrays, the manifest),
    each time one line naming DST and nothing left on the filesystem, or, where it fits, a
    dataset that verifies (HDF5 closed before its objects are freed: once a SIGSEGV). The
    tmpfs are mounted in a mount namespace of the test's own; bench/full_disk.py is the long
    run."""
    extra = ["--shard-size", "100KB"] if container == "tar" else []
    try:
        result = full_disk.in_namespace(full_disk.sweep, png_folder, container,
                                        ["--workers", "2", *extra], 3, tmp_path, (0.97,))
    except OSError as exc:
        pytest.skip(f"no mount namespace to mount a small filesystem in: {exc} (needs root, or "
                    "unprivileged user namespaces)")
    assert result["counts"].get("failure", 0) == 0, result["failures"]
    assert result["counts"]["one line, nothing left"] >= 3, result


def _placed_onto_a_small_disk(src: Path, work: Path, size: int) -> dict:
    """Inside the namespace: a placed HDF5 conversion (2 workers) onto a tmpfs of ``size``
    bytes (:func:`full_disk.one_run`), and the processes whose placed write met ENOSPC."""
    import errno
    import os

    from packdata.containers.placement import FilePlacement

    failed = work / "failed-in"
    write = FilePlacement.write

    def noted(self, slot, columns):
        try:
            return write(self, slot, columns)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                with open(failed, "a") as f:
                    f.write(f"{os.getpid()}\n")
            raise

    FilePlacement.write = noted  # the conversion's process and its workers are forked after
    try:
        result = full_disk.one_run(src, work / "mnt", "hdf5", ["--workers", "2"], size, work)
    finally:
        FilePlacement.write = write
    result["failed_in"] = failed.read_text().split() if failed.exists() else []
    return result


def test_a_full_disk_met_by_a_worker_writing_in_place_is_one_line_leaving_nothing(tmp_path,
                                                                                 png_folder):
    """The records of a placed HDF5 conversion are written by its workers (pwrite into the
    file's space, allocated but not yet written: a tmpfs holds no page of it): a full disk
    fails a worker's write, and the command still says it in one line naming DST, leaving
    nothing on the filesystem."""
    try:  # 120 images of 3 kB: a disk of 200 kB is full in the records
        result = full_disk.in_namespace(_placed_onto_a_small_disk, png_folder, tmp_path, 200_000)
    except OSError as exc:
        pytest.skip(f"no mount namespace to mount a small filesystem in: {exc} (needs root, or "
                    "unprivileged user namespaces)")
    assert result["outcome"] == "one line, nothing left", result
    assert "No space left on device" in result["lines"][-1], result
    assert result["failed_in"], result  # in a worker's placed write, not the parent's


class DiesMidSend(ImageSource):
    """The worker loading the 9th image dies as if SIGKILLed in the middle of sending a result:
    half a message in the result pipe, and the pipe's lock never released."""

    def blocks(self, items):
        return [items[i : i + 4] for i in range(0, len(items), 4)]

    def load(self, item):
        if item.key.endswith("_0002") and "automobile" in item.key:
            import os
            import signal
            import struct
            import sys

            # the worker loop's result queue, found up the stack (the collector no longer lists
            # objects the worker inherited: the pool forks with them frozen)
            frame = sys._getframe()
            while "result_queue" not in frame.f_locals:
                frame = frame.f_back
            queue = frame.f_locals["result_queue"]
            queue._wlock.acquire()
            os.write(queue._writer.fileno(), struct.pack("!i", 1_000_000) + bytes(100))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().load(item)


def test_a_worker_killed_mid_send_is_an_error_not_a_hang(tmp_path, png_folder):
    import packdata
    from packdata.errors import PackdataError

    start = time.monotonic()
    with pytest.raises(PackdataError, match="a conversion worker stopped unexpectedly"):
        packdata.convert(DiesMidSend(png_folder), tmp_path / "out.h5", workers=2)
    assert time.monotonic() - start < 30
    assert list(tmp_path.iterdir()) == []


KILL_DURING_SHUTDOWN = r"""
import os, signal, sys, threading, time
from pathlib import Path
import packdata
from packdata.conversion.local import load_blocks

source = packdata.open_source(sys.argv[1])
items = source.items()
blocks = [items[i:i + 10] for i in range(0, len(items), 10)]
records = load_blocks(source, blocks, 2)
for _ in range(len(blocks)):  # every result received; the generator still holds its pool
    next(records)
time.sleep(0.5)  # both workers idle, one of them in the task queue's get
workers = [int(p) for p in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()]
waiting = {p: Path(f"/proc/{p}/wchan").read_text() for p in workers}
# the idle worker that holds the task queue's read lock waits in a pipe read; the other waits
# for the lock (a futex)
holder = next(p for p, w in waiting.items() if "pipe" in w)
os.kill(holder, signal.SIGSTOP)  # it cannot read its stop sentinel now
# the generator's last step: its pool shut down as at the end of every conversion
closing = threading.Thread(target=next, args=(records, None))
closing.start()
time.sleep(1.0)  # the pool has sent its sentinels and joins its workers
os.kill(holder, signal.SIGKILL)  # dies holding the lock
closing.join(timeout=20)
print("HUNG" if closing.is_alive() else "DONE", waiting, flush=True)
os._exit(0)
"""


def test_a_worker_killed_while_the_pool_shuts_down_is_not_a_hang(png_folder):
    """Deterministic form of the kill benchmark's hang: the idle worker holding the task
    queue's read lock is stopped, the pool starts shutting down (every result was received),
    then the worker is SIGKILLed. The conversion's pool must still come down."""
    run = subprocess.run([sys.executable, "-c", KILL_DURING_SHUTDOWN, str(png_folder)],
                         capture_output=True, text=True, timeout=120,
                         start_new_session=True)  # a hung pool's workers die with the group
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("DONE"), run.stdout
