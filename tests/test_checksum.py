"""Entry checksums: what each covers, and the manifest's declaration of them."""

from __future__ import annotations

import numpy as np
import pytest

from packdata import containers
from packdata.checksum import EntryChecks, entry_checksums, record_checksum
from packdata.containers.integrity import ChecksummedReader
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest, check_manifest
from packdata.verify import verify

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
