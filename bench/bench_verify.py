"""What checksums at read cost: packdata.open(..., verify="full") against verify="off", same run.

    python bench/bench_verify.py [--data ../shared/data/cifar10/test-png] [--count 20000]
        [--rounds 5] [--json bench/results/verify.json]

Builds a folder of real CIFAR-10 PNGs (repeated to ``--count``), converts it into every container
(raw pixels), and ``--count``/4 text documents (the PEP fixtures repeated; byte tokens, variable
length, padded by PadCollate), then times
samples/s through ``packdata.loader(ds, batch_size=256, shuffle=True)`` in the main process,
off and full back to back in each round (interleaved: the machine is shared). The ratio reported
is the median of per-round ratios full/off. Also times opening with verify="sample" (CRC of 8
records) against "off".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_containers import build_folder  # noqa: E402

import packdata  # noqa: E402
from packdata.bench.throughput import sample_rate  # noqa: E402

BATCH = 256
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
PEPS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "text" / "peps"


def text_folder(out: Path, count: int) -> Path:
    """``count`` real documents: the PEP fixtures repeated under new names."""
    import itertools
    import shutil

    out.mkdir(parents=True)
    peps = sorted(PEPS.glob("*.txt"))
    for i, pep in zip(range(count), itertools.cycle(peps)):
        shutil.copyfile(pep, out / f"{pep.stem}_{i:06d}.txt")
    return out


def open_seconds(path: Path, level: str, repeats: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        packdata.open(path, verify=level)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/cifar10/test-png"))
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/verify.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", args.count)
        sets = {}
        for name, source, options in (
            ("cifar", packdata.open_source(folder), {"shard_size": "5000"}),
            ("text", packdata.open_source(text_folder(Path(tmp) / "text-src", args.count // 4)),
             {"shard_size": "500"}),
        ):
            for container, target in TARGETS.items():
                sets[f"{name}-{container}"] = packdata.convert(
                    source, Path(tmp) / name / target, workers=2,
                    container_options=options if container == "tar" else None).path
        for name, path in sets.items():
            rates = {"off": [], "full": []}
            for _ in range(args.rounds):
                for level in rates:
                    ds = packdata.open(path, verify=level)
                    collate = packdata.PadCollate() if name.startswith("text") else None
                    rates[level].append(sample_rate(
                        lambda ds=ds, c=collate: packdata.loader(ds, batch_size=BATCH,
                                                                 shuffle=True, collate=c),
                        min_seconds=args.seconds, warmup_batches=1))
            ratios = [f / o for f, o in zip(rates["full"], rates["off"])]
            opens = {lv: open_seconds(path, lv) for lv in ("off", "sample")}
            row = {"dataset": name, "samples": len(packdata.open(path)),
                   "off_samples_per_s": statistics.median(rates["off"]),
                   "full_samples_per_s": statistics.median(rates["full"]),
                   "full_over_off": statistics.median(ratios),
                   "full_over_off_per_round": ratios,
                   "open_ms_off": opens["off"] * 1e3, "open_ms_sample": opens["sample"] * 1e3}
            rows.append(row)
            print(f"{name:12s} off {row['off_samples_per_s']:>10,.0f}/s  full "
                  f"{row['full_samples_per_s']:>10,.0f}/s  full/off {row['full_over_off']:.2f}  "
                  f"open off {row['open_ms_off']:.1f} ms, sample {row['open_ms_sample']:.1f} ms",
                  flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "command": "python bench/bench_verify.py " + " ".join(sys.argv[1:]),
        "batch_size": BATCH, "rounds": args.rounds, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
