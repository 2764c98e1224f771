"""The conformance suite for the LMDB container; records read back with plain ``lmdb``."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np

from tests.containers.suite import ContainerSuite


class TestLMDB(ContainerSuite):
    name = "lmdb"
    target = "d.lmdb"

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
    from packdata.containers import lmdb as container
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
