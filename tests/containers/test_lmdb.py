"""The conformance suite for the LMDB container; records read back with plain ``lmdb``."""

from __future__ import annotations

import shutil
from pathlib import Path
from unittest import mock

import lmdb
import numpy as np
import pytest

from tests.containers.suite import VARIANTS, ContainerSuite, make_records


class TestLMDB(ContainerSuite):
    name = "lmdb"
    target = "d.lmdb"
    gathered = True

    def value(self, path: Path, index: int) -> bytes:
        with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
            return bytes(txn.get(b"%010d" % index))

    def plain_read(self, path, fields, index):
        """Fixed fields' bytes in manifest order, one uint64 row count per variable field,
        then the variable fields' bytes (the layout in packdata/containers/lmdb.py)."""
        value, pos, out = self.value(path, index), 0, {}
        for name, f in fields.items():
            if not f.variable:
                out[name] = np.frombuffer(value[pos : pos + f.nbytes], f.np_dtype).reshape(f.shape)
                pos += f.nbytes
        variable = [n for n, f in fields.items() if f.variable]
        counts = np.frombuffer(value[pos : pos + 8 * len(variable)], "<u8")
        pos += 8 * len(variable)
        for name, rows in zip(variable, counts.tolist()):
            f = fields[name]
            size = rows * int(np.prod(f.row_shape, dtype=np.int64)) * f.np_dtype.itemsize
            out[name] = np.frombuffer(value[pos : pos + size], f.np_dtype).reshape(-1, *f.row_shape)
            pos += size
        return out

    def test_select_gathers_from_stored_offsets_and_through_lookups_alike(self, tmp_path):
        """A select read gathers only the selected entry of each record from the file, whether
        its offsets were stored at conversion or found by lookups (a dataset without them):
        the records a whole read gives, sliced; an entry past K is an IndexError."""
        records = make_records(VARIANTS, 40)
        path = self.write(tmp_path, VARIANTS, records)
        # as where offsets cannot be found (no /proc/self/maps): written without them
        (tmp_path / "old").mkdir()
        with mock.patch("packdata.containers.lmdb.write_offsets", return_value=None):
            copy = self.write(tmp_path / "old", VARIANTS, records)
        idx, rows = np.array([39, 0, 17, 17, 5]), np.array([2, 0, 1, 2, 2])
        for where, stored in ((path, True), (copy, False)):
            reader = self.reader(where)
            assert (reader._stored is not None) == stored
            batch = reader.read(idx, {"points": rows})
            np.testing.assert_array_equal(
                batch["points"], np.stack([records[i]["points"][r] for i, r in zip(idx, rows)]))
            np.testing.assert_array_equal(batch["label"], [records[i]["label"] for i in idx])
            with pytest.raises(IndexError, match="select"):
                reader.read(idx, {"points": rows + 1})  # K = 3: entry 3 does not exist

    def record_byte(self, path, fields, index):
        data = (path / "data.mdb").read_bytes()
        return path / "data.mdb", data.index(self.value(path, index)) + 3


def test_a_replaced_dataset_reopens_in_the_same_process(tmp_path):
    """Deleted and converted again at the same path (the new files often reuse the old inode
    numbers): this process opens the new dataset, not the old environment or an error."""
    import shutil

    import packdata
    from tests.conftest import copy_sample

    dst = tmp_path / "d.lmdb"
    for n in range(1, 6):
        if dst.exists():
            shutil.rmtree(dst)
        src = copy_sample(tmp_path / f"src{n}", count=10 * n)
        packdata.convert(packdata.open_source(src), dst, workers=1)
        assert len(packdata.open(dst)) == 10 * n


