"""Fuzzed readers: mutated copies of real datasets, each read in a forked child under an
address-space limit and a timeout.

    python bench/fuzz_readers.py [--mutants 1000] [--verify full verify] [--seed 0]
        [--containers lmdb hdf5 tar] [--arrays] [--json bench/results/fuzz_readers.json]

Datasets: 60 real CIFAR-10 PNGs (shipped in packdata/demo_data), the PEP text fixtures (byte
tokens, variable length) and the LiDAR fixtures (4 AHN clouds, 1024 points, K=2 variants), each
in every container (9 datasets). Each mutant is a fresh copy of the original, damaged, then read
in a child forked from a warm process that imports only the readers. The default level is
``verify="full"``, what ``packdata.open`` does unless told otherwise. Mutations: 1-8 flipped
bytes anywhere in a file, flipped bytes in a file's head (LMDB meta pages, the HDF5 superblock,
tar headers), truncations, zeroed 4 KiB blocks, and edited manifest values (valid JSON, wrong
facts: a hand edit); targets are every file of the dataset (shards, index.npz, manifest.json,
data.mdb, records.npz, the .h5 file).

Every mutant must either read back exactly the original records (all of them, in batches, and
where records declare entry checksums, each entry read alone through ``select`` first, by a
reader that has checked nothing yet) or raise a packdata error naming the dataset; at the level
``verify``, ``packdata verify`` runs instead, and must report the damage of any mutant that does
not read back exactly, without dying, hanging or raising. Outcomes
counted per dataset and verify level: ``same``, ``named_error`` (the goal), and the failures
``silent_wrong``, ``crash`` (a signal, e.g. SIGSEGV/SIGBUS), ``hang``, ``memory`` (MemoryError
under the limit), ``unnamed_error`` (a packdata error not naming the path) and
``foreign_error`` (any other exception).

With ``--arrays`` the mutations are those of the per-record arrays alone (bench/mutate_arrays.py:
flipped bits, an array zeroed, two entries swapped, an array deleted, the keys rewritten
coherently with their block checksums), and each mutant's keys are read too: every key by
index, every original key looked up (``index_of`` and ``in``), the keys iterated. A key read
back different from the original, or a lookup that misses a key the dataset has, is
``wrong_key``; at the level ``verify``, a mutant ``packdata verify`` passes is ``unnoticed``
(every such mutation changes stored bytes, and verify must name it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

# only the readers: the children are forked from a process that holds no more than these
# (forking one that has imported torch costs ~60 ms a child, page tables copied; ~15 ms here)
from packdata import containers
from packdata.containers.integrity import at_open
from packdata.errors import PackdataError
from packdata.verification import verify

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT / "packdata" / "demo_data" / "cifar10"
PEPS = ROOT / "tests" / "fixtures" / "text" / "peps"
LIDAR = ROOT / "tests" / "fixtures" / "lidar"
TARGETS = {"lmdb": "d.lmdb", "hdf5": "d.h5", "tar": "d-tar"}
MEMORY_HEADROOM = 1 << 30  # address space a child may add to what it has after imports
TIMEOUT_S = 20.0
FAILURES = ("silent_wrong", "crash", "hang", "memory", "unnamed_error", "foreign_error")
OUTCOMES = ("same", "named_error", *FAILURES)  # each counted in the results, zeros too
ARRAY_FAILURES = ("wrong_key", "unnoticed")  # --arrays: keys read wrong, a mutant verify passed
ARRAY_OUTCOMES = (*OUTCOMES, *ARRAY_FAILURES)


def cifar_folder(out: Path, count: int = 60) -> Path:
    meta = json.loads((CIFAR / "labels.json").read_text())
    names = sorted(meta["labels"])[:count]
    out.mkdir(parents=True)
    for n in names:
        shutil.copy(CIFAR / n, out / n)
    (out / "labels.json").write_text(json.dumps(
        {"classes": meta["classes"], "labels": {n: meta["labels"][n] for n in names}}))
    return out


def build_datasets(work: Path) -> dict[str, Path]:
    """The originals to mutate: ``{"cifar-lmdb": path, ...}``."""
    import packdata
    sources = {"cifar": (packdata.open_source(cifar_folder(work / "cifar-src")), "20"),
               "text": (packdata.open_source(PEPS), "3")}
    try:
        clouds = work / "lidar-src"  # the LAS and LAZ of the fixtures (one file per key)
        clouds.mkdir()
        for f in LIDAR.glob("ahn_*.la[sz]"):
            shutil.copy(f, clouds / f.name)
        sources["lidar"] = (packdata.open_source(clouds, points=1024, variants=2), "2")
    except PackdataError as exc:  # laspy not installed
        print(f"skipping lidar: {exc}", file=sys.stderr)
    out = {}
    for name, (source, shard_size) in sources.items():
        for container, target in TARGETS.items():
            options = {"shard_size": shard_size} if container == "tar" else None
            out[f"{name}-{container}"] = packdata.convert(
                source, work / name / target, workers=1, container_options=options).path
    return out


def digest(path: Path) -> list[str]:
    """One hash per record (every field's dtype, shape and bytes), read from the original, for
    each of :func:`digest_reads` in turn: the whole records, then where records declare entry
    checksums each entry alone. Read ``k``'s hash of record ``i`` is item ``k * count + i``."""
    reader = containers.for_existing(path).READER(path)
    return [h for entry in digest_reads(reader.manifest) for h in read_digests(reader, entry)]


def digest_reads(manifest) -> list[int | None]:
    """The reads :func:`digest` hashes, in its order: None (whole records), then each entry
    where records declare entry checksums (a point cloud's K variants)."""
    checks = manifest.entry_checks
    return [None, *range(checks.count if checks is not None else 0)]


def read_as(reader, idx: np.ndarray, entry: int | None):
    """Records ``idx`` whole (``entry`` None), or entry ``entry`` of each alone through
    ``select``, as the point-cloud kind reads them."""
    if entry is None:
        return reader.read(idx)
    return reader.read(idx, {name: np.full(len(idx), entry)
                             for name in reader.manifest.entry_checks.entries_of})


def record_digest(batch, fields, j: int) -> str:
    """The hash of record ``j`` of a read ``batch``: every field's name, dtype, shape and bytes."""
    h = hashlib.sha1()
    for name in fields:
        value = np.ascontiguousarray(batch[name][j])
        h.update(f"{name}{value.dtype.str}{value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def read_digests(reader, entry: int | None = None) -> list[str]:
    """Every record's hash, read in order in batches of 16 as :func:`read_as` reads them."""
    count, out = reader.manifest.count, []
    for a in range(0, count, 16):
        idx = np.arange(a, min(count, a + 16))
        batch = read_as(reader, idx, entry)
        out.extend(record_digest(batch, reader.manifest.fields, j) for j in range(len(idx)))
    return out


# -- mutations -------------------------------------------------------------------------------

def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def mutate(path: Path, rng: random.Random) -> str:
    """Damage one file of the dataset at ``path`` in place; returns what was done."""
    files = [f for f in files_of(path) if f.name != "lock.mdb"]
    target = rng.choice(files)
    data = bytearray(target.read_bytes())
    how = rng.choice(["flip", "flip", "flip", "flip_head", "truncate", "zero_block", "manifest"])
    if how == "manifest":
        return edit_manifest(path, rng)
    if not data:
        return f"{target.name}: empty file left alone"
    if how in ("flip", "flip_head"):
        span = min(len(data), 8192) if how == "flip_head" else len(data)
        spots = [rng.randrange(span) for _ in range(rng.randint(1, 8))]
        for s in spots:
            data[s] ^= 1 << rng.randrange(8)
        what = f"{how} {len(spots)} bytes"
    elif how == "truncate":
        keep = rng.randrange(len(data))
        del data[keep:]
        what = f"truncate to {keep}"
    else:
        start = rng.randrange(len(data))
        data[start : start + 4096] = bytes(len(data[start : start + 4096]))
        what = f"zero 4 KiB at {start}"
    target.write_bytes(bytes(data))
    return f"{target.name}: {what}"


def edit_manifest(path: Path, rng: random.Random) -> str:
    """Change one value of the manifest to another plausible JSON value (through the plain
    libraries, so the container stays otherwise intact)."""
    doc = json.loads(read_manifest(path))
    node, trail = doc["packdata"], ["packdata"]
    while isinstance(node, (dict, list)) and node and rng.random() < 0.75:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        if not isinstance(node[key], (dict, list)) or not node[key]:
            node[key] = other_value(node[key], rng)
            write_manifest(path, json.dumps(doc))
            return f"manifest {'/'.join(map(str, [*trail, key]))} = {node[key]!r:.40}"
        node, trail = node[key], [*trail, key]
    if isinstance(node, dict) and node:
        gone = rng.choice(list(node))
        del node[gone]
    elif isinstance(node, list) and node:
        gone = len(node) - 1
        node.pop()
    else:
        gone = None
    write_manifest(path, json.dumps(doc))
    return f"manifest {'/'.join(map(str, trail))}: removed {gone}"


def other_value(value, rng: random.Random):
    if isinstance(value, bool) or value is None:
        return rng.choice([True, False, None, 0, "x"])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, value * 2, 0, -1, 2**40, str(value)])
    if isinstance(value, float):
        return rng.choice([value * 2, -value, 0.0])
    if isinstance(value, str):
        return rng.choice(["O", "", "uint16", "<f8", "|V8", "../x", value + "x", 3])
    return None


