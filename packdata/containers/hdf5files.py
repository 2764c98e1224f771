"""HDF5 files being written: libhdf5's failures as the system's errors, and files given up
closed so that nothing of theirs is freed open (on a full disk, libhdf5's last writes fail in
h5py's finalisers, which drop the error and then end the interpreter with SIGSEGV)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import h5py


def abandon(file: h5py.File) -> None:
    """Close an HDF5 file whose output is being given up (deleted next). libhdf5 flushes its
    caches at close: on a full disk (or past a file-size limit) that write fails, the file
    stays open inside the library, and freeing one of its h5py objects afterwards kills the
    interpreter (SIGSEGV). The file's descriptor is first pointed at /dev/null, where writes
    cannot fail, not even past a size limit (a file in memory can): the close's only failure
    left is its last step, setting the file's length, which it reports once it has let the
    file go (tests/test_kill.py frees the objects after it)."""
    with contextlib.suppress(Exception):
        fd = file.id.get_vfd_handle()
        spare = os.open(os.devnull, os.O_RDWR)
        os.dup2(spare, fd)
        os.close(spare)
    with contextlib.suppress(Exception):
        file.close()


@contextlib.contextmanager
def plain_errors() -> Iterator[None]:
    """libhdf5's failure to write as the system's error it reports (its message spans lines,
    with a time and a buffer address; a failed close is h5py's RuntimeError)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        found = re.search(r"errno = (\d+)", str(exc))
        code = getattr(exc, "errno", None) or (int(found.group(1)) if found else None)
        if code is None:
            raise
        raise OSError(code, os.strerror(code)) from None
