"""Checksums: the native batch routine against xxhash record by record, the same digests with
and without it; entry checksums: what each covers, and the manifest's declaration of them."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import xxhash

from packdata import checksum, containers
from packdata.checksum import (
    CRC32,
    EntryChecks,
    batch_checksums,
    entry_checksums,
    record_checksum,
    rows_checksums,
)
from packdata.containers.integrity import ChecksummedReader
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest, check_manifest
from packdata.verification import verify
from tests.conftest import needs_native_rows

K = 3
FIELDS = {
    "points": Field("<f4", (K, 16, 3)),
    "label": Field("<i8", ()),
    "mask": Field("|b1", (K, 16)),
    "variant_checksums": Field("<u8", (K,), checks_entries_of=("points", "mask")),
}


def records(n: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"points": rng.normal(size=(n, K, 16, 3)).astype(np.float32),
            "label": np.arange(n, dtype=np.int64),
            "mask": rng.random((n, K, 16)) < 0.5}


def test_each_entry_checksum_is_its_entry_and_the_shared_fields():
    checks = EntryChecks.declared(FIELDS)
    assert checks == EntryChecks("variant_checksums", ("points", "mask"), ("label",), K)
    batch = records()
    full = entry_checksums(batch, checks, 4)
    assert full.shape == (4, K) and len(np.unique(full)) == 4 * K
    # entry k of record j: its checksum is the record checksum of the one-entry record
    for j in range(4):
        for k in range(K):
            one = {"label": batch["label"][j], "points": batch["points"][j, k],
                   "mask": batch["mask"][j, k]}
            assert full[j, k] == record_checksum(one, ["label", "points", "mask"])
    # read one entry per record (as select does): the same values
    entries = np.array([2, 0, 1, 2])
    selected = {"label": batch["label"], "points": batch["points"][np.arange(4), entries],
                "mask": batch["mask"][np.arange(4), entries]}
    assert entry_checksums(selected, checks, 4, one_entry=True).tolist() == \
        full[np.arange(4), entries].tolist()
    # one byte of entry 1 changes entry 1's checksum only; one of a shared field, every entry's
    changed = {name: value.copy() for name, value in batch.items()}
    changed["points"].view(np.uint8)[2, 1, 0, 3] ^= 1
    assert (entry_checksums(changed, checks, 4) != full).tolist()[2] == [False, True, False]
    changed["label"][0] += 1
    assert (entry_checksums(changed, checks, 4) != full)[0].all()


def test_one_entry_is_selected_only_when_every_entry_field_selects_it():
    checks = EntryChecks.declared(FIELDS)
    same = np.array([0, 2])
    assert checks.selects_one_entry({"points": same, "mask": same})
    assert not checks.selects_one_entry({"points": same, "mask": np.array([0, 1])})
    assert not checks.selects_one_entry({"points": same})
    assert not checks.selects_one_entry(None)
    assert EntryChecks.declared({"points": FIELDS["points"]}) is None


@pytest.mark.parametrize("fields, message", [
    ({**FIELDS, "variant_checksums": Field("<u4", (K,), checks_entries_of=("points",))},
     "declares entry checksums but is <u4"),
    ({**FIELDS, "variant_checksums": Field("<u8", (K,), checks_entries_of=("colour",))},
     r"checks entries of \['colour'\]"),
    ({**FIELDS, "variant_checksums": Field("<u8", (K + 1,), checks_entries_of=("points",))},
     "holds 4 checksums, not one per entry"),
    ({**FIELDS, "tokens": Field("<u2", (None,))}, "beside variable fields"),
    ({**FIELDS, "more": Field("<u8", (K,), checks_entries_of=("mask",))}, "each declare"),
])
def test_a_declaration_that_does_not_fit_the_fields_is_refused(fields, message):
    manifest = Manifest(container="hdf5", kind="pointcloud", fields=fields)
    with pytest.raises(DatasetError, match=message):
        check_manifest(manifest, "d.h5")


def test_the_declaration_survives_the_json():
    manifest = Manifest(container="hdf5", kind="pointcloud", fields=FIELDS)
    check_manifest(manifest, "d.h5")
    again = Manifest.from_json(manifest.to_json(), "d.h5")
    assert again.fields == FIELDS and again.entry_checks == manifest.entry_checks


def test_verify_names_entries_that_do_not_match_their_checksums(tmp_path):
    """Entry checksums written wrong (record checksums right, over them): verify, hashing
    each batch's entries at once, names the record; a read of that entry refuses it."""
    batch = records(12)
    checks = EntryChecks.declared(FIELDS)
    batch["variant_checksums"] = entry_checksums(batch, checks, 12)
    batch["variant_checksums"][7, 1] ^= 1
    rows = [{name: value[j] for name, value in batch.items()} for j in range(12)]
    path = tmp_path / "d.h5"
    writer = containers.get("hdf5").WRITER(path, FIELDS, {})
    for j, row in enumerate(rows):
        writer.append(f"r{j}", row)
    writer.finish(Manifest(container="hdf5", kind="test", fields=FIELDS, count=12,
                           keys=[f"r{j}" for j in range(12)],
                           checksums=[record_checksum(row, FIELDS) for row in rows]))
    report = verify(path, batch_size=5)
    assert [(b["index"], b["problem"]) for b in report.bad] == \
        [(7, "entries do not match their checksums ('variant_checksums')")]
    checked = ChecksummedReader(containers.get("hdf5").READER(path), path)
    checked.read(np.array([7]), {"points": np.array([0]), "mask": np.array([0])})
    with pytest.raises(DatasetError, match="record 7 "):
        checked.read(np.array([6, 7]), {"points": np.array([1, 1]), "mask": np.array([1, 1])})