def read_manifest(path: Path) -> str:
    if path.is_dir() and (path / "manifest.json").is_file():
        return (path / "manifest.json").read_text()
    if path.is_dir():
        import lmdb

        with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
            return bytes(txn.get(b"__manifest__")).decode()
    import h5py

    with h5py.File(path, "r") as f:
        raw = f["manifest"][()]
        return raw.decode() if isinstance(raw, bytes) else raw


def write_manifest(path: Path, text: str) -> None:
    if path.is_dir() and (path / "manifest.json").is_file():
        (path / "manifest.json").write_text(text)
    elif path.is_dir():
        import lmdb

        with lmdb.open(str(path), map_size=1 << 30) as env, env.begin(write=True) as txn:
            txn.put(b"__manifest__", text.encode())
    else:
        import h5py

        with h5py.File(path, "r+") as f:
            del f["manifest"]
            f.create_dataset("manifest", data=text)


def child_keys(path: Path, keys: list[str]) -> dict:
    """Every key of the (mutated) dataset read back: by index, looked up, iterated."""
    try:
        got = at_open(containers.for_existing(path).READER(path), path, "full").manifest.keys
        wrong = None
        if len(got) != len(keys):
            wrong = f"{len(got)} keys, not {len(keys)}"
        for i, key in enumerate(keys if wrong is None else ()):
            if got[i] != key:
                wrong = f"keys[{i}] = {got[i]!r}, not {key!r}"
                break
            try:
                found = got.index_of(key)
            except KeyError:
                found = None
            if found != i or key not in got:
                wrong = f"{key!r} looked up: {found}, {key in got}, not {i}"
                break
        if wrong is None and list(got) != keys:
            wrong = "the keys iterated differ"
        if wrong is None and "no such key~" in got:
            wrong = "a key that is not there is found"
    except Exception as exc:
        return raised(exc, path)
    return {"outcome": "same" if wrong is None else "wrong_key", "error": wrong or ""}


