"""Concurrent readers: many processes reading the same datasets at once, every record compared.

    python bench/concurrent_readers.py [--processes 8] [--passes 20]
        [--json bench/results/concurrent_readers.json]

The datasets of bench/fuzz_readers.py (real CIFAR-10, PEP text and LiDAR in every container
they fit), intact. For each dataset ``--processes`` forked processes open it at the same time
(each its own handles) and read every record ``--passes`` times in shuffled batches of 16 (and
each of a point cloud's variants alone, as the point-cloud kind reads them), each record's hash
compared with the one read once beforehand. Counted: records read, records that differ,
processes that failed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _shared import command_line, parser, write_results
from fuzz_readers import build_datasets, digest, digest_reads, read_as, record_digest

from packdata import containers


def read_all(path: Path, digests: list[str], passes: int, seed: int) -> tuple[int, int]:
    """(records read, records that differ) over ``passes`` shuffled passes of every read
    :func:`fuzz_readers.digest` hashed (whole records, then each entry alone where records
    declare entry checksums), each record against its hash there."""
    reader = containers.for_existing(path).READER(path)
    count = reader.manifest.count
    rng = np.random.default_rng(seed)
    read = wrong = 0
    for _ in range(passes):
        order = rng.permutation(count)
        for a in range(0, count, 16):
            idx = order[a : a + 16]
            for k, entry in enumerate(digest_reads(reader.manifest)):
                batch = read_as(reader, idx, entry)
                for j, i in enumerate(idx.tolist()):
                    read += 1
                    wrong += (record_digest(batch, reader.manifest.fields, j)
                              != digests[k * count + i])
    return read, wrong


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--passes", type=int, default=20)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in build_datasets(Path(tmp)).items():
            digests = digest(path)
            children = []
            start = time.perf_counter()
            for k in range(args.processes):
                read_fd, write_fd = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(read_fd)
                    try:
                        out = read_all(path, digests, args.passes, k)
                    except BaseException as exc:  # noqa: BLE001 - reported to the parent
                        out = repr(exc)
                    os.write(write_fd, json.dumps(out).encode())
                    os._exit(0)
                os.close(write_fd)
                children.append((pid, read_fd))
            read = wrong = failed = 0
            why = None
            for pid, fd in children:
                with os.fdopen(fd) as f:
                    raw = f.read()
                _, status = os.waitpid(pid, 0)
                out = json.loads(raw) if raw else None
                if not isinstance(out, list) or status != 0:
                    failed += 1
                    why = why or (out if isinstance(out, str) else f"exit status {status}")
                    continue
                read, wrong = read + out[0], wrong + out[1]
            results[name] = {"processes": args.processes, "records_read": read,
                             "records_differing": wrong, "processes_failed": failed,
                             "seconds": round(time.perf_counter() - start, 1)}
            if why is not None:  # what the first failed process raised
                results[name]["first_failure"] = why
            print(name, json.dumps(results[name]), flush=True)
    if args.json:
        write_results(args.json, {"command": command_line(), "datasets": results})


if __name__ == "__main__":
    main()