def test_environments_of_files_no_longer_at_their_path_are_closed(tmp_path):
    """LMDB refuses files whose device and inode numbers an open environment's (deleted) files
    had, in any role: the cache closes every environment whose data.mdb left its path before it
    opens another, so a replaced dataset never meets the old one's numbers."""
    import shutil

    import packdata
    from packdata.containers import lmdbenv as container
    from tests.conftest import copy_sample

    src = copy_sample(tmp_path / "src", count=10)
    a, b = tmp_path / "a.lmdb", tmp_path / "b.lmdb"
    packdata.convert(packdata.open_source(src), a, workers=1)
    packdata.convert(packdata.open_source(src), b, workers=1)
    packdata.open(a)[0]
    old = [k for k, entry in container._envs.items() if entry[3] == str(a)]
    assert len(old) == 1
    shutil.rmtree(a)
    packdata.open(b)[0]  # any other open sweeps the cache
    assert old[0] not in container._envs
    assert all(entry[3] != str(a) for entry in container._envs.values())


def _tree_value(path: Path, key: bytes) -> tuple[int, int]:
    """(file offset, size) of ``key``'s value in data.mdb."""
    from packdata.containers.lmdb import shared_tree

    found = shared_tree(path).locate(key)
    assert found is not None
    return found


def _poke(path: Path, at: int, value: int) -> None:
    with open(path / "data.mdb", "r+b") as f:
        f.seek(at)
        f.write(value.to_bytes(8, "little", signed=True))


@pytest.mark.parametrize("damage", ["offset far past the file", "offset of another record",
                                    "length past the file", "length one more"])
def test_a_damaged_offset_or_length_of_a_variable_record_is_a_named_error(
        tmp_path, packed_text, damage):
    """Text records are read at their stored offsets from packdata's own map of data.mdb: a
    damaged offset or length table entry is a DatasetError naming the dataset at the read,
    never a signal. Read unchecked, every offset and length is bounded by the file's size, the
    row counts in the record against the length table; checked (the default), the table's
    block is checked against its checksum before any record it locates is read."""
    import packdata

    copy = shutil.copytree(packed_text["lmdb"], tmp_path / "d.lmdb")
    offsets, _ = _tree_value(copy, b"__offsets__")
    lengths, _ = _tree_value(copy, b"__lengths__/tokens")
    record_2 = int.from_bytes((copy / "data.mdb").read_bytes()[offsets + 16 : offsets + 24],
                              "little")
    at, value = {"offset far past the file": (offsets + 8, 1 << 40),
                 "offset of another record": (offsets + 8, record_2),
                 "length past the file": (lengths + 8, 1 << 40),
                 "length one more": (lengths + 8, None)}[damage]
    if value is None:
        value = int.from_bytes((copy / "data.mdb").read_bytes()[at : at + 8], "little") + 1
    _poke(copy, at, value)
    ds = packdata.open(copy, verify="off")  # opening reads neither table whole
    assert len(ds[0]) and len(ds[3])  # the records next to the damaged one read
    with pytest.raises(packdata.DatasetError, match=f"{copy}.*damaged"):
        ds[1]
    table = "__offsets__" if damage.startswith("offset") else "__lengths__/tokens"
    with pytest.raises(packdata.DatasetError, match=f"{copy}.*'{table}' does not match its "
                       "checksum.*damaged"):
        packdata.open(copy)[0]  # the block holding record 0's entries holds record 1's


@pytest.mark.parametrize("verify", ["off", "full"])
@pytest.mark.parametrize("offset", [1 << 40, -5], ids=["past the file", "negative"])
def test_a_damaged_offset_of_a_fixed_record_is_a_named_error(tmp_path, packed, verify, offset):
    """Fixed-size records are gathered at their stored offsets (by the batch plan, where no
    checksum is checked first): an offset outside data.mdb is a DatasetError naming the dataset,
    the other records read. Checked, the offsets' block is checked first, and named."""
    import packdata

    copy = shutil.copytree(packed["lmdb"], tmp_path / "d.lmdb")
    offsets, _ = _tree_value(copy, b"__offsets__")
    _poke(copy, offsets + 8, offset)
    ds = packdata.open(copy, verify=verify)
    if verify == "full":
        for read in (lambda: ds[0], lambda: ds.get_batch([0, 1, 2])):
            with pytest.raises(packdata.DatasetError,
                               match=f"{copy}.*'__offsets__' does not match its checksum"):
                read()
        return
    assert len(ds[0]) and len(ds[2])
    with pytest.raises(packdata.DatasetError, match=f"{copy}.*outside data.mdb.*damaged"):
        ds[1]
    with pytest.raises(packdata.DatasetError, match=f"{copy}.*outside data.mdb.*damaged"):
        ds.get_batch([0, 1, 2])