def raised(exc: Exception, path: Path) -> dict:
    """What an exception out of reading the mutant at ``path`` counts as: a packdata error that
    names the dataset (or one of its files) or does not, memory, or a foreign exception."""
    if isinstance(exc, PackdataError):
        named = str(path) in str(exc) or any(str(f) in str(exc) for f in files_of(path))
        return {"outcome": "named_error" if named else "unnamed_error", "error": str(exc)[:300]}
    if isinstance(exc, MemoryError):
        return {"outcome": "memory", "error": repr(exc)[:300]}
    return {"outcome": "foreign_error", "error": f"{type(exc).__name__}: {exc}"[:300],
            "where": traceback.format_exc()[-600:]}


def worst(results: list[dict]) -> dict:
    """The result that counts among several checks of one mutant: a failure, else a named
    error, else the first."""
    for kinds in ((*FAILURES, *ARRAY_FAILURES), ("named_error",)):
        for r in results:
            if r["outcome"] in kinds:
                return r
    return results[0]


def child_read(path: Path, digests: list[str], level: str) -> dict:
    """Read every record of the (mutated) dataset; what happened, as a dict."""
    try:
        reader = at_open(containers.for_existing(path).READER(path), path, level)
        count = reader.manifest.count
        for name in reader.manifest.variable_fields:
            reader.lengths(name)
        reads = digest_reads(reader.manifest)
        # entries first: a fresh reader checks them entry by entry
        entries = [h for entry in reads[1:] for h in read_digests(reader, entry)]
        got = read_digests(reader) + entries
    except Exception as exc:
        return raised(exc, path)
    return {"outcome": "same" if got == digests else "silent_wrong",
            "error": f"{count} records, {sum(a != b for a, b in zip(got, digests))} differ"}


