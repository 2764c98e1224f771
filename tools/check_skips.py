"""Fail a test run that skipped what this machine should have run.

Usage: ``python tools/check_skips.py REPORT.xml`` (pytest's ``--junitxml`` report; .ci/run
writes it). A skip is expected only for hardware the machine lacks or has: the CUDA tests
where no CUDA device is present, the no-CUDA tests where one is. Anything else that skips on
CI (packdata's native routines not built, an extra of ``[test]`` not installed, a container's
batch plan, a Linux facility) means the run did not test what it claims to: the skip is named
and the exit status is 1.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

#: skip reason → whether it is expected with a CUDA device present (True) or absent (False)
EXPECTED = {
    "needs a CUDA device": False,
    "pinned memory needs CUDA": False,
    "needs a machine without a GPU": True,
    "checks the no-CUDA behaviour": True,
    "pinning works where CUDA is": True,
}


def skips(report: Path) -> list[tuple[str, str]]:
    """(test id, reason) of each skipped test in a junit report."""
    out = []
    for case in ET.parse(report).iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None and skipped.get("type") != "pytest.xfail":
            reason = skipped.get("message", "").removeprefix("Skipped: ")
            out.append((f"{case.get('classname')}::{case.get('name')}", reason))
    return out


def unexpected(found: list[tuple[str, str]], cuda: bool) -> list[tuple[str, str]]:
    return [(test, reason) for test, reason in found if EXPECTED.get(reason) is not cuda]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    report = Path(argv[0])
    if not report.is_file():
        print(f"error: no test report at {report} (did the tests run?)", file=sys.stderr)
        return 1
    import torch

    cuda = torch.cuda.is_available()
    found = skips(report)
    wrong = unexpected(found, cuda)
    for test, reason in wrong:
        print(f"unexpected skip: {test}: {reason}", file=sys.stderr)
    print(f"{len(found)} skipped, {len(wrong)} unexpected (CUDA device: {'yes' if cuda else 'no'})")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
