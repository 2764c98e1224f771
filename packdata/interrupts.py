"""Ctrl-C for the command line: handled from its first instruction, and never lost.

Python raises KeyboardInterrupt wherever the main thread happens to be, and drops it ("Exception
ignored in...") when that is a finaliser. :func:`install` notes every SIGINT as well as raising,
so the command checks :func:`received` at safe points and at the end.
"""

from __future__ import annotations

import signal
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
