"""``packdata`` and ``python -m packdata``: the command line, with Ctrl-C handled before the
first heavy import (torch loads for seconds; an interrupt then is one line, not a traceback)."""

from __future__ import annotations

import sys

from packdata import interrupts

interrupts.install()  # first: importing this module means running the command line


def main() -> int:
    interrupts.install()  # again, for a caller that imported this module long before
    try:
        from packdata.cli import run

        return run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
