"""What contiguous N×C×H×W batches (the default) cost against channels-last ones, same run.

    python bench/bench_layout.py DATASET [--rounds 5] [--seconds 0.5] [--json out.json]

DATASET is any packdata image dataset (e.g. ``packdata convert ./cifar-png cifar.lmdb``). For
``packdata.loader`` (no workers) and the stock ``DataLoader(ds, 256, shuffle=True)``, each round
times the default (``packdata.open(p)``: contiguous images, one copy per batch) right beside
``packdata.open(p, channels_last=True)`` (the pixels as stored, no copy); the ratio printed is the
median of the per-round ratios, since absolute rates move with the machine's load.
"""

from __future__ import annotations

import statistics

from _shared import interleaved, parser, ratio_of_rounds, write_results
from torch.utils.data import DataLoader

import packdata
from packdata.bench.throughput import sample_rate

BATCH = 256
LOADERS = {
    "packdata.loader": lambda ds: packdata.loader(ds, BATCH, shuffle=True, num_workers=0,
                                                  feeder=False),
    "stock DataLoader": lambda ds: DataLoader(ds, batch_size=BATCH, shuffle=True),
}


def main() -> None:
    p = parser(__doc__, dataset=True, rounds=5)
    p.add_argument("--seconds", type=float, default=0.5, help="per loader and round")
    args = p.parse_args()
    layouts = {"contiguous": packdata.open(args.dataset),
               "channels_last": packdata.open(args.dataset, channels_last=True)}

    def rate(make, ds) -> float:
        loader = make(ds)
        return sample_rate(lambda: loader, min_seconds=args.seconds)

    rates = interleaved(args.rounds, {
        (name, layout): lambda make=make, ds=ds: rate(make, ds)
        for name, make in LOADERS.items() for layout, ds in layouts.items()})
    rows = []
    for name in LOADERS:
        ratio, (low, high) = ratio_of_rounds(rates[(name, "contiguous")],
                                             rates[(name, "channels_last")])
        rows.append({"loader": name, "rounds": args.rounds,
                     "contiguous_samples_per_s": statistics.median(rates[(name, "contiguous")]),
                     "channels_last_samples_per_s": statistics.median(rates[(name, "channels_last")]),
                     "contiguous_vs_channels_last": ratio, "ratio_range": [low, high]})
        row = rows[-1]
        print(f"{name}: contiguous {row['contiguous_samples_per_s']:,.0f}/s, channels-last "
              f"{row['channels_last_samples_per_s']:,.0f}/s, ratio {ratio:.2f} "
              f"({low:.2f}–{high:.2f})")
    if args.json:
        write_results(args.json, rows)


if __name__ == "__main__":
    main()