def child_verify(path: Path, digests: list[str], strict: bool = False) -> dict:
    """``packdata verify`` of the (mutated) dataset, judged by what a checked read gives: a
    dataset verify passes must read back the original records (else ``silent_wrong``: verify
    missed the damage); one it fails is a ``named_error`` (its report is about the dataset).
    Verify reports what it finds: any exception out of it is a failure. ``strict`` (a mutation
    of the per-record arrays, which always changes stored bytes): passing is ``unnoticed``."""
    try:
        report = verify(path)
    except MemoryError as exc:
        return {"outcome": "memory", "error": repr(exc)[:300]}
    except Exception as exc:
        return {"outcome": "foreign_error", "error": f"{type(exc).__name__}: {exc}"[:300],
                "where": traceback.format_exc()[-600:]}
    if not report.ok:
        found = report.problems + [f"record {b['index']}: {b['problem']}" for b in report.bad]
        return {"outcome": "named_error", "error": found[0][:300]}
    if strict:
        return {"outcome": "unnoticed", "error": "verify passed a mutant of the record arrays"}
    read = child_read(path, digests, "full")
    return {"outcome": "same" if read["outcome"] == "same" else "silent_wrong",
            "error": f"verify passed; a checked read: {read['outcome']} {read['error']}"[:300]}


def run_in_child(path: Path, digests: list[str], level: str,
                 keys: list[str] | None = None) -> dict:
    """:func:`child_read` (or, for the level ``verify``, :func:`child_verify`) in a forked
    child with an address-space limit and a timeout; given the original ``keys`` (``--arrays``),
    :func:`child_keys` too, and verify must name the mutant."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limit, read, report, exit without cleanup handlers
        os.close(read_fd)
        try:
            status = Path("/proc/self/status").read_text().splitlines()
            vm = int(next(line.split()[1] for line in status if line.startswith("VmSize:"))) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + MEMORY_HEADROOM, vm + MEMORY_HEADROOM))
            if level == "verify":
                result = child_verify(path, digests, strict=keys is not None)
            elif keys is not None:
                result = worst([child_read(path, digests, level), child_keys(path, keys)])
            else:
                result = child_read(path, digests, level)
        except BaseException as exc:  # noqa: BLE001 - whatever happens goes back to the parent
            result = {"outcome": "foreign_error", "error": repr(exc)[:300]}
        os.write(write_fd, json.dumps(result).encode())
        os._exit(0)
    os.close(write_fd)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return {"outcome": "hang", "error": f"no result after {TIMEOUT_S} s"}
        time.sleep(0.002)
    with os.fdopen(read_fd, "rb") as f:
        raw = f.read()
    if os.WIFSIGNALED(status):
        return {"outcome": "crash", "error": signal.Signals(os.WTERMSIG(status)).name}
    return json.loads(raw) if raw else {"outcome": "crash", "error": f"exit status {status}"}


class ReaderProcess:
    """A lean process (the readers imported, nothing else) that forks one child per mutant:
    :func:`run_in_child` over a pipe, one JSON line each way."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def __call__(self, path: Path, digests: list[str], level: str,
                 keys: list[str] | None = None) -> dict:
        self.process.stdin.write(json.dumps([str(path), digests, level, keys]) + "\n")
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def serve() -> None:
    """The loop of a :class:`ReaderProcess`."""
    for name in containers.CONTAINERS:  # imported once here, not in every child
        containers.get(name)
    import packdata.containers.lmdbcheck  # noqa: F401 - imported on first open
    for line in sys.stdin:
        path, digests, level, keys = json.loads(line)
        print(json.dumps(run_in_child(Path(path), digests, level, keys)), flush=True)


def fuzz_one(original: Path, digests: list[str], scratch: Path, rng: random.Random,
             levels: list[str], read=run_in_child, keys: list[str] | None = None) -> list[dict]:
    """One mutant of ``original``, read at every verify level (by ``read``: a child forked
    from this process, or from a :class:`ReaderProcess`); given its ``keys``, a mutant of its
    per-record arrays (bench/mutate_arrays.py, imported by name: bench/ on the path)."""
    copy = scratch / original.name
    if copy.exists():
        shutil.rmtree(copy) if copy.is_dir() else copy.unlink()
    (shutil.copytree if original.is_dir() else shutil.copy)(original, copy)
    if keys is None:
        what = mutate(copy, rng)
    else:
        from mutate_arrays import mutate_arrays

        what = mutate_arrays(copy, rng)
    return [{**read(copy, digests, level, keys), "level": level, "mutation": what}
            for level in levels]


