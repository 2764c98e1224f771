"""What contiguous N×C×H×W batches (the default) cost against channels-last ones, same run.

    python bench/bench_layout.py DATASET [--rounds 5] [--seconds 0.5] [--json out.json]

DATASET is any packdata image dataset (e.g. ``packdata convert ./cifar-png cifar.lmdb``). For
``packdata.loader`` (no workers) and the stock ``DataLoader(ds, 256, shuffle=True)``, each round
times the default (``packdata.open(p)``: contiguous images, one copy per batch) right beside
``packdata.open(p, channels_last=True)`` (the pixels as stored, no copy); the ratio printed is the
median of the per-round ratios, since absolute rates move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from torch.utils.data import DataLoader

import packdata
from packdata.bench.throughput import sample_rate

BATCH = 256
LOADERS = {
    "packdata.loader": lambda ds: packdata.loader(ds, BATCH, shuffle=True, num_workers=0),
    "stock DataLoader": lambda ds: DataLoader(ds, batch_size=BATCH, shuffle=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="per loader and round")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    layouts = {"contiguous": packdata.open(args.dataset),
               "channels_last": packdata.open(args.dataset, channels_last=True)}
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name, make in LOADERS.items():
            for layout, ds in layouts.items():
                loader = make(ds)
                rates.setdefault((name, layout), []).append(
                    sample_rate(lambda loader=loader: loader, min_seconds=args.seconds))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    rows = []
    for name in LOADERS:
        ratios = [a / b for a, b in zip(rates[(name, "contiguous")], rates[(name, "channels_last")])]
        rows.append({"loader": name, "rounds": args.rounds,
                     "contiguous_samples_per_s": statistics.median(rates[(name, "contiguous")]),
                     "channels_last_samples_per_s": statistics.median(rates[(name, "channels_last")]),
                     "contiguous_vs_channels_last": statistics.median(ratios),
                     "ratio_range": [min(ratios), max(ratios)]})
        row = rows[-1]
        print(f"{name}: contiguous {row['contiguous_samples_per_s']:,.0f}/s, channels-last "
              f"{row['channels_last_samples_per_s']:,.0f}/s, ratio {row['contiguous_vs_channels_last']:.2f} "
              f"({min(ratios):.2f}–{max(ratios):.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
