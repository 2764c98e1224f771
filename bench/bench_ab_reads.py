"""Same-run A/B of the read path: this checkout against another (an earlier commit's worktree).

    python bench/bench_ab_reads.py --against ../packdata-133c3d1 [--count 20000] [--rounds 9]

Each round runs, in alternation, a fresh interpreter of each checkout (its own packdata first
on the path) that converts the same PNGs into LMDB, HDF5 and tar with its own code (once, then
kept), reads one untimed epoch with ``packdata.loader`` (0 workers, reads in process: the read
path alone), then times 4 epochs, each beside an in-RAM numpy gather of the same number of
sorted batches in the same process; a round's figure is the median ratio loader ÷ gather. The
result per container is the median over rounds of this checkout's figure over the other's, from
the same round: a busy machine moves both sides of a round alike.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import CIFAR_PNG, build_folder, command_line, parser, write_results

ROOT = Path(__file__).resolve().parents[1]
CONTAINERS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}

CHILD = r"""
import inspect, json, sys, time
from pathlib import Path
import numpy as np
import packdata
src, work = Path(sys.argv[1]), Path(sys.argv[2])
out = {}
for fmt, name in json.loads(sys.argv[3]).items():
    dst = work / name
    if not dst.exists():
        packdata.convert(packdata.open_source(src), dst, workers=2)
    ds = packdata.open(dst)
    # the read path alone: no feeder process where the checkout has one
    kw = {"feeder": False} if "feeder" in inspect.signature(packdata.loader).parameters else {}
    loader = packdata.loader(ds, 256, shuffle=True, **kw)
    for _ in loader:  # the first epoch checks every record: not what is compared
        pass
    images = np.stack([np.asarray(ds[i][0]) for i in range(len(ds))])
    ratios = []
    for r in range(4):
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[0])
        read = time.perf_counter() - start
        order = np.random.default_rng(r).permutation(len(images))
        start = time.perf_counter()
        for s in range(0, n - 255, 256):
            np.take(images, np.sort(order[s:s + 256]), axis=0)
        gather = time.perf_counter() - start
        ratios.append((n / read) / ((n // 256 * 256) / gather))
    out[fmt] = sorted(ratios)[len(ratios) // 2]
print(json.dumps(out))
"""


def figure(checkout: Path, png: Path, work: Path) -> dict[str, float]:
    """One round's loader ÷ gather per container, read by ``checkout``'s packdata."""
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(png), str(work),
                          json.dumps(CONTAINERS)], capture_output=True, text=True, check=False,
                         cwd=work, env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"})
    if run.returncode:
        raise SystemExit(f"{checkout}: {run.stderr.strip().splitlines()[-1]}")
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, count=20_000, rounds=9, results="ab_reads.json")
    p.add_argument("--against", type=Path, required=True, help="the other checkout")
    args = p.parse_args()
    sides = {"this": ROOT, "other": args.against.resolve()}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="packdata-ab-") as tmp:
        png = build_folder(args.data, Path(tmp) / "png", args.count)
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for r in range(args.rounds):
            for side, checkout in (sides.items() if r % 2 == 0 else reversed(sides.items())):
                (Path(tmp) / side).mkdir(exist_ok=True)
                runs[side].append(figure(checkout, png, Path(tmp) / side))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{c} {runs['this'][-1][c] / runs['other'][-1][c]:.3f}" for c in CONTAINERS),
                file=sys.stderr)
    summary = {}
    for c in CONTAINERS:
        pairs = [t[c] / o[c] for t, o in zip(runs["this"], runs["other"])]
        summary[c] = {"this_over_other": statistics.median(pairs), "range": [min(pairs), max(pairs)],
                      "this_vs_ram": statistics.median(t[c] for t in runs["this"]),
                      "other_vs_ram": statistics.median(o[c] for o in runs["other"])}
        print(f"{c}: this checkout {summary[c]['this_over_other']:.3f}× the other's read rate "
              f"(rounds {min(pairs):.3f}–{max(pairs):.3f})")
    doc = {"command": command_line(), "count": args.count, "rounds": args.rounds,
           "against": args.against.name, "time": time.strftime("%Y-%m-%d %H:%M"),
           "load_average": [load_before, os.getloadavg()],
           "summary": summary, "runs": runs}
    if args.json:
        write_results(args.json, doc)


if __name__ == "__main__":
    main()
