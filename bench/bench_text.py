"""Text: padding of random vs length-bucketed batches, tokens/s delivered, conversion vs tokeniser.

    python bench/bench_text.py [--data ../shared/data/text/peps]
                               [--tokenizer ../shared/data/tokenizer/gpt2/tokenizer.json]

1. Padding per epoch (5 epochs): the real documents converted whole and split at 1,024 tokens,
   batched 64 at a time or by a 65,536-token budget (count × longest), at random
   (:class:`EpochBatchSampler`, or a random order cut by the budget) and length-bucketed
   (:class:`LengthBucketBatchSampler`, default bucket width).
2. Tokens/s delivered to a consuming loop: DataLoader(batch_size=None, bucketed sampler,
   PadCollate) over each container, the loop summing every batch's ids; real (unpadded) tokens
   counted, for at least ``--seconds`` per row.
3. Conversion throughput (tokens/s, 2 workers, whole documents, HDF5) against the tokeniser's own
   batch encoding of the same texts already in memory on the same cores, ``--repeats`` times
   alternating; the ratio of medians and each pair's ratio are reported.

``--training`` measures instead (→ ``bench/results/text_training.json``) real tokens per second
in training: examples/text_lm.py's causal LM (the same model, loss and optimiser) on every
non-blank line of every document (the whole corpus, so that every length bucket fills), fed by
the example's per-item tokenising baseline (a Dataset tokenising each line in ``__getitem__``,
random batches padded to their longest line) and by packdata (the lines pre-tokenised into HDF5,
:class:`LengthBucketBatchSampler` + ``PadCollate``), ``--train-seconds`` of steps per row and
round, ``--train-rounds`` interleaved rounds; real tokens are the predicted non-pad next tokens,
padding the share of pad positions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import packdata
from packdata.loading.buckets import LengthBucketBatchSampler, budget_batches, padding_fraction
from packdata.loading.collate import PadCollate
from packdata.loading.sampling import EpochBatchSampler

TARGETS = {"lmdb": "peps.lmdb", "hdf5": "peps.h5", "tar": "peps-tar"}
EPOCHS = 5


def padding_rows(lengths: dict[str, np.ndarray]) -> list[dict]:
    rows = []
    for docs, lens in lengths.items():
        for size in ({"batch_size": 64}, {"max_tokens": 65_536}):
            bucketed = LengthBucketBatchSampler(lens, **size, seed=0)
            random, bucket = [], []
            for epoch in range(EPOCHS):
                order = np.random.default_rng([0, epoch]).permutation(len(lens))
                if "batch_size" in size:
                    sampler = EpochBatchSampler(len(lens), 64, seed=0)
                    sampler.set_epoch(epoch)
                    batches = list(sampler)
                else:
                    batches = budget_batches(order, lens[order], size["max_tokens"])
                random.append(padding_fraction(batches, lens))
                bucket.append(bucketed.padding_fraction(epoch))
            rows.append({"documents": docs, "batching": next(f"{k}={v}" for k, v in size.items()),
                         "random": random, "bucketed": bucket,
                         "bucketed_batches": len(bucketed)})
    return rows


def delivered(path: Path, seconds: float, **size) -> dict:
    ds = packdata.open(path)
    sampler = LengthBucketBatchSampler(ds.lengths(), **size, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=sampler,
                                         collate_fn=PadCollate(pad_id=0))
    tokens = padded = 0
    checksum = 0
    rates = []  # one per epoch: the median resists other jobs on a shared machine
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0, before = time.perf_counter(), tokens
        for ids, mask in loader:
            checksum += int(ids.sum())  # the consumer touches every id
            tokens += int(mask.sum())
            padded += ids.numel()
        rates.append((tokens - before) / (time.perf_counter() - t0))
    return {"tokens_per_s": statistics.median(rates), "epochs": len(rates),
            "padding": 1 - tokens / padded}


def conversion_vs_tokenizer(data: Path, tokenizer: Path, tmp: Path, repeats: int) -> dict:
    from tokenizers import Tokenizer

    texts = [p.read_text(encoding="utf-8") for p in sorted(data.glob("*.txt"))]
    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_truncation()
    own, conv = [], []
    total = 0
    for r in range(repeats):
        start = time.perf_counter()  # what packdata calls: encode_batch_fast, no special tokens
        total = sum(len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=False))
        own.append(total / (time.perf_counter() - start))
        source = packdata.open_source(data, tokenizer=tokenizer)
        result = packdata.convert(source, tmp / f"conv{r}.h5", workers=2)
        assert int(packdata.open(result.path).lengths().sum()) == total
        conv.append(total / result.seconds)
    start = time.perf_counter()
    tok.encode_batch(texts, add_special_tokens=False)
    classic = total / (time.perf_counter() - start)
    return {"tokens": total, "tokenizer_batch_tokens_per_s": own, "convert_tokens_per_s": conv,
            "tokenizer_encode_batch_with_offsets_tokens_per_s": classic,
            "ratio_of_medians": statistics.median(conv) / statistics.median(own),
            "paired_ratios": [c / o for c, o in zip(conv, own)]}


def training(data: Path, tokenizer: Path, tmp: Path, seconds: float, rounds: int,
             batch_size: int = 16, max_length: int = 64) -> dict:
    """Real tokens/s of training steps fed by each loader (see the module's docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from text_lm import CausalLM, LineDataset, PadToLongest, lm_loss, read_lines

    from packdata.prep.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    pad_id = tok.pad_id if tok.pad_id is not None else tok.eos_id
    lines = read_lines(data)
    start = time.perf_counter()
    source = packdata.open_source(data, kind="text", tokenizer=tokenizer, per_line=True,
                                  add_bos=True, add_eos=True, max_length=max_length)
    packed = packdata.open(packdata.convert(source, tmp / "lines.h5", workers=2).path)
    convert_s = time.perf_counter() - start
    assert len(packed) == len(lines)
    per_item = LineDataset(lines, str(tokenizer), max_length)
    per_item.bos, per_item.eos = tok.bos_id, tok.eos_id
    sampler = LengthBucketBatchSampler(packed.lengths(), batch_size, seed=0)
    loaders = {
        "per-item": torch.utils.data.DataLoader(per_item, batch_size, shuffle=True,
                                                collate_fn=PadToLongest(pad_id)),
        "packdata": packdata.loader(packed, batch_sampler=sampler,
                                    collate=packdata.PadCollate(pad_id), feeder=False),
    }
    rows: dict = {}
    for name, loader in loaders.items():
        torch.manual_seed(0)  # the same initial weights on both rows
        model = CausalLM(tok.vocab_size, max_length)
        rows[name] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=3e-3),
                      "batches": iter(loader), "loader": loader, "rounds": []}
    for r in range(rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            row = rows[name]
            real = positions = pads = steps = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                batch = next(row["batches"], None)
                if batch is None:  # an epoch ended: the next one
                    row["batches"] = iter(row["loader"])
                    continue
                ids, mask = batch
                loss, n = lm_loss(row["model"], ids, mask)
                row["opt"].zero_grad(set_to_none=True)
                (loss / max(n, 1)).backward()
                row["opt"].step()
                real, positions = real + n, positions + mask.numel()
                pads += int((~mask).sum())
                steps += 1
            wall = time.perf_counter() - t0
            row["rounds"].append({"real_tokens_per_s": real / wall, "steps": steps,
                                  "padding": pads / max(positions, 1), "seconds": wall})
    out = {"lines": len(lines), "tokens": int(packed.lengths().sum()), "batch_size": batch_size,
           "max_length": max_length, "vocab_size": tok.vocab_size, "convert_seconds": convert_s,
           "rows": {}}
    for name, row in rows.items():
        out["rows"][name] = {
            "real_tokens_per_s": statistics.median(x["real_tokens_per_s"] for x in row["rounds"]),
            "padding": float(np.mean([x["padding"] for x in row["rounds"]])),
            "rounds": row["rounds"]}
    base = out["rows"]["per-item"]["real_tokens_per_s"]
    out["ratio"] = out["rows"]["packdata"]["real_tokens_per_s"] / base
    out["paired_ratios"] = [p["real_tokens_per_s"] / b["real_tokens_per_s"] for p, b in
                            zip(rows["packdata"]["rounds"], rows["per-item"]["rounds"])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/text/peps"))
    parser.add_argument("--tokenizer", type=Path,
                        default=Path("../shared/data/tokenizer/gpt2/tokenizer.json"))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/text.json"))
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads of the consuming loop (default 1: on a "
                        "shared 2-core machine, 2 threads spin against other jobs)")
    parser.add_argument("--training", action="store_true",
                        help="measure real tokens/s in training instead (see above)")
    parser.add_argument("--train-seconds", type=float, default=20.0)
    parser.add_argument("--train-rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    if args.training:
        with tempfile.TemporaryDirectory(prefix="pd-text-train-") as tmp:
            result = training(args.data, args.tokenizer, Path(tmp), args.train_seconds,
                              args.train_rounds)
        result.update(torch_threads=torch.get_num_threads(), load_average=os.getloadavg())
        target = args.json.with_name("text_training.json") if args.json.name == "text.json" \
            else args.json
        target.write_text(json.dumps(result, indent=2))
        print("| loader | real tokens/s in training | padding |\n|---|---:|---:|")
        for name, row in result["rows"].items():
            print(f"| {name} | {row['real_tokens_per_s']:,.0f} | {row['padding']:.1%} |")
        print(f"{result['lines']:,} lines, {result['tokens']:,} tokens; packdata "
              f"{result['ratio']:.2f}× the per-item baseline (rounds: "
              + ", ".join(f"{r:.2f}" for r in result["paired_ratios"]) + ")")
        return
    report: dict = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="pd-text-bench-") as tmp:
        tmp = Path(tmp)
        paths: dict[str, dict[str, Path]] = {}
        for docs, opts in (("whole", {}), ("split-1024", {"max_length": 1024, "split": True})):
            source = packdata.open_source(args.data, tokenizer=args.tokenizer, **opts)
            paths[docs] = {c: packdata.convert(source, tmp / f"{docs}-{t}", workers=2).path
                           for c, t in TARGETS.items()}
        lengths = {d: packdata.open(p["hdf5"]).lengths() for d, p in paths.items()}
        report["documents"] = {d: {"count": len(v), "min": int(v.min()), "median": float(
            np.median(v)), "max": int(v.max()), "total": int(v.sum())} for d, v in lengths.items()}
        report["padding"] = padding_rows(lengths)
        report["delivered"] = [
            {"documents": d, "container": c, "batching": next(f"{k}={v}" for k, v in size.items()),
             **delivered(paths[d][c], args.seconds, **size)}
            for d, size in (("split-1024", {"batch_size": 64}), ("whole", {"max_tokens": 65_536}))
            for c in TARGETS]
        report["conversion"] = conversion_vs_tokenizer(args.data, args.tokenizer, tmp, args.repeats)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print_tables(report)


def print_tables(report: dict) -> None:
    print("| documents | batching | random padding (5 epochs) | bucketed padding | bucketed batches |")
    print("|---|---|---:|---:|---:|")
    for r in report["padding"]:
        rnd = f"{np.mean(r['random']):.1%} ({min(r['random']):.1%}–{max(r['random']):.1%})"
        bkt = f"{np.mean(r['bucketed']):.2%} ({min(r['bucketed']):.2%}–{max(r['bucketed']):.2%})"
        print(f"| {r['documents']} | {r['batching']} | {rnd} | {bkt} | {r['bucketed_batches']} |")
    print("\n| documents | container | batching | tokens/s delivered | padding |")
    print("|---|---|---|---:|---:|")
    for r in report["delivered"]:
        print(f"| {r['documents']} | {r['container']} | {r['batching']} | "
              f"{r['tokens_per_s']:,.0f} | {r['padding']:.2%} |")
    c = report["conversion"]
    print(f"\nconversion (HDF5, 2 workers): {statistics.median(c['convert_tokens_per_s']):,.0f} "
          f"tokens/s; tokenizer's own encode_batch_fast on the same cores: "
          f"{statistics.median(c['tokenizer_batch_tokens_per_s']):,.0f} tokens/s "
          f"(encode_batch with offsets: {c['tokenizer_encode_batch_with_offsets_tokens_per_s']:,.0f})"
          f"; ratio of medians {c['ratio_of_medians']:.2f}×, paired ratios "
          + ", ".join(f"{r:.2f}" for r in c["paired_ratios"]), file=sys.stdout)


if __name__ == "__main__":
    main()
