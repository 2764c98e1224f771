"""``packdata`` and ``python -m packdata``: the command line, with Ctrl-C handled before the
first heavy import (torch loads for seconds; an interrupt then is one line, not a traceback)."""

from __future__ import annotations

import multiprocessing
import signal
import sys

from packdata import interrupts

if getattr(multiprocessing.current_process(), "_inheriting", False):
    # a worker process the command spawned (Dask's, the pool's) re-imports the command's main
    # module: a terminal's Ctrl-C reaches it too, but stopping it is the command's job (one
    # line, the workers shut down), not a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    interrupts.install()  # first: importing this module means running the command line


def main() -> int:
    interrupts.install()  # again, for a caller that imported this module long before
    try:
        from packdata.cli import run

        return run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        _forget_unhandled_interrupt()
        return 130


def _forget_unhandled_interrupt() -> None:
    """Let the process exit with the status :func:`main` returns.

    A KeyboardInterrupt that leaves code run from a string (``exec``/``eval`` of source text, as
    dataclasses and namedtuples do while modules import) sets CPython's "unhandled interrupt"
    flag, and the interpreter then ends by killing itself with SIGINT even though the interrupt
    was handled here. Each string evaluation clears the flag first, so one that succeeds leaves
    it clear."""
    eval("None")


if __name__ == "__main__":
    sys.exit(main())
