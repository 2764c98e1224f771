"""The conformance suite for the HDF5 container; records read back with plain ``h5py``."""

from __future__ import annotations

import h5py

from tests.containers.suite import ContainerSuite


class TestHDF5(ContainerSuite):
    name = "hdf5"
    target = "d.h5"
    gathered = True

    def plain_read(self, path, fields, index):
        with h5py.File(path, "r") as f:
            out = {}
            for name, field in fields.items():
                if field.variable:
                    a, b = f[f"{name}_offsets"][index : index + 2]
                    out[name] = f[name][a:b]
                else:
                    out[name] = f[name][index]
            return out

    def record_byte(self, path, fields, index):
        name = next(iter(fields))
        with h5py.File(path, "r") as f:
            return path, f[name].id.get_offset() + index * fields[name].nbytes + 3
