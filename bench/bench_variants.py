"""Reading one of K stored point-cloud variants: selected reads vs reading all K and slicing.

    python bench/bench_variants.py [--data ../shared/data/lidar/trees] [--clouds 160] [--json PATH]

Tiles the real tree scans to ``--clouds`` clouds, presamples 4 variants of 4,096 points each
(random sampling, to keep conversion short), and times batches of 32 random clouds read both ways
from every container, in the same run. Prints clouds/s and the ratio.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from _shared import LIDAR_TREES, command_line, parser, tile_clouds, write_results

import packdata
from packdata import sources


def best_rate(fn, batches, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            fn(b)
        best = min(best, (time.perf_counter() - start) / len(batches))
    return len(batches[0]) / best


def main() -> None:
    p = parser(__doc__, data=LIDAR_TREES, results="variants.json")
    p.add_argument("--clouds", type=int, default=160)
    args = p.parse_args()
    rows = []
    kind = sources.get("pointcloud")
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = tile_clouds(args.data, Path(tmp) / "clouds", args.clouds)
        source = packdata.open_source(folder, points=4096, variants=4, sampling="random")
        print("| container | all K read, slice (clouds/s) | selected variant (clouds/s) | ratio |")
        print("|---|---:|---:|---:|")
        for target in ("pc.h5", "pc-tar", "pc.lmdb"):
            ds = packdata.open(packdata.convert(source, Path(tmp) / target, workers=2).path)
            reader = ds.reader
            rng = np.random.default_rng(0)
            batches = [rng.permutation(len(ds))[:32] for _ in range(60)]

            def all_k(b, ds=ds, reader=reader):
                batch = reader.read(b)
                chosen = kind.select(ds.manifest, b, 0)
                return {k: batch[k][np.arange(len(b)), v] for k, v in chosen.items()}

            def selected(b, ds=ds, reader=reader):
                return reader.read(b, kind.select(ds.manifest, b, 0))

            full, sel = best_rate(all_k, batches), best_rate(selected, batches)
            print(f"| {ds.manifest.container} | {full:,.0f} | {sel:,.0f} | {sel / full:.2f}× |")
            rows.append({"container": ds.manifest.container, "all_k_clouds_per_s": full,
                         "selected_clouds_per_s": sel, "ratio": sel / full})
    write_results(args.json, {
        "command": command_line(), "clouds": args.clouds, "variants": 4, "points": 4096,
        "batch": 32, "cores": os.cpu_count(), "load_average_at_end": list(os.getloadavg()),
        "python": platform.python_version(), "rows": rows})


if __name__ == "__main__":
    main()