# -- the native batch routine (packdata._rowhash) ---------------------------------------------

#: records of several columns copied (the limit above any record here), streamed, and either
#: as the default limit has it
LIMITS = [{"stream_above": 1 << 40}, {"stream_above": 0}, {}]


@pytest.fixture
def rowhash():
    """The routine's digests of ``n`` records of ``columns``, one list per way of hashing a
    record of several columns (copied, streamed, as by default)."""
    needs_native_rows()

    def digests(columns, n):
        outs = [np.empty(n, np.uint64) for _ in LIMITS]
        for out, limit in zip(outs, LIMITS):
            checksum._rowhash.rows(columns, out, **limit)
        return [out.tolist() for out in outs]
    return digests


@pytest.fixture
def pure(monkeypatch):
    """The pure path: the capability off, and the routine gone, so a call to it would fail."""
    def switch_off():
        monkeypatch.setattr(checksum, "NATIVE_ROWS", False)
        monkeypatch.setattr(checksum, "_rowhash", None)
    return switch_off


def reference(*columns) -> list[int]:
    """XXH3-64 of each record, its rows' bytes in the columns' order, one xxhash call each."""
    return [xxhash.xxh3_64_intdigest(b"".join(np.ascontiguousarray(c[j]).tobytes() for c in columns))
            for j in range(len(columns[0]))]


