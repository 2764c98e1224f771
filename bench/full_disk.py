"""Full disks: `packdata convert` onto small real filesystems, where writes fail with ENOSPC.

    python bench/full_disk.py [--sizes 40] [--count 500] [--json bench/results/full_disk.json]

For each container and input (CIFAR-10 PNGs, the PEP text fixtures, the LiDAR fixtures), the
output of a conversion is measured on a large filesystem, then the conversion runs again onto
a tmpfs of each of ``--sizes`` sizes spread evenly from 4 KiB to 1.5 times that (and a few
just below it), so that the disk fills at every phase: while records are written, while the
index and the record arrays are, while the manifest is. Each run is ``packdata convert`` (the
command line, in a process forked for it, 2 workers) and must end in one of two ways: exit
status 2 with exactly one line besides the warnings about its inputs, ``error: DST: cannot write
the output (…); nothing was left behind``, and the filesystem empty; or exit status 0 with a
dataset that opens and verifies. Anything else (a traceback, a signal, a second line, a file
left) is a failure.

The tmpfs are mounted in a mount namespace of the script's own (``unshare``: as root, or as a
user where unprivileged user namespaces are allowed), so nothing is mounted on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
LINE_START, LINE_END = "error: ", "; nothing was left behind"
OUTCOMES = ("one line, nothing left", "complete", "failure")

_libc = ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_namespace() -> None:
    """This (single-threaded, freshly forked) process in mount namespace of its own, as root
    there: mounts made from now on are seen by it and its children only."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER
    _call(_libc.unshare(flags), "unshare")
    if uid != 0:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    _call(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")


def mount_tmpfs(where: Path, size: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    _call(_libc.mount(b"tmpfs", str(where).encode(), b"tmpfs", 0, f"size={size}".encode()),
          f"mount tmpfs at {where}")


def umount(where: Path) -> None:
    _call(_libc.umount2(str(where).encode(), 0), f"umount {where}")


def in_namespace(fn, *args):
    """``fn(*args)`` (its result JSON) in a forked child inside its own mount namespace; raises
    OSError where no namespace can be made (neither root nor user namespaces)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            enter_namespace()
            out = {"result": fn(*args)}
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            out = {"error": f"{type(exc).__name__}: {exc}", "errno": getattr(exc, "errno", None),
                   "where": traceback.format_exc()[-1500:]}
        with os.fdopen(write_fd, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        raw = f.read()
    os.waitpid(pid, 0)
    out = json.loads(raw) if raw else {"error": "the namespace's process died"}
    if "error" in out:
        if out.get("errno") is not None and "unshare" in out["error"] + out.get("where", ""):
            raise OSError(out["errno"], out["error"])
        raise RuntimeError(out["error"] + "\n" + out.get("where", ""))
    return out["result"]


def convert_cli(src: Path, dst: Path, options: list[str], output: Path) -> int:
    """``packdata convert SRC DST OPTIONS`` in a forked process, its output into ``output``;
    its exit status (a signal as its negative number)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            # (a test's capture replaces sys.stdout and sys.stderr, which the command writes to)
            sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115
            from packdata import interrupts
            from packdata.cli import run

            interrupts.install()
            code = run(["convert", str(src), str(dst), *options])
        except BaseException:  # noqa: BLE001 - reported through the output and status
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def one_run(src: Path, mnt: Path, container: str, options: list[str], size: int,
            work: Path) -> dict:
    """One conversion onto a tmpfs of ``size`` bytes at ``mnt``; judged as the module says."""
    import packdata
    from packdata.verification import verify

    mount_tmpfs(mnt, size)
    try:
        dst = mnt / TARGETS[container]
        output = work / "output.txt"
        code = convert_cli(src, dst, options, output)
        lines = output.read_text(errors="replace").strip().splitlines()
        left = sorted(os.listdir(mnt))
        result = {"size": size, "exit": code, "lines": lines[-3:], "left": left[:5]}
        said = [line for line in lines if not line.startswith("warning: ")]  # about the inputs
        if code == 2:
            ok = (len(said) == 1 and said[0].startswith(f"{LINE_START}{dst}: cannot write the "
                                                        "output (")
                  and said[0].endswith(LINE_END) and not left)
            result["outcome"] = "one line, nothing left" if ok else "failure"
        elif code == 0:
            try:
                ok = verify(dst).ok and len(packdata.open(dst)) > 0
            except Exception as exc:  # noqa: BLE001 - a complete dataset must open
                ok, result["error"] = False, repr(exc)
            result["outcome"] = "complete" if ok else "failure"
        else:
            result["outcome"] = "failure"
        return result
    finally:
        with contextlib.suppress(OSError):
            umount(mnt)


def sweep(src: Path, container: str, options: list[str], sizes: int, work: Path,
          near: tuple[float, ...] = (0.9, 0.97, 0.99, 0.995)) -> dict:
    """The conversion's output size on a large tmpfs, then ``sizes`` runs spread up to 1.5
    times it, and runs at the fractions ``near`` of it (see the module doc). Run inside
    :func:`in_namespace`."""
    from packdata.cli.app import build_convert

    build_convert()  # the command built once, here, not in every conversion's process
    big = one_run(src, work / "big", container, options, 1 << 30, work)
    if big["outcome"] != "complete":
        raise RuntimeError(f"the conversion fails on a large filesystem: {big}")
    mount_tmpfs(work / "big", 1 << 30)  # again, to measure what it wrote
    try:
        convert_cli(src, work / "big" / TARGETS[container], options, work / "output.txt")
        st = os.statvfs(work / "big")
        need = (st.f_blocks - st.f_bfree) * st.f_frsize
    finally:
        umount(work / "big")
    points = sorted({max(4096, round(1.5 * need * k / sizes)) for k in range(sizes)} |
                    {round(need * f) for f in near})
    runs = [one_run(src, work / "mnt", container, options, size, work) for size in points]
    counts = Counter(r["outcome"] for r in runs)
    return {"output_bytes": need, "runs": len(runs),
            "counts": {k: counts[k] for k in OUTCOMES},  # zeros too
            "failures": [r for r in runs if r["outcome"] == "failure"][:5],
            "sizes": [[r["size"], r["outcome"]] for r in runs]}


def inputs(work: Path, count: int) -> dict[str, tuple[Path, list[str]]]:
    """The inputs converted: name → (folder, extra options)."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import copy_sample

    out = {"cifar": (copy_sample(work / "cifar", count=count), []),
           "text": (ROOT / "tests" / "fixtures" / "text" / "peps", [])}
    clouds = work / "lidar"
    clouds.mkdir()
    for f in (ROOT / "tests" / "fixtures" / "lidar").glob("ahn_*.la[sz]"):
        shutil.copy(f, clouds / f.name)
    out["lidar"] = (clouds, ["--points", "1024", "--variants", "2"])
    return out


def run(work: Path, containers: list[str], sizes: int, count: int,
        kinds: tuple[str, ...] = ("cifar", "text", "lidar")) -> dict:
    found = {k: v for k, v in inputs(work / "src", count).items() if k in kinds}
    results = {}
    for kind, (src, options) in found.items():
        for container in containers:
            extra = ["--shard-size", "100KB"] if container == "tar" else []
            results[f"{kind}-{container}"] = in_namespace(
                sweep, src, container, ["--workers", "2", *options, *extra], sizes, work)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, default=40, help="filesystem sizes per dataset")
    parser.add_argument("--count", type=int, default=500, help="CIFAR PNGs converted")
    parser.add_argument("--containers", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started, load_at_start = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        results = run(Path(tmp), args.containers, args.sizes, args.count)
        for name, r in results.items():
            print(name, json.dumps({k: v for k, v in r.items() if k in ("runs", "counts")}),
                  flush=True)
            for failure in r["failures"]:
                print(json.dumps(failure), flush=True)
        if args.json:  # the temporary folder named as TMP: no machine paths
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "command": "python bench/full_disk.py " + " ".join(sys.argv[1:]),
                "seconds": round(time.time() - started, 1),
                "load_average_at_start": [round(x, 2) for x in load_at_start],
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                "datasets": results},
                indent=2).replace(tmp, "TMP"))


if __name__ == "__main__":
    main()
