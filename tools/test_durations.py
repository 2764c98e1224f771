"""Where the test suite's time goes, from pytest's junit report.

    python -m pytest -n 2 --junitxml=REPORT.xml          # .ci/run writes one
    python tools/test_durations.py REPORT.xml [--json tests/durations.json] [--note TEXT]

Prints pytest's own wall time, the summed time of the tests (setup, call and teardown; over
both workers, so about twice the wall time) and their CPU seconds (tests/conftest.py records
each test's, its subprocesses' included), each file's share and the slowest tests, by CPU
where recorded. With ``--json`` it writes what tests/durations.json holds: the figures to
compare when a change makes the suite slower. On a machine shared with other work the wall
times stretch with the load and the CPU seconds do not: compare CPU seconds and shares (which
tests dominate), and say the load average in ``--note``.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def durations(report: Path) -> dict:
    """Wall time, test count, and per file and per test (slowest first) the seconds each took
    and, where the tests' conftest recorded it, the CPU seconds (the test's process and the
    children it waited for), which a busy machine does not stretch."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        # tests.containers.test_lmdb.TestLMDB -> tests/containers/test_lmdb.py::TestLMDB
        split = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        name = "::".join(["/".join(parts[: split + 1]) + ".py", *parts[split + 1:],
                          case.get("name", "")])
        wall[name] += float(case.get("time", 0))
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                cpu[name] += float(prop.get("value", 0))

    def by_file(per_test: dict[str, float]) -> dict[str, float]:
        files: dict[str, float] = defaultdict(float)
        for test, seconds in per_test.items():
            files[test.split("::", 1)[0]] += seconds
        return {f: round(s, 1) for f, s in sorted(files.items(), key=lambda x: -x[1])}

    def slowest(per_test: dict[str, float]) -> list:
        return [[t, round(s, 2)] for t, s in sorted(per_test.items(), key=lambda x: -x[1])[:60]]

    return {
        "wall_s": round(float(suite.get("time", 0)), 1),
        "tests": len(wall),
        "summed_s": round(sum(wall.values()), 1),
        "cpu_s": round(sum(cpu.values()), 1),
        "files_s": by_file(wall),
        "files_cpu_s": by_file(cpu),
        "slowest_s": slowest(wall),
        "slowest_cpu_s": slowest(cpu),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--note", default="", help="how the run was made (machine, load average)")
    args = p.parse_args(argv)
    doc = {"note": args.note, **durations(args.report)}
    print(f"pytest's time {doc['wall_s']} s, {doc['tests']} tests, {doc['summed_s']} s summed, "
          f"{doc['cpu_s']} CPU s")
    key = "cpu_s" if doc["cpu_s"] else "summed_s"
    files = doc["files_cpu_s"] if doc["cpu_s"] else doc["files_s"]
    tests = doc["slowest_cpu_s"] if doc["cpu_s"] else doc["slowest_s"]
    unit = "CPU s" if doc["cpu_s"] else "s"
    for name, seconds in list(files.items())[:15]:
        print(f"{seconds:8.1f} {unit}  {100 * seconds / doc[key]:4.1f} %  {name}")
    for name, seconds in tests[:15]:
        print(f"{seconds:8.1f} {unit}  {name}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
