"""Ctrl-C for the command line, and `kill` for a conversion: handled from their first
instruction, and never lost.

Python raises KeyboardInterrupt wherever the main thread happens to be, and drops it ("Exception
ignored in...") when that is a finaliser. :func:`install` notes every SIGINT as well as raising,
and :func:`term_as_interrupt` every SIGTERM, so that :func:`check` at safe points (each block a
conversion writes, and before its output is published) raises what was dropped; the command
checks :func:`received` at the end.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1

_received = False
_terminated = False  # a SIGTERM arrived inside term_as_interrupt (its interrupt may be lost)
_depth = 0  # term_as_interrupt blocks entered and not left


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT from now on (main thread only: signal handlers live there), and keep
    quiet what finalisers raise once the command was interrupted (:func:`_quiet_after`)."""
    global _previous_hook
    signal.signal(signal.SIGINT, _on_sigint)
    if sys.unraisablehook is not _quiet_after:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _quiet_after


_previous_hook = sys.__unraisablehook__


def _quiet_after(unraisable: Any) -> None:
    """Report an exception a finaliser raised as Python does, unless the command was
    interrupted and it is not the interrupt itself: then it is the interrupt's doing (library
    code cut short mid-way, its object freed half made), and the command's one line says what
    happened (the interrupt, and that nothing was written)."""
    if received() and not isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    _previous_hook(unraisable)


def received() -> bool:
    """Whether a SIGINT arrived since :func:`install`, or a SIGTERM inside the last
    :func:`term_as_interrupt`."""
    return _received or _terminated


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived, or a SIGTERM inside
    :func:`term_as_interrupt` (one Python may have swallowed)."""
    if _received or _terminated:
        raise KeyboardInterrupt


@contextlib.contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM raised as KeyboardInterrupt inside the block, so that `kill` cleans up as Ctrl-C
    does (main thread of the main process only; elsewhere signals are left alone), and noted
    for :func:`check`."""
    global _terminated, _depth
    previous = None
    if multiprocessing.current_process().name == "MainProcess":
        with contextlib.suppress(ValueError):  # not the main thread
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    if not _depth:
        _terminated = False
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def term_held() -> Iterator[None]:
    """SIGTERM held back inside the block (where an interrupt would leave a claim untrue: an
    output renamed into place, then deleted as if unfinished), delivered as the block ends,
    to the handler in force then (main thread only; elsewhere nothing is held)."""
    held = threading.current_thread() is threading.main_thread()
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    global _terminated
    _terminated = True
    raise KeyboardInterrupt(f"signal {signum}")


def worker_started(parent: int) -> None:
    """Set up a process packdata started for its own work (a conversion worker, a loader's
    feeder): Ctrl-C is the parent's to handle (it stops us), the SIGTERM handler inherited by
    fork is undone, and the process dies with its parent however the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` dies, however it dies (a SIGKILL
    leaves it no chance to stop its children): Linux's parent-death signal."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
