"""The conformance suite every container passes: subclass :class:`ContainerSuite` once per
container (tests/containers/test_<name>.py), naming it and saying how the plain library reads a
record back. A new container is done when its subclass passes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from packdata import containers
from packdata.checksum import record_checksum, rows_checksums
from packdata.containers.integrity import at_open
from packdata.errors import DatasetError
from packdata.manifest import Field, Manifest
from packdata.verification import verify
from tests.conftest import needs_native_rows

Record = dict[str, np.ndarray]

FIXED = {"image": Field("uint8", (4, 5, 3)), "label": Field("int64", ()),
         "vec": Field("float32", (7,))}
VARIABLE = {"ids": Field("int32", (None,)), "points": Field("float32", (None, 3)),
            "label": Field("int64", ())}
VARIANTS = {"points": Field("float16", (3, 16, 3)), "label": Field("int64", ())}


def make_records(fields: dict[str, Field], count: int, seed: int = 0) -> list[Record]:
    """``count`` records of random values; variable lengths include 0."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        record = {}
        for name, f in fields.items():
            shape = ((i * 7) % 11, *f.row_shape) if f.variable else f.shape
            record[name] = (rng.standard_normal(shape) * 100).astype(f.np_dtype)
        out.append(record)
    return out


class ContainerSuite:
    """Write with the container's Writer, read with its Reader and with the plain library."""

    name: ClassVar[str]
    target: ClassVar[str]  # the destination's name, e.g. "d.lmdb"
    #: whether the container's reader gathers batches by rows and, with packdata's C extension,
    #: reads them through a batch plan once it knows where every record lies: the read path
    #: behind the Speed figures (docs/speed.md). Said here, not asked of the reader, so that a reader
    #: that lost it fails its tests instead of skipping them.
    gathered: ClassVar[bool]

    def plain_read(self, path: Path, fields: dict[str, Field], index: int) -> Record:
        """Record ``index`` read by the plain library (lmdb, h5py, tarfile), bypassing packdata."""
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------------

    def plan_of(self, reader):
        """The batch plan of ``reader``, which has read every record once; a container that
        declares none skips (a reason tools/check_skips.py does not expect in CI)."""
        if not self.gathered:
            pytest.skip(f"{self.name}: reads are not gathered by rows (no batch plan)")
        needs_native_rows()
        plan = reader.batch_plan()
        assert plan is not None, f"{self.name}: no batch plan once every record was read"
        return plan

    def write(self, tmp_path: Path, fields: dict[str, Field], records: list[Record],
              options: dict | None = None) -> Path:
        module = containers.get(self.name)
        path = tmp_path / self.target
        writer = module.WRITER(path, fields, dict(options or {}))
        keys = [f"dir/sample {i}" for i in range(len(records))]
        for key, record in zip(keys, records):
            writer.append(key, record)
        manifest = Manifest(container=self.name, kind="test", fields=fields, count=len(records),
                            keys=keys, checksums=[record_checksum(r, fields) for r in records])
        writer.finish(manifest)
        return path

    def reader(self, path: Path):
        return containers.for_existing(path).READER(path)

    @staticmethod
    def assert_batch(batch, records: list[Record], idx, fields: dict[str, Field]) -> None:
        for name, f in fields.items():
            if f.variable:
                assert len(batch[name]) == len(idx)
                for got, i in zip(batch[name], idx):
                    assert got.dtype == f.np_dtype
                    np.testing.assert_array_equal(got, records[i][name])
            else:
                want = np.stack([records[i][name] for i in idx]) if len(idx) else None
                assert batch[name].shape == (len(idx), *f.shape)
                assert batch[name].dtype == f.np_dtype
                if want is not None:
                    np.testing.assert_array_equal(batch[name], want)

    # -- the suite -------------------------------------------------------------------------

    @pytest.mark.parametrize("fields", [FIXED, VARIABLE, VARIANTS], ids=["fixed", "variable",
                                                                          "variants"])
    def test_records_read_back_in_any_order(self, tmp_path, fields):
        records = make_records(fields, 23)
        reader = self.reader(self.write(tmp_path, fields, records, self.options(5)))
        assert reader.manifest.count == 23
        for idx in ([0], [22, 3, 3, 10], list(range(23)), [-1, -23]):
            self.assert_batch(reader.read(np.array(idx)), records,
                              [i % 23 for i in idx], fields)
        with pytest.raises(IndexError, match="index 23 out of range"):
            reader.read(np.array([23]))

    @pytest.mark.parametrize("laid_out", ["exact", "more rows", "fewer rows", "fewer records"])
    def test_variable_records_laid_out_ahead_read_back_the_same(self, tmp_path, laid_out):
        """Told the rows each variable field will hold (a writer that lays them out), exact or
        wrong, the records read back as appended."""
        records = make_records(VARIABLE, 30)
        rows = {name: sum(len(r[name]) for r in records) for name in ("ids", "points")}
        count = 30
        if laid_out == "more rows":
            rows["points"] += 5
        elif laid_out == "fewer rows":
            rows["ids"] -= 1
        elif laid_out == "fewer records":
            count = 20
        keys = [f"k{i}" for i in range(30)]
        path = tmp_path / self.target
        writer = containers.get(self.name).WRITER(path, VARIABLE, self.options(7))
        writer.expect(count, rows)
        for key, record in zip(keys, records):
            writer.append(key, record)
        writer.finish(Manifest(container=self.name, kind="test", fields=VARIABLE, count=30,
                               keys=keys, checksums=[record_checksum(r, VARIABLE)
                                                     for r in records]))
        self.assert_batch(self.reader(path).read(np.arange(30)), records, list(range(30)),
                          VARIABLE)
        assert verify(path).ok

    @pytest.mark.parametrize("expected", [None, 30, 45, 12], ids=["none", "exact", "more",
                                                                 "fewer"])
    def test_rows_store_what_records_do(self, tmp_path, expected):
        """Records handed over as rows of one table (conversion's blocks) are stored as
        ``append`` stores them, mixed with single records, across shards; the table's checksums
        are the records'. The count the writer is told to expect (conversion's inputs) is a hint:
        exact, too many (skipped inputs) or too few, the records read back the same."""
        records = make_records(FIXED, 30)
        table = np.stack([np.concatenate([np.ascontiguousarray(r[n]).reshape(-1).view(np.uint8)
                                          for n in FIXED]) for r in records])
        checksums = [record_checksum(r, FIXED) for r in records]
        assert rows_checksums(table).tolist() == checksums
        keys = [f"dir/sample {i}" for i in range(len(records))]
        path = tmp_path / self.target
        writer = containers.get(self.name).WRITER(path, FIXED, self.options(7))
        if expected is not None:
            writer.expect(expected)
        writer.append(keys[0], records[0])
        writer.append_rows(keys[1:25], table[1:25])
        writer.append(keys[25], records[25])
        writer.append_rows(keys[26:], table[26:])
        writer.finish(Manifest(container=self.name, kind="test", fields=FIXED, count=30,
                               keys=keys, checksums=checksums))
        self.assert_batch(self.reader(path).read(np.arange(30)[::-1]), records,
                          list(range(30))[::-1], FIXED)
        assert verify(path).ok

    @pytest.mark.parametrize("fields", [FIXED, VARIANTS], ids=["fixed", "variants"])
    def test_row_sources_locate_what_read_returns(self, tmp_path, fields):
        """A reader that declares GATHERS_ROWS says where every field of a batch lies (across
        shards): its rows are the records' bytes, and reads into arrays gathered from them
        (checked as they are gathered by default) hold the same records."""
        records = make_records(fields, 23)
        path = self.write(tmp_path, fields, records, self.options(5))
        reader = self.reader(path)
        idx = np.array([22, 3, 3, 10, 0])
        if not self.gathered:
            pytest.skip(f"{self.name}: reads are not gathered by rows (no batch plan)")
        assert reader.GATHERS_ROWS, f"{self.name}: its reader no longer gathers by rows"
        sources = reader.row_sources(idx)
        assert [name for name, _, _ in sources] == list(fields)
        for name, view, rows in sources:
            got = view[rows].view(fields[name].np_dtype).reshape(len(idx), *fields[name].shape)
            np.testing.assert_array_equal(got, np.stack([records[i][name] for i in idx]))
        checked = at_open(self.reader(path), path, "full")
        out = {name: np.empty((len(idx), *f.shape), f.np_dtype) for name, f in fields.items()}
        self.assert_batch(checked.read_into(idx, out), records, idx.tolist(), fields)
        # a strided view of indices (a rank's share, indices[rank::world])
        self.assert_batch(checked.read(idx[::-2]), records, idx[::-2].tolist(), fields)

    def test_a_batch_plan_reads_what_records_hold(self, tmp_path):
        """Once a reader knows where every record lies (after reading each once, at the
        latest), it reads whole batches through its plan: the same records in any order,
        negative indices from the end, a bad index named as before, into given arrays too."""
        records = make_records(FIXED, 23)
        reader = self.reader(self.write(tmp_path, FIXED, records, self.options(5)))
        reader.read(np.arange(23))  # every record once (a tar reader checks its entries)
        plan = self.plan_of(reader)
        for idx in ([0], [22, 3, 3, 10], [-1, -23, 5], list(range(23))[::-1], []):
            want = [i % 23 for i in idx]
            self.assert_batch(plan.read(np.array(idx, dtype=np.int64)), records, want, FIXED)
            self.assert_batch(reader.read(np.array(idx, dtype=np.int64)), records, want, FIXED)
        for bad in ([23], [0, -24]):
            with pytest.raises(IndexError, match=f"index {bad[-1]} out of range"):
                reader.read(np.array(bad))
        idx = np.array([4, 9, 4])
        out = {name: np.empty((3, *f.shape), f.np_dtype) for name, f in FIXED.items()}
        batch = reader.read_into(idx, out)
        assert all(batch[name] is out[name] for name in FIXED)
        self.assert_batch(batch, records, idx.tolist(), FIXED)

        def unplanned(*args: object) -> None:
            raise AssertionError("a read left the batch plan")

        reader.read_records = unplanned  # Reader.read takes the plan, whatever the container
        self.assert_batch(reader.read(np.array([2, 7])), records, [2, 7], FIXED)

    def test_a_batch_plan_reads_one_entry_per_record(self, tmp_path):
        """``select`` through the plan: entry ``rows[j]`` of record ``idx[j]`` (the other
        entries' bytes not read), negative indices from the end; a bad entry is named."""
        records = make_records(VARIANTS, 12)
        reader = self.reader(self.write(tmp_path, VARIANTS, records, self.options(5)))
        reader.read(np.arange(12))
        plan = self.plan_of(reader)
        idx, rows = np.array([11, 0, 5, 6, -1]), np.array([2, 0, 1, 2, 1])
        for batch in (plan.read(idx, {"points": rows}), reader.read(idx, {"points": rows})):
            np.testing.assert_array_equal(batch["points"], np.stack(
                [records[i]["points"][r] for i, r in zip(idx, rows)]))
            np.testing.assert_array_equal(batch["label"], [records[i]["label"] for i in idx])
        for bad in ([0, 3], [-1, 0], [0]):
            with pytest.raises(IndexError, match="select"):
                plan.read(np.array([4, 5]), {"points": np.array(bad)})
        with pytest.raises(IndexError, match="index 12 out of range"):
            plan.read(np.array([12]), {"points": np.array([0])})

    def test_lengths_of_variable_fields(self, tmp_path):
        records = make_records(VARIABLE, 9)
        reader = self.reader(self.write(tmp_path, VARIABLE, records, self.options(4)))
        np.testing.assert_array_equal(reader.lengths("points"), [len(r["points"]) for r in records])
        with pytest.raises(DatasetError, match="not a variable-length field"):
            reader.lengths("label")

    def test_select_reads_one_variant_per_record(self, tmp_path):
        records = make_records(VARIANTS, 12)
        reader = self.reader(self.write(tmp_path, VARIANTS, records, self.options(5)))
        idx = np.array([11, 0, 5, 6])
        rows = np.array([2, 0, 1, 2])
        batch = reader.read(idx, {"points": rows})
        np.testing.assert_array_equal(
            batch["points"], np.stack([records[i]["points"][r] for i, r in zip(idx, rows)]))
        np.testing.assert_array_equal(batch["label"], [records[i]["label"] for i in idx])

    def test_a_selected_entry_past_the_axis_is_an_index_error(self, tmp_path):
        """Readers gather a selected entry at its byte offset: an entry past K, a negative one
        or one too few fail by name, never read another record's bytes."""
        records = make_records(VARIANTS, 6)
        reader = self.reader(self.write(tmp_path, VARIANTS, records, self.options(5)))
        for bad in ([0, 3], [-1, 0], [0]):
            with pytest.raises(IndexError, match="select"):
                reader.read(np.array([4, 5]), {"points": np.array(bad)})

    def test_one_record(self, tmp_path):
        records = make_records(VARIABLE, 1)
        reader = self.reader(self.write(tmp_path, VARIABLE, records))
        self.assert_batch(reader.read(np.array([0])), records, [0], VARIABLE)
        assert verify(tmp_path / self.target).ok

    def test_empty_dataset(self, tmp_path):
        reader = self.reader(self.write(tmp_path, FIXED, []))
        assert reader.manifest.count == 0
        self.assert_batch(reader.read(np.array([], dtype=np.int64)), [], [], FIXED)
        assert verify(tmp_path / self.target).ok

    @pytest.mark.parametrize("fields", [FIXED, VARIABLE, VARIANTS], ids=["fixed", "variable",
                                                                          "variants"])
    def test_plain_library_reads_the_same_records(self, tmp_path, fields):
        records = make_records(fields, 7)
        path = self.write(tmp_path, fields, records, self.options(3))
        for i in (0, 4, 6):
            got = self.plain_read(path, fields, i)
            for name in fields:
                np.testing.assert_array_equal(got[name], records[i][name])

    def test_damage_is_refused_or_detected(self, tmp_path):
        """Half of the largest file cut off: refused at open. One byte flipped inside a record:
        `packdata verify` and verify="full" name it."""
        records = make_records(FIXED, 40)
        path = self.write(tmp_path, FIXED, records, self.options(20))
        cut = shutil.copytree(path, tmp_path / "cut") if path.is_dir() else \
            shutil.copy(path, tmp_path / "cut")
        biggest = max((p for p in Path(cut).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size) \
            if Path(cut).is_dir() else Path(cut)
        biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
        with pytest.raises(DatasetError, match="cut"):
            at_open(self.reader(Path(cut)), cut, "sample").read(np.arange(40))
        file, offset = self.record_byte(path, FIXED, 17)
        data = bytearray(file.read_bytes())
        data[offset] ^= 0x01
        file.write_bytes(bytes(data))
        assert [b["index"] for b in verify(path).bad] == [17]
        full = at_open(self.reader(path), path, "full")
        with pytest.raises(DatasetError, match="record 17 .* does not match its checksum"):
            full.read(np.array([16, 17]))

    # -- per container ---------------------------------------------------------------------

    def options(self, per_shard: int) -> dict:
        """Writer options that make several files/chunks where the container has them."""
        return {}

    def record_byte(self, path: Path, fields: dict[str, Field], index: int) -> tuple[Path, int]:
        """A file and an offset of one byte of record ``index``'s first field."""
        raise NotImplementedError
