"""packdata: pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast.

>>> import packdata
>>> ds = packdata.open("cifar.lmdb")              # (image uint8 C×H×W, label) samples
>>> for images, labels in packdata.loader(ds, batch_size=256):
...     ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from packdata._version import __version__

# Names are imported on first use (PEP 562): `import packdata` costs nothing until then, so the
# command line can install its Ctrl-C handling before torch and friends load.
_HOMES = {
    "StepTimer": "packdata.bench.timer",
    "PackCollate": "packdata.loading.collate", "PadCollate": "packdata.loading.collate",
    "ConvertResult": "packdata.conversion.job", "convert": "packdata.conversion.dispatch",
    "HDF5Dataset": "packdata.loading.dataset", "LMDBDataset": "packdata.loading.dataset",
    "PackedDataset": "packdata.loading.dataset", "TarDataset": "packdata.loading.dataset",
    "open": "packdata.loading.dataset",
    "DeviceLoader": "packdata.loading.device",
    "CenterCrop": "packdata.imagedecode", "ImageDecode": "packdata.imagedecode",
    "RandomResizedCrop": "packdata.imagedecode", "Resize": "packdata.imagedecode",
    "DatasetError": "packdata.errors", "MissingExtraError": "packdata.errors",
    "OutputExistsError": "packdata.errors", "PackdataError": "packdata.errors",
    "ResumeError": "packdata.errors", "SampleError": "packdata.errors",
    "Loader": "packdata.loading.loader", "loader": "packdata.loading.loader",
    "Field": "packdata.manifest", "Manifest": "packdata.manifest",
    "ResidentLoader": "packdata.loading.resident",
    "EpochBatchSampler": "packdata.loading.sampling", "LengthBucketBatchSampler": "packdata.loading.buckets",
    "open_source": "packdata.sources",
    "StreamingDataset": "packdata.loading.streaming", "StreamingLoader": "packdata.loading.streaming",
    "VerifyReport": "packdata.verification", "verify": "packdata.verification",
}
_RENAMED = {"open": "open_dataset"}  # the package's front door

if TYPE_CHECKING:
    from packdata.bench.timer import StepTimer
    from packdata.conversion.dispatch import convert
    from packdata.conversion.job import ConvertResult
    from packdata.errors import (
        DatasetError,
        MissingExtraError,
        OutputExistsError,
        PackdataError,
        ResumeError,
        SampleError,
    )
    from packdata.imagedecode import CenterCrop, ImageDecode, RandomResizedCrop, Resize
    from packdata.loading.buckets import LengthBucketBatchSampler
    from packdata.loading.collate import PackCollate, PadCollate
    from packdata.loading.dataset import HDF5Dataset, LMDBDataset, PackedDataset, TarDataset
    from packdata.loading.dataset import open_dataset as open  # noqa: A004
    from packdata.loading.device import DeviceLoader
    from packdata.loading.loader import Loader, loader
    from packdata.loading.resident import ResidentLoader
    from packdata.loading.sampling import EpochBatchSampler
    from packdata.loading.streaming import StreamingDataset, StreamingLoader
    from packdata.manifest import Field, Manifest
    from packdata.sources import open_source
    from packdata.verification import VerifyReport, verify


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        try:  # a submodule (packdata.containers...) not imported yet
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'packdata' has no attribute '{name}'") from None
    value = getattr(importlib.import_module(home), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "CenterCrop", "ConvertResult", "DatasetError", "DeviceLoader", "EpochBatchSampler", "Field",
    "HDF5Dataset", "ImageDecode", "LMDBDataset", "LengthBucketBatchSampler", "Loader", "Manifest",
    "MissingExtraError", "OutputExistsError", "PackCollate", "PackdataError", "PackedDataset",
    "PadCollate", "RandomResizedCrop", "ResidentLoader", "Resize", "ResumeError", "SampleError",
    "StepTimer", "StreamingDataset", "StreamingLoader", "TarDataset", "VerifyReport", "convert",
    "__version__", "loader", "open", "open_source", "verify",
]