def mutation_kind(what: str) -> str:
    """The kind of a mutation from what :func:`mutate` or ``mutate_arrays`` says it did
    (``"index.npz: flip 3 bytes"`` → ``flip``; ``"keys: entries 3 and 9 swapped"`` → ``swap``;
    ``"keys reversed, …"`` → ``rewrite reversed``)."""
    if what.startswith("keys reversed") or what.startswith("keys renamed"):
        return "rewrite " + what.split()[1].rstrip(",")
    if what.startswith("manifest "):  # an edited value (not an array named manifest_hash)
        return "manifest"
    done = what.rsplit(": ", 1)[-1]
    for word, kind in (("swapped", "swap"), ("deleted", "delete"), ("zeroed", "zero"),
                       ("bits flipped", "flip"), ("zero 4 KiB", "zero block"),
                       ("truncate", "truncate"), ("flip_head", "flip head"), ("flip", "flip")):
        if word in done:
            return kind
    return "other"


def mutated_array(what: str) -> str:
    """The array a mutation of ``mutate_arrays`` changed (``"keys: zeroed"`` → ``keys``;
    ``"__records__/checksums: deleted"`` → ``checksums``); ``key arrays`` for a coherent
    rewrite of them all."""
    if what.startswith("keys reversed") or what.startswith("keys renamed"):
        return "key arrays"
    return what.rsplit(": ", 1)[0].rsplit("/", 1)[-1].removeprefix("__records__.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=1000, help="per dataset")
    parser.add_argument("--verify", nargs="+", default=["full"],
                        help="levels to read at; 'verify' runs packdata verify")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--containers", nargs="+", choices=sorted(TARGETS), default=sorted(TARGETS),
                        help="mutate only these containers' datasets")
    parser.add_argument("--arrays", action="store_true",
                        help="mutate the per-record arrays, and read every key too")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve()
    started, load_at_start = time.time(), os.getloadavg()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        originals = {name: path for name, path in build_datasets(work / "orig").items()
                     if name.rsplit("-", 1)[1] in args.containers}
        read = ReaderProcess()
        outcomes = ARRAY_OUTCOMES if args.arrays else OUTCOMES
        failures = (*FAILURES, *ARRAY_FAILURES) if args.arrays else FAILURES
        for name, path in originals.items():
            digests = digest(path)
            keys = list(containers.for_existing(path).READER(path).manifest.keys) \
                if args.arrays else None
            rng = random.Random(f"{args.seed}-{name}")
            counts = {level: Counter() for level in args.verify}
            kinds: Counter = Counter()
            arrays: Counter = Counter()  # --arrays: which array each mutation changed
            examples: dict[str, list] = {}
            scratch = work / "mutants" / name
            scratch.mkdir(parents=True)
            began = time.time()
            for _ in range(args.mutants):
                checks = fuzz_one(path, digests, scratch, rng, args.verify, read, keys)
                kinds[mutation_kind(checks[0]["mutation"])] += 1
                if keys is not None:
                    arrays[mutated_array(checks[0]["mutation"])] += 1
                for r in checks:
                    counts[r["level"]][r["outcome"]] += 1
                    if r["outcome"] in failures:
                        examples.setdefault(f"{r['level']} {r['outcome']}", []).append(r)
            records = containers.for_existing(path).READER(path).manifest.count
            results[name] = {"records": records, "entry_reads": len(digests) - records,
                             "mutants": args.mutants,
                             "seconds": round(time.time() - began, 1),
                             "mutations": dict(sorted(kinds.items())),
                             **({"arrays": dict(sorted(arrays.items()))} if arrays else {}),
                             "outcomes": {lv: {o: c[o] for o in outcomes}
                                          for lv, c in counts.items()},
                             "failure_examples": {k: v[:3] for k, v in examples.items()}}
            print(name, json.dumps(results[name]["outcomes"]), flush=True)
        read.close()
    summary = {"command": "python bench/fuzz_readers.py " + " ".join(sys.argv[1:]),
               "seconds": round(time.time() - started, 1), "timeout_s": TIMEOUT_S,
               "load_average_at_start": [round(x, 2) for x in load_at_start],
               "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
               "memory_headroom_bytes": MEMORY_HEADROOM, "datasets": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
