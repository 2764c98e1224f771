"""The conformance suite for the tar container; records read back with plain ``tarfile`` (the
webdataset naming: ``KEY.cls`` for integer labels, ``KEY.<field>.npy`` otherwise)."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from tests.conftest import needs_native_rows
from tests.containers.suite import ContainerSuite


class TestTar(ContainerSuite):
    name = "tar"
    target = "d-tar"
    gathered = True

    @pytest.mark.xfail(strict=True, raises=IndexError, reason="TarReader.read of no indices "
                       "on a dataset of no shards indexes shard 0 (read() path, left to its owner)")
    def test_empty_dataset(self, tmp_path):
        super().test_empty_dataset(tmp_path)

    def test_a_closed_reader_reads_again(self, tmp_path):
        """``close()`` lets the shards' maps go; the next read maps them again and finds where
        each record lies anew, across shards."""
        from tests.containers.suite import FIXED, make_records

        records = make_records(FIXED, 23)
        reader = self.reader(self.write(tmp_path, FIXED, records, self.options(5)))
        idx = np.array([22, 3, 10, 0, 17])
        self.assert_batch(reader.read(idx), records, idx.tolist(), FIXED)
        reader.close()
        self.assert_batch(reader.read(idx[::-1]), records, idx[::-1].tolist(), FIXED)
        self.assert_batch(reader.read(np.arange(23)), records, list(range(23)), FIXED)

    def test_a_first_epoch_read_by_threads_at_once(self, tmp_path, monkeypatch):
        """Loader threads share a reader: while one joins the shards' maps or checks a block of
        records' entries, another must not take the records for checked without their
        addresses (it read as a KeyError, or could read another record's bytes)."""
        from concurrent.futures import ThreadPoolExecutor

        from packdata.containers.tar import reader as tar_reader
        from tests.containers.suite import FIXED, make_records

        monkeypatch.setattr(tar_reader, "ENTRY_BLOCK", 4)
        records = make_records(FIXED, 47)
        path = self.write(tmp_path, FIXED, records, self.options(3))
        batches = [np.arange(47)[k::6] for k in range(6)]
        for _ in range(8):  # a fresh reader each time: the first epoch is where it happens
            reader = self.reader(path)
            with ThreadPoolExecutor(6) as pool:
                read = list(pool.map(reader.read, batches))
            for idx, batch in zip(batches, read):
                self.assert_batch(batch, records, idx.tolist(), FIXED)
            reader.close()

    def test_a_batch_plan_once_every_record_was_checked(self, tmp_path, monkeypatch):
        """The batch plan gathers at the addresses found as records' entries are checked: it is
        there once every record's are (blocks of ENTRY_BLOCK records at a time), dropped by
        ``close()`` with the maps, and there again once every record is checked again."""
        from packdata.containers.tar import reader as tar_reader
        from tests.containers.suite import FIXED, make_records

        needs_native_rows()
        monkeypatch.setattr(tar_reader, "ENTRY_BLOCK", 4)
        records = make_records(FIXED, 23)
        reader = self.reader(self.write(tmp_path, FIXED, records, self.options(5)))
        self.assert_batch(reader.read(np.array([22, 0])), records, [22, 0], FIXED)
        assert reader.batch_plan() is None  # records 4 to 19 not checked yet
        self.assert_batch(reader.read(np.arange(23)), records, list(range(23)), FIXED)
        assert reader.batch_plan() is not None
        reader.close()
        assert reader.batch_plan() is None
        self.assert_batch(reader.read(np.array([3, 21])), records, [3, 21], FIXED)
        assert reader.batch_plan() is None
        reader.read(np.arange(23)[::-1])
        self.assert_batch(reader.batch_plan().read(np.array([5, 17, -1])), records, [5, 17, 22],
                          FIXED)
        reader.allow_truncated_shards()  # packdata verify: no joined map, so no plan either
        assert reader.batch_plan() is None
        self.assert_batch(reader.read(np.arange(23)), records, list(range(23)), FIXED)

    def options(self, per_shard):
        return {"shard_size": str(per_shard)}

    def plain_read(self, path, fields, index):
        manifest = json.loads((path / "manifest.json").read_text())["packdata"]
        with np.load(path / "index.npz") as z:  # keys: one bytes array and its offsets
            data, offsets = z["__records__.keys"], z["__records__.key_offsets"]
        key = data[offsets[index] : offsets[index + 1]].tobytes().decode().replace(".", "_")
        members = {}
        for shard in manifest["extra"]["shards"]:
            with tarfile.open(path / shard["name"]) as tar:
                for m in tar.getmembers():
                    if m.name.startswith(key + "."):
                        members[m.name[len(key) + 1 :]] = tar.extractfile(m).read()
        out = {}
        for name, field in fields.items():
            if name == "label" and field.shape == ():
                out[name] = np.int64(members["cls"].decode())
            else:
                out[name] = np.load(io.BytesIO(members[f"{name}.npy"]), allow_pickle=False)
        return out

    def record_byte(self, path, fields, index):
        name = next(iter(fields))
        manifest = json.loads((path / "manifest.json").read_text())["packdata"]
        with np.load(path / "index.npz") as z:
            shard, offset = int(z[f"{name}.shard"][index]), int(z[f"{name}.offset"][index])
        return path / manifest["extra"]["shards"][shard]["name"], offset + 3

    def test_small_fields_are_read_from_the_index(self, tmp_path):
        """Fields of at most INDEX_VALUE_BYTES a record (here 3 entries of 4 int16: 24 bytes)
        are kept in the index beside their members: read (whole, one entry selected, into
        given arrays) with no shard page touched, the same values as the members hold."""
        from packdata.containers.tar.reader import TarReader
        from packdata.manifest import Field
        from tests.containers.suite import make_records

        fields = {"points": Field("float16", (3, 16, 3)), "small": Field("int16", (3, 4))}
        records = make_records(fields, 30)
        path = self.write(tmp_path, fields, records, self.options(8))
        with np.load(path / "index.npz") as z:
            assert z["small.values"].shape == (30, 3, 4) and "points.values" not in z.files
            members = zip(z["small.shard"].tolist(), z["small.offset"].tolist(),
                          z["small.nbytes"].tolist())
            shards = sorted(path.glob("*.tar"))
            for shard, offset, nbytes in members:  # the members' copies zeroed: not what is read
                with open(shards[shard], "r+b") as f:
                    f.seek(offset)
                    f.write(bytes(nbytes))
        reader = TarReader(path)
        order, entry = np.array([29, 3, 3, 17]), np.array([2, 0, 1, 2])
        stored = np.stack([r["small"] for r in records])
        np.testing.assert_array_equal(reader.read(order)["small"], stored[order])
        np.testing.assert_array_equal(
            reader.read(order, {"points": entry, "small": entry})["small"], stored[order, entry])
        out = {name: np.empty((4, *f.shape), f.np_dtype) for name, f in fields.items()}
        np.testing.assert_array_equal(reader.read_into(order, out)["small"], stored[order])
        assert reader.read_into(order, out)["small"] is out["small"]

    def test_a_shard_source_that_fetches_copies(self, tmp_path, monkeypatch):
        """The reader's seam to storage (ShardSource): a source whose shards are copies fetched
        on demand (as object storage's) is read through per-shard views, no joined map; each
        copy is checked record by record when it arrives, one whose bytes changed is discarded
        and named where it came from, and a copy the source let go is mapped again."""
        import shutil

        from packdata.containers.tar import reader as tar_reader
        from packdata.containers.tar.shards import ShardSource
        from packdata.errors import DatasetError
        from tests.containers.suite import FIXED, make_records

        monkeypatch.setattr(tar_reader, "ENTRY_BLOCK", 5)  # entries checked a shard at a time

        class Copies(ShardSource):  # the dataset in `origin`, its shards copied into `root`
            STAYS, FETCHED = False, True

            def __init__(self, origin, root):
                super().__init__(root)
                self.origin, self.discarded, self.evict = origin, [], []

            def where(self, name):
                return f"origin:{name}"

            def file(self, name):
                if not (self.root / name).is_file():
                    shutil.copyfile(self.origin / name, self.root / name)
                return self.root / name

            def fetched(self, name):
                gone, self.evict = self.evict, []
                return gone

            def discard(self, name):
                self.discarded.append(name)
                (self.root / name).unlink()

        records = make_records(FIXED, 23)
        origin = self.write(tmp_path, FIXED, records, self.options(5))
        shards = sorted(p.name for p in origin.glob("*.tar"))
        (tmp_path / "copies").mkdir()
        for name in ("manifest.json", "index.npz"):
            shutil.copyfile(origin / name, tmp_path / "copies" / name)
        source = Copies(origin, tmp_path / "copies")
        reader = tar_reader.TarReader(source.root, source)
        idx = np.array([22, 3, 0, 17])  # shards 4, 0 and 3
        self.assert_batch(reader.read(idx), records, idx.tolist(), FIXED)
        assert reader.maps.joined() is None and reader.row_sources(idx) is None
        source.evict = [shards[0]]  # let go when the next shard arrives: mapped again after
        self.assert_batch(reader.read(np.array([5, 0])), records, [5, 0], FIXED)
        with open(origin / shards[2], "r+b") as f:  # record 11's pixels, not fetched yet
            f.seek(self.record_byte(origin, FIXED, 11)[1])
            f.write(b"\xff\x00\xff")
        with pytest.raises(DatasetError, match=f"origin:{shards[2]}: shard corrupted \\(record "):
            reader.read(np.array([12]))
        assert set(source.discarded) == {shards[2]} and not (source.root / shards[2]).exists()
        self.assert_batch(reader.read(np.array([22, 1])), records, [22, 1], FIXED)