def test_a_reopened_dataset_finds_its_keys_without_walking_the_tree_again(packed, tmp_path,
                                                                          monkeypatch):
    """The keys an open looks up (manifest, offsets, first and last record) are found once per
    process and version of data.mdb: a reopen walks no page; a rewritten file is walked anew."""
    import packdata
    from packdata.containers.lmdbcheck import Tree

    copy = shutil.copytree(packed["lmdb"], tmp_path / "d.lmdb")
    walks = []
    locate = Tree._locate
    monkeypatch.setattr(Tree, "_locate", lambda self, key: walks.append(key) or locate(self, key))
    first = packdata.open(copy)[3]
    assert walks and set(walks) >= {b"__offsets__", b"%010d" % 0}
    walked = len(walks)
    again = packdata.open(copy)[3]
    assert len(walks) == walked and all(np.array_equal(a, b) for a, b in zip(first, again))
    data = copy / "data.mdb"
    data.write_bytes(data.read_bytes() + bytes(4096))  # another version of the file
    assert all(np.array_equal(a, b) for a, b in zip(first, packdata.open(copy)[3]))
    assert len(walks) > walked


def test_opening_a_dataset_with_stored_offsets_does_not_walk_the_tree(tmp_path, monkeypatch):
    """Opening costs O(depth) pages, not O(records): the whole-tree check runs only for
    datasets read through LMDB's lookups (here: one written where offsets were not found)."""
    import packdata
    from packdata.containers import lmdb as container
    from packdata.containers import lmdbenv
    from tests.conftest import copy_sample

    walked = []
    monkeypatch.setattr(lmdbenv, "check_tree", lambda *a: walked.append(a[0]))
    src = copy_sample(tmp_path / "src", count=30)
    dst = packdata.convert(packdata.open_source(src), tmp_path / "d.lmdb", workers=1).path
    ds = packdata.open(dst)
    last = ds[29]
    assert len(ds) == 30 and walked == []
    reader = container.LMDBReader(dst)
    assert reader._stored is not None  # records read at their stored offsets
    idx = np.arange(30)[::-1]
    a, b = reader.read(idx), reader._lookup(idx)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    monkeypatch.setattr(container, "write_offsets", lambda *args: None)
    copy = packdata.convert(packdata.open_source(src), tmp_path / "old.lmdb", workers=1).path
    old = packdata.open(copy)
    assert walked == [copy] and container.LMDBReader(copy)._stored is None
    assert np.array_equal(np.asarray(old[29][0]), np.asarray(last[0]))


def test_packdatas_own_lookup_finds_every_key_lmdb_finds(tmp_path):
    """Tree (packdata's lookup through the pages on a key's path) against LMDB's own cursor on
    a tree of three levels: the same value for every key, and nothing for keys it lacks."""
    import json

    import packdata
    from packdata.containers.lmdb import shared_env, shared_tree

    src = tmp_path / "docs.jsonl"
    words = ["alpha", "beta", "gamma", "delta"]
    src.write_text("".join(json.dumps({"text": " ".join(words[: 1 + i % 4] * (1 + i % 7))}) + "\n"
                           for i in range(20000)))
    dst = packdata.convert(packdata.open_source(src, kind="text", tokenizer="bytes"),
                           tmp_path / "d.lmdb", workers=1).path
    tree = shared_tree(dst)
    assert tree.depth >= 3
    with shared_env(dst).begin() as txn:
        found = 0
        for key, value in txn.cursor():
            assert tree.get(key).tobytes() == value, key
            found += 1
    assert found == 20000 + 3  # records, the length table, the offsets, the manifest
    for absent in (b"", b"0", b"00000000000", b"0000019999x", b"0000020000", b"__a", b"~"):
        assert tree.get(absent) is None, absent
