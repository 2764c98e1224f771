"""Fuzzed readers, bounded for CI: mutated copies of real datasets read with verify="full" in a
forked child (address-space limit, timeout) must read back exactly or raise a packdata error
naming the dataset, and `packdata verify` must report every mutant that does not read back
exactly. The long run with counts is bench/fuzz_readers.py (same harness)."""

from __future__ import annotations

import faulthandler
import os
import random
import shutil
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import load_script

fuzz = load_script(Path(__file__).resolve().parents[1] / "bench" / "fuzz_readers.py", "fuzz_readers")
# what fuzz_readers imports by name for --arrays (bench/ is on a script's path, not the tests')
load_script(Path(__file__).resolve().parents[1] / "bench" / "mutate_arrays.py", "mutate_arrays")

ARRAY_KINDS = ("flip", "zero", "swap", "delete", "rewrite reversed", "rewrite renamed")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks with Linux rlimits")


@pytest.fixture(scope="module")
def originals(packed) -> dict:
    return {name: (path, fuzz.digest(path)) for name, path in packed.items()}


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "tar"])
def test_mutants_read_back_exactly_or_raise_a_named_error(tmp_path_factory, originals, name):
    path, digests = originals[name]
    scratch = tmp_path_factory.mktemp(f"fuzz-{name}")
    seen = []

    @settings(max_examples=25, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def check(rng: random.Random) -> None:
        for result in fuzz.fuzz_one(path, digests, scratch, rng, ["full", "verify"]):
            seen.append(result["outcome"])
            assert result["outcome"] in ("same", "named_error"), result

    check()
    assert "named_error" in seen  # the mutations do reach the data


def test_mutations_are_counted_by_kind_and_array():
    """What the results count each mutant as, from what the mutation said it did (the
    strings of fuzz_readers.mutate and mutate_arrays)."""
    said = {"index.npz: flip 3 bytes": ("flip", None),
            "d.h5: flip_head 1 bytes": ("flip head", None),
            "data.mdb: truncate to 812": ("truncate", None),
            "shard-000000.tar: zero 4 KiB at 99": ("zero block", None),
            "manifest packdata/count = 61": ("manifest", None),
            "manifest packdata/fields: removed label": ("manifest", None),
            "manifest_hash: bits flipped": ("flip", "manifest_hash"),
            "manifest_hash: zeroed": ("zero", "manifest_hash"),
            "__records__/manifest_hash: deleted": ("delete", "manifest_hash"),
            "__records__.key_order: entries 3 and 9 swapped": ("swap", "key_order"),
            "__offsets__: zeroed": ("zero", "__offsets__"),
            "keys renamed, with their arrays and block checksums": ("rewrite renamed", "key arrays"),
            "keys reversed, with their arrays and block checksums": ("rewrite reversed", "key arrays")}
    for what, (kind, array) in said.items():
        assert fuzz.mutation_kind(what) == kind, what
        if array is not None:
            assert fuzz.mutated_array(what) == array, what


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "tar"])
def test_mutants_of_the_record_arrays_serve_no_wrong_key_and_verify_names_each(
        tmp_path_factory, originals, name):
    """The per-record arrays mutated alone (bits flipped, an array zeroed, entries swapped, an
    array deleted, the keys rewritten with their block checksums): every key read back is the
    original, or a packdata error naming the dataset, never a raw exception, and `packdata
    verify` names every mutant (each changes stored bytes)."""
    import packdata

    path, digests = originals[name]
    keys = list(packdata.open(path).keys)
    scratch = tmp_path_factory.mktemp(f"fuzz-arrays-{name}")

    @settings(max_examples=15, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def check(rng: random.Random) -> None:
        full, verified = fuzz.fuzz_one(path, digests, scratch, rng, ["full", "verify"],
                                       keys=keys)
        assert full["outcome"] in ("same", "named_error"), full
        assert verified["outcome"] == "named_error", verified
        # the results count mutants by kind: each array mutation is one of the kinds counted
        assert fuzz.mutation_kind(full["mutation"]) in ARRAY_KINDS, full["mutation"]

    check()


def test_the_harness_sees_a_crash_and_a_silent_difference(tmp_path, originals, monkeypatch):
    """The harness itself: a child killed by a signal is a crash; changed records without an
    error, or a verify that passes them, are silent_wrong (so the test above can fail)."""
    path, digests = originals["hdf5"]
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    wrong = ["x" * 40] + digests[1:]
    assert fuzz.run_in_child(copy, wrong, "off")["outcome"] == "silent_wrong"
    assert fuzz.run_in_child(copy, digests, "off")["outcome"] == "same"

    def segfault(*args) -> None:
        faulthandler.disable()  # no dump on stderr for this planned crash
        os.kill(os.getpid(), signal.SIGSEGV)

    report = fuzz.verify(copy)
    assert report.ok
    monkeypatch.setattr(fuzz, "verify", lambda path: report)  # a verify that misses damage
    assert fuzz.run_in_child(copy, wrong, "verify")["outcome"] == "silent_wrong"
    keys = list(fuzz.containers.for_existing(copy).READER(copy).manifest.keys)
    assert fuzz.run_in_child(copy, digests, "verify", keys)["outcome"] == "unnoticed"
    assert fuzz.run_in_child(copy, digests, "full", keys)["outcome"] == "same"
    assert fuzz.run_in_child(copy, digests, "full", keys[::-1])["outcome"] == "wrong_key"

    monkeypatch.setattr(fuzz, "child_read", segfault)
    assert fuzz.run_in_child(copy, digests, "off") == {"outcome": "crash", "error": "SIGSEGV"}


def test_concurrent_readers_read_each_variant_against_its_own_hash(tmp_path):
    """bench/concurrent_readers.py over the harness's hashes of a point-cloud dataset (records,
    then each variant alone): every record and variant read and matched, and a changed hash
    counted as a differing record, not a failed process."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    load_script(bench / "_shared.py", "_shared")  # what it imports beside fuzz_readers
    concurrent = load_script(bench / "concurrent_readers.py", "concurrent_readers")
    import packdata

    clouds = tmp_path / "clouds"
    clouds.mkdir()
    for f in sorted(fuzz.LIDAR.glob("ahn_*.la[sz]")):
        shutil.copy(f, clouds / f.name)
    path = packdata.convert(packdata.open_source(clouds, points=256, variants=2),
                            tmp_path / "pc.h5", workers=1).path
    digests = fuzz.digest(path)
    count = packdata.open(path).manifest.count
    assert len(digests) == count * 3  # the records, then variant 0 and variant 1 of each
    assert concurrent.read_all(path, digests, 2, 0) == (2 * len(digests), 0)
    changed = digests[: count + 1] + ["x" * 40] + digests[count + 2 :]  # variant 0 of record 1
    assert concurrent.read_all(path, changed, 2, 0) == (2 * len(digests), 2)
