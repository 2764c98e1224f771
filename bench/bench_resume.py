"""How long ``packdata check-resume`` takes with its default scenarios on real images.

    python bench/bench_resume.py [--data ../shared/data/cifar10/test-png] [--out bench/results/resume.json]

Converts the folder once (raw pixels, tar shards of 1,000) into a temporary directory, then runs
the check-resume command as a user would (``python -m packdata check-resume DATASET``, its
defaults: 3 samplers × 3 setups, 2 trials each), timing it end to end, process start included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import packdata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10/test-png"))
    parser.add_argument("--container", default="tar")
    parser.add_argument("--out", type=Path, default=Path("bench/results/resume.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        dst = Path(tmp) / ("data-tar" if args.container == "tar" else f"data.{args.container}")
        options = {"shard_size": "1000"} if args.container == "tar" else None
        start = time.perf_counter()
        converted = packdata.convert(packdata.open_source(args.data), dst,
                                     container=args.container, container_options=options)
        convert_s = time.perf_counter() - start
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "packdata", "check-resume", str(dst)],
                             capture_output=True, text=True)
        seconds = time.perf_counter() - start
    print(run.stdout, run.stderr, sep="\n")
    result = {
        "command": "python bench/bench_resume.py", "samples": converted.manifest.count,
        "container": args.container, "cores": len(os.sched_getaffinity(0)),
        "convert_s": round(convert_s, 1), "check_resume_s": round(seconds, 1),
        "exit_code": run.returncode, "table": run.stdout.strip().splitlines()}
    print(json.dumps({k: v for k, v in result.items() if k != "table"}))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