@pytest.mark.parametrize("n", [0, 1, 1000])
@pytest.mark.parametrize("width", [0, 1, 7, 8, 3072, 4097])
def test_native_rows_are_xxhash_of_each_record(rowhash, width, n):
    table = np.random.default_rng(width * 7 + n).integers(0, 256, (n, width), dtype=np.uint8)
    expected = [reference(table)] * len(LIMITS)
    assert rowhash([table], n) == expected
    # several columns: the row cut in three, as strided views of the table and as copies
    cuts = np.split(table, [width // 3, width // 2], axis=1)
    assert rowhash(cuts, n) == expected
    assert rowhash([np.ascontiguousarray(c) for c in cuts], n) == expected
    # as a list of one array per record (a variable-length field), alone and between columns
    assert rowhash([list(table)], n) == expected
    assert rowhash([cuts[0], [np.ascontiguousarray(r) for r in cuts[1]], cuts[2]], n) == expected


def test_native_rows_of_typed_columns_and_records_of_different_lengths(rowhash):
    rng = np.random.default_rng(1)
    n = 300
    points = rng.normal(size=(n, 4, 16, 3)).astype(np.float32)
    label = rng.integers(0, 10, n)
    # 0 to 2,400 bytes of tokens: records either side of the default limit
    tokens = [rng.integers(0, 65535, rng.integers(0, 1200), dtype=np.uint16) for _ in range(n)]
    expected = [reference(points[:, 2], tokens, label)] * len(LIMITS)
    assert rowhash([points[:, 2], tokens, label], n) == expected
    assert rowhash([points[:, 2], tuple(tokens), label], n) == expected
    assert rowhash([points[::-1], label[::-1]], n) == \
        [reference(points[::-1], label[::-1])] * len(LIMITS)
    assert rowhash([tokens, tokens[::-1]], n) == [reference(tokens, tokens[::-1])] * len(LIMITS)


@pytest.mark.parametrize("columns, out, error, message", [
    (lambda a: [a, a[:9]], None, ValueError, "column 1 has 9 records, column 0 has 10"),
    (lambda a: [a, list(a[:3])], None, ValueError, "column 1 has 3 records, column 0 has 10"),
    (lambda a: [a[:, ::2]], None, ValueError, "each row's bytes must lie together"),
    (lambda a: [a.T], None, ValueError, "each row's bytes must lie together"),
    (lambda a: [a, [r[::2] for r in a]], None, ValueError, "column 1, record 0: expected a C-con"),
    (lambda a: [a, [b"x"] * 9 + [3]], None, ValueError, "column 1, record 9"),
    (lambda a: [np.uint8(3)], None, ValueError, "0-dimensional"),
    (lambda a: [a, 7], None, TypeError, "column 1: expected an array, or a list"),
    (lambda a: [], None, ValueError, "no columns"),
    (lambda a: a.tobytes, None, TypeError, "columns must be a list"),
    (lambda a: [a], np.empty(9, np.uint64), ValueError, "out holds 9 values, expected 10"),
    (lambda a: [a], np.empty(10, np.float64), TypeError, "out must hold 8-byte integers"),
    (lambda a: [a], np.empty(10, np.uint32), TypeError, "out must hold 8-byte integers"),
    (lambda a: [a], np.empty(20, np.uint64)[::2], TypeError, "out must be a writable, contig"),
    (lambda a: [a], np.frombuffer(bytes(80), np.uint64), TypeError, "out must be a writable"),
    (lambda a: [a], bytearray(80), TypeError, "out must hold 8-byte integers"),
])
def test_native_rows_refuse_what_they_cannot_hash(rowhash, columns, out, error, message):
    table = np.arange(10 * 16, dtype=np.uint8).reshape(10, 16)
    with pytest.raises(error, match=message):
        checksum._rowhash.rows(columns(table), np.empty(10, np.uint64) if out is None else out)


CIFAR = {"image": Field("|u1", (32, 32, 3)), "label": Field("<i8", ())}
KEEP_SIZE = {"image": Field("|u1", (None, 24)), "image_size": Field("<i4", (2,)),
             "label": Field("<i8", ())}


def cifar_batch(n: int) -> dict:
    rng = np.random.default_rng(n)
    return {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 10, n)}


def keep_size_batch(n: int) -> dict:
    rng = np.random.default_rng(n)
    images = [rng.integers(0, 256, (rng.integers(0, 40), 24), dtype=np.uint8) for _ in range(n)]
    return {"image": images, "image_size": rng.integers(0, 99, (n, 2)).astype(np.int32),
            "label": rng.integers(0, 10, n)}


def each_record(batch: dict, fields: dict, n: int, algorithm: str = checksum.XXH3) -> list[int]:
    return [record_checksum({name: batch[name][j] for name in fields}, fields, algorithm)
            for j in range(n)]


@pytest.mark.parametrize("n", [0, 1, 256])
@pytest.mark.parametrize("fields, make", [
    (CIFAR, cifar_batch), ({"image": CIFAR["image"]}, cifar_batch), (KEEP_SIZE, keep_size_batch),
    ({"tokens": Field("<u2", (None,))},
     lambda n: {"tokens": [np.arange(j * 7 % 500, dtype=np.uint16) for j in range(n)]}),
])
def test_batch_checksums_are_the_same_native_or_not(rowhash, pure, fields, make, n):
    batch = make(n)
    expected = each_record(batch, fields, n)
    native = batch_checksums(batch, fields, n)
    crc = batch_checksums(batch, fields, n, CRC32)  # format version 1: always the pure path
    pure()
    assert native.tolist() == batch_checksums(batch, fields, n).tolist() == expected
    assert crc.tolist() == batch_checksums(batch, fields, n, CRC32).tolist() == \
        each_record(batch, fields, n, CRC32)


def test_batch_checksums_hash_a_field_read_as_a_strided_view(rowhash, pure):
    whole = cifar_batch(64)
    batch = {"image": whole["image"][::2], "label": whole["label"][::2]}
    expected = each_record(batch, CIFAR, 32)
    assert batch_checksums(batch, CIFAR, 32).tolist() == expected
    pure()
    assert batch_checksums(batch, CIFAR, 32).tolist() == expected


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_rows_checksums_are_the_same_native_or_not(rowhash, pure, n):
    table = np.random.default_rng(n).integers(0, 256, (n, 3081), dtype=np.uint8)
    native, crc = rows_checksums(table), rows_checksums(table, CRC32)
    pure()
    assert native.tolist() == rows_checksums(table).tolist() == reference(table)
    assert crc.tolist() == rows_checksums(table, CRC32).tolist() == [zlib.crc32(r) for r in table]


@pytest.mark.parametrize("n", [0, 1, 50])
def test_entry_checksums_are_the_same_native_or_not(rowhash, pure, monkeypatch, n):
    checks = EntryChecks.declared(FIELDS)
    batch = records(n)
    entries = np.arange(n) % K
    selected = {"label": batch["label"], "points": batch["points"][np.arange(n), entries],
                "mask": batch["mask"][np.arange(n), entries]}
    full, one = entry_checksums(batch, checks, n), entry_checksums(selected, checks, n, True)
    assert full.shape == (n, K) and one.shape == (n,)
    expected = [[reference(batch["label"][j:j + 1], batch["points"][j:j + 1, k],
                           batch["mask"][j:j + 1, k])[0] for k in range(K)] for j in range(n)]
    assert full.tolist() == expected
    assert one.tolist() == [expected[j][entries[j]] for j in range(n)]
    pure()
    monkeypatch.setattr(checksum, "ENTRY_TABLE_BYTES", 1000)  # a few records per table
    assert entry_checksums(batch, checks, n).tolist() == expected
    assert entry_checksums(selected, checks, n, True).tolist() == one.tolist()


@pytest.mark.parametrize("native", [True, False])
def test_many_keys_hash_as_one_key_at_a_time(monkeypatch, native):
    """recordmeta.key_hashes (a block of keys, one call) gives each key's key_hash."""
    from packdata.recordmeta import key_hash, key_hashes, packed

    if native:
        needs_native_rows()
    if not native:
        monkeypatch.setattr(checksum, "NATIVE_ROWS", False)
    keys = ["", "a", "airplane_0001", "ünïcode/ключ", "k" * 300]
    encoded, data, offsets = packed(keys)
    assert key_hashes(encoded).tolist() == [key_hash(k) for k in keys]
    assert [data[a:b].tobytes().decode() for a, b in zip(offsets[:-1], offsets[1:])] == keys
    assert key_hashes([]).shape == (0,)
