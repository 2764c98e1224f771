"""Writing outputs so that nothing half-written is ever taken for a whole one.

Every output is built under a hidden partial name beside its destination and renamed into place
only once complete (:func:`committing`); a failure or an interruption deletes it. Partials of
processes that were killed outright (SIGKILL, power loss) carry their process id and are removed
by the next conversion to the same destination.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packdata import interrupts
from packdata.interrupts import term_as_interrupt, term_held


def remove(path: Path) -> None:
    """Delete a file or a folder, whichever ``path`` is (nothing if it is gone)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def partial_path(dst: Path) -> Path:
    """A fresh hidden name beside ``dst`` for building it: ``.NAME.partial-PID-RANDOM``."""
    return dst.parent / f".{dst.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def publish(tmp: Path, dst: Path) -> None:
    """Put the finished ``tmp`` at ``dst`` (replacing what is there) with one rename."""
    if dst.exists() or dst.is_symlink():
        remove(dst)
    os.replace(tmp, dst)


def write_file(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a hidden file beside ``path``, then renamed to ``path``: readers see
    the old file or the whole new one. The hidden file is removed if ``write`` fails."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    """``path.write_bytes(data)``, atomically (see :func:`write_file`)."""
    write_file(path, lambda tmp: tmp.write_bytes(data))


def link_file(src: Path, dst: Path) -> None:
    """``src`` also at ``dst`` (a hard link, atomically): the original stays whole, so work
    interrupted halfway can be redone from it."""
    write_file(dst, lambda tmp: os.link(src, tmp))


def remove_stale_partials(dst: Path) -> list[str]:
    """Delete the partials of ``dst`` left by processes that no longer exist; what was removed."""
    removed = []
    for partial in dst.parent.glob(f".{glob.escape(dst.name)}.partial-*"):
        pid = partial.name.rsplit(".partial-", 1)[1].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            removed.append(str(partial))
            remove(partial)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Partial:
    """The output being built (:attr:`path`) and the stale partials removed before it."""

    path: Path
    removed_stale: list[str] = field(default_factory=list)


@contextlib.contextmanager
def committing(dst: Path) -> Iterator[Partial]:
    """Build ``dst`` at the yielded partial path; on leaving normally it is renamed into place.
    On any failure, Ctrl-C or SIGTERM (raised as KeyboardInterrupt here), the partial and every
    file named after it (spools) are deleted and the exception goes on. A SIGTERM that arrives
    while the output is renamed into place is held until that is done, then meets the handler
    the caller had (by default it ends the process: the output is complete)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    stale = remove_stale_partials(dst)
    partial = Partial(partial_path(dst), stale)
    held = contextlib.ExitStack()  # left after term_as_interrupt: SIGTERM meets its old handler
    try:
        with held, term_as_interrupt():
            yield partial
            interrupts.check()  # an interrupt some finaliser swallowed: not published
            held.enter_context(term_held())
            publish(partial.path, dst)
    except BaseException:
        remove(partial.path)
        for leftover in partial.path.parent.glob(f"{glob.escape(partial.path.name)}.*"):
            remove(leftover)
        raise
