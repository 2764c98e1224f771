"""Scaling out: conversion on Dask against local processes, and streaming from S3 against disk.

    python bench/bench_scale.py [--data ../shared/data/cifar10/test-png] [--rounds 3]

Conversion: the 10,000 real CIFAR-10 PNGs converted into tar shards with 1 process, 2 processes
(``--workers 2``) and on a 2-worker Dask ``LocalCluster`` (processes, one thread each; started
once, its start-up reported apart), in interleaved rounds.

Streaming: the same images as tar shards of 1,000 (41 MB), read with ``StreamingDataset``
through a DataLoader (batch 256; in the main process, and with 2 persistent workers) for 4
epochs, from local disk and from a local S3 server (moto, in its own process, over HTTP) with a
cold 16 MB cache each round, so that every epoch fetches most shards again: time to first batch,
and the rate over the rest of the 4 epochs.

Object storage (``--only remote``, on the first ``--remote-files`` of the PNGs, against the same
moto server): converting from a URL source read in place (each worker reads its files through
fsspec) against first copying the tree to local disk and converting that (what the source did
before); converting to a URL with each shard uploaded as it closes against building everything
locally and uploading at the end; and reading 16 random records from a cold cache with ranged
GETs (``access="ranges"``) against fetching the whole shards that hold them.

Ratios are within one round (the machine is shared); the tables give medians.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _shared import CIFAR_PNG, parser, write_results
from bench_containers import build_folder


def convert_rates(folder: Path, tmp: Path, rounds: int) -> dict:
    from packdata.engines import dask_client

    import packdata

    source = packdata.open_source(folder)
    count = len(source.items())
    start = time.perf_counter()
    cluster = dask_client(workers=2)  # the LocalCluster `--engine dask --workers 2` starts
    client = cluster.__enter__()
    client.run(lambda: __import__("packdata.convert"))  # what the first task would import
    startup = time.perf_counter() - start
    runs = {"1 process": dict(workers=1), "2 processes": dict(workers=2),
            "dask 2 workers": dict(client=client)}
    table: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for r in range(rounds):
            for name, kw in runs.items():
                dst = tmp / f"conv-{r}-{name.replace(' ', '-')}"
                t = time.perf_counter()
                result = packdata.convert(source, dst, **kw)
                table[name].append(count / (time.perf_counter() - t))
                assert result.manifest.count == count
                print(f"round {r} {name}: {table[name][-1]:,.0f} files/s", file=sys.stderr)
    finally:
        cluster.__exit__(None, None, None)
    ratio = [d / w for d, w in zip(table["dask 2 workers"], table["2 processes"])]
    return {"files": count, "files_per_s": table, "dask_over_2_processes": ratio,
            "dask_cluster_startup_s": startup}


EPOCHS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def epoch(stream, epochs: int, workers: int) -> tuple[float, float, int]:
    """(seconds to the first batch, samples/s after it, samples) of ``epochs`` passes through
    one DataLoader (batch 256) with ``workers`` persistent workers (0: in this process)."""
    import torch

    loader = torch.utils.data.DataLoader(stream, batch_size=256, num_workers=workers,
                                         persistent_workers=workers > 0)
    start = time.perf_counter()
    it = iter(loader)
    first = next(it)
    t_first = time.perf_counter()
    rest = sum(len(b[1]) for b in it)
    for _ in range(epochs - 1):
        rest += sum(len(b[1]) for b in loader)
    steady = rest / (time.perf_counter() - t_first)
    return t_first - start, steady, len(first[1]) + rest


def stream_rates(folder: Path, tmp: Path, rounds: int) -> dict:
    import packdata

    server, options = moto(free_port())
    try:
        source = packdata.open_source(folder)
        local = packdata.convert(source, tmp / "stream-local", workers=2,
                                 container_options={"shard_size": "1000"}).path
        url = "s3://bench/cifar"
        packdata.convert(source, url, workers=2, container_options={"shard_size": "1000"},
                         storage_options=options)
        out: dict[str, dict[str, list[float]]] = {
            f"{k} {w} workers": {"first_batch_s": [], "samples_per_s": []}
            for w in (0, 2) for k in ("local", "s3")}
        for r in range(rounds):
            for workers in (0, 2):
                for name in ("local", "s3"):
                    if name == "local":
                        stream = packdata.StreamingDataset(local, seed=r)
                    else:  # a cache of 4 shards of the 10: every epoch fetches most shards again
                        stream = packdata.StreamingDataset(
                            url, seed=r, storage_options=options,
                            cache_dir=tmp / f"cache-{r}-{workers}", cache_limit="16MB")
                    first, rate, n = epoch(stream, EPOCHS, workers)
                    assert n == EPOCHS * 10_000, n
                    row = out[f"{name} {workers} workers"]
                    row["first_batch_s"].append(first)
                    row["samples_per_s"].append(rate)
                    print(f"round {r} {name} {workers} workers: first batch {first:.2f} s, "
                          f"{rate:,.0f} samples/s", file=sys.stderr)
        ratio = {f"{w} workers": [s / h for s, h in zip(out[f"s3 {w} workers"]["samples_per_s"],
                                                         out[f"local {w} workers"]["samples_per_s"])]
                 for w in (0, 2)}
        return {**out, "s3_over_local": ratio}
    finally:
        server.terminate()
        server.wait()


def moto(port: int) -> tuple[subprocess.Popen, dict]:
    import fsspec

    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options = {"key": "bench", "secret": "bench",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    fs = fsspec.filesystem("s3", **options)
    for _ in range(100):
        try:
            fs.mkdir("bench")
            break
        except Exception:
            time.sleep(0.1)
    return server, options


def remote_rates(folder: Path, tmp: Path, rounds: int, files: int) -> dict:
    import random
    import shutil

    import fsspec

    import packdata
    from packdata.conversion import local
    from packdata.conversion.job import destination, settle
    from packdata.conversion.upload import staged
    from packdata.remote.storage import Storage

    server, options = moto(free_port())
    try:
        fs = fsspec.filesystem("s3", **options)
        subset = tmp / "subset"
        subset.mkdir()
        for p in sorted(folder.iterdir())[:files]:
            shutil.copy(p, subset / p.name)
        fs.put(str(subset) + "/", "s3://bench/raw/", recursive=True)
        shards = {"shard_size": "200"}
        times: dict[str, list[float]] = {k: [] for k in (
            "source in place", "source copied first", "upload streamed", "upload at the end",
            "16 records by ranges", "16 records by shards")}
        fetched: dict[str, list[int]] = {"16 records by ranges": [], "16 records by shards": []}
        for r in range(rounds):
            t = time.perf_counter()
            src = packdata.open_source("s3://bench/raw", storage_options=options)
            packdata.convert(src, tmp / f"inplace-{r}", workers=2, container_options=shards)
            times["source in place"].append(time.perf_counter() - t)
            t = time.perf_counter()
            fs.get("s3://bench/raw/", str(tmp / f"copy-{r}") + "/", recursive=True)
            packdata.convert(packdata.open_source(tmp / f"copy-{r}"), tmp / f"copied-{r}",
                             workers=2, container_options=shards)
            times["source copied first"].append(time.perf_counter() - t)
            for name, streamed in (("upload streamed", True), ("upload at the end", False)):
                url = f"s3://bench/out-{r}-{streamed}"
                t = time.perf_counter()
                with staged(destination(url, None, shards), Storage(options), False,
                            streamed=streamed) as (here, closed):
                    local.write(settle(packdata.open_source(subset), here, "fail", False),
                                workers=2, on_shard_closed=closed)
                times[name].append(time.perf_counter() - t)
            picks = random.Random(r).sample(range(files), 16)
            for name, access in (("16 records by ranges", "ranges"),
                                 ("16 records by shards", "shards")):
                t = time.perf_counter()
                ds = packdata.open(f"s3://bench/out-{r}-True", storage_options=options,
                                   cache_dir=tmp / f"cache-{r}-{access}", access=access)
                x = ds[picks]  # images only: the subset has no labels file
                times[name].append(time.perf_counter() - t)
                assert len(x) == 16
                cached = sum(p.stat().st_size for p in (tmp / f"cache-{r}-{access}").rglob("*.tar"))
                fetched[name].append(cached or int(x.numel()) * x.element_size())
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  file=sys.stderr)
        ratio = {
            "copied_first_over_in_place": [a / b for a, b in zip(
                times["source copied first"], times["source in place"])],
            "at_the_end_over_streamed": [a / b for a, b in zip(
                times["upload at the end"], times["upload streamed"])],
            "shards_over_ranges": [a / b for a, b in zip(
                times["16 records by shards"], times["16 records by ranges"])],
        }
        return {"files": files, "seconds": times, "bytes_fetched": fetched, "ratios": ratio}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    p = parser(__doc__, data=CIFAR_PNG, rounds=3, results="scale.json")
    p.add_argument("--remote-files", type=int, default=2000)
    p.add_argument("--only", choices=["convert", "stream", "remote"],
                   help="Run one half (the other's results are kept in --json).")
    args = p.parse_args()
    results = json.loads(args.json.read_text()) if args.only and args.json.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="packdata-bench-") as tmp:
        folder = build_folder(args.data, Path(tmp) / "png", 10_000)
        if args.only in (None, "convert"):
            results["convert"] = convert_rates(folder, Path(tmp), args.rounds)
        if args.only in (None, "stream"):
            results["stream"] = stream_rates(folder, Path(tmp), args.rounds)
        if args.only in (None, "remote"):
            results["remote"] = remote_rates(folder, Path(tmp), args.rounds, args.remote_files)
    write_results(args.json, results)
    med = statistics.median
    c, s = results["convert"], results["stream"]
    print("| conversion (10,000 PNGs → tar) | files/s (median) |")
    print("|---|---:|")
    for name, rates in c["files_per_s"].items():
        print(f"| {name} | {med(rates):,.0f} |")
    print(f"\nDask / 2 processes: {med(c['dask_over_2_processes']):.2f} (median of rounds: "
          f"{', '.join(f'{x:.2f}' for x in c['dask_over_2_processes'])}); LocalCluster start-up "
          f"{c['dask_cluster_startup_s']:.1f} s")
    print("\n| streaming (4 epochs) | first batch (s) | samples/s after it |")
    print("|---|---:|---:|")
    for name in [k for k in s if k != "s3_over_local"]:
        print(f"| {name} | {med(s[name]['first_batch_s']):.2f} | "
              f"{med(s[name]['samples_per_s']):,.0f} |")
    for workers, ratios in s["s3_over_local"].items():
        print(f"\nS3 / local, {workers}: {med(ratios):.2f} (rounds: "
              f"{', '.join(f'{x:.2f}' for x in ratios)})")
    if "remote" in results:
        m = results["remote"]
        print(f"\n| object storage ({m['files']:,} PNGs, S3 server) | seconds (median) |")
        print("|---|---:|")
        for name, secs in m["seconds"].items():
            print(f"| {name} | {med(secs):.2f} |")
        for name, sizes in m["bytes_fetched"].items():
            print(f"\n{name}: {med(sizes):,.0f} bytes fetched")
        for name, ratios in m["ratios"].items():
            print(f"\n{name}: {med(ratios):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")

if __name__ == "__main__":
    main()
