"""Ctrl-C for the command line: handled from its first instruction, and never lost.

Python raises KeyboardInterrupt wherever the main thread happens to be, and drops it ("Exception
ignored in...") when that is a finaliser. :func:`install` notes every SIGINT as well as raising,
so the command checks :func:`received` at safe points and at the end.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from collections.abc import Iterator
from types import FrameType

_received = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT from now on (main thread only: signal handlers live there)."""
    signal.signal(signal.SIGINT, _on_sigint)


def received() -> bool:
    """Whether a SIGINT arrived since :func:`install`."""
    return _received


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived (one Python may have swallowed)."""
    if _received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM raised as KeyboardInterrupt inside the block, so that `kill` cleans up as Ctrl-C
    does (main thread of the main process only; elsewhere signals are left alone)."""
    previous = None
    if multiprocessing.current_process().name == "MainProcess":
        with contextlib.suppress(ValueError):  # not the main thread
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
