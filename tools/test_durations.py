"""Where the test suite's time goes, from pytest's junit report.

    python -m pytest -n 2 --junitxml=REPORT.xml          # .ci/run writes one
    python tools/test_durations.py REPORT.xml [--json tests/durations.json] [--note TEXT]

Prints pytest's own wall time, the summed time of the tests (setup, call and teardown; over
both workers, so about twice the wall time), each file's share and the slowest tests. With
``--json`` it writes the same as tests/durations.json holds: the figures to compare when a
change makes the suite slower. On a machine shared with other work every figure stretches with
the load: compare shares (which tests dominate), and say the load average in ``--note``.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def durations(report: Path) -> dict:
    """Wall time, test count, summed time, per file and per test (seconds, slowest first)."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    tests: dict[str, float] = {}
    for case in root.iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # tests.containers.test_lmdb.TestLMDB -> tests/containers/test_lmdb.py::TestLMDB
        split = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        path = "/".join(parts[: split + 1]) + ".py"
        inner = "::".join([*parts[split + 1:], case.get("name", "")])
        tests[f"{path}::{inner}"] = tests.get(f"{path}::{inner}", 0.0) + float(case.get("time", 0))
    files: dict[str, float] = defaultdict(float)
    for test, seconds in tests.items():
        files[test.split("::", 1)[0]] += seconds
    return {
        "wall_s": round(float(suite.get("time", 0)), 1),
        "tests": len(tests),
        "summed_s": round(sum(tests.values()), 1),
        "files": {f: round(s, 1) for f, s in sorted(files.items(), key=lambda x: -x[1])},
        "slowest": [[t, round(s, 2)] for t, s in sorted(tests.items(), key=lambda x: -x[1])[:60]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--note", default="", help="how the run was made (machine, load average)")
    args = p.parse_args(argv)
    doc = {"note": args.note, **durations(args.report)}
    print(f"pytest's time {doc['wall_s']} s, {doc['tests']} tests, {doc['summed_s']} s summed")
    for name, seconds in list(doc["files"].items())[:15]:
        print(f"{seconds:8.1f} s  {100 * seconds / doc['summed_s']:4.1f} %  {name}")
    for name, seconds in doc["slowest"][:15]:
        print(f"{seconds:8.1f} s  {name}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
