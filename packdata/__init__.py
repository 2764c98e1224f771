"""packdata: pack one-file-per-sample datasets into LMDB, HDF5 or tar shards, and load them fast.

>>> import packdata
>>> ds = packdata.open("cifar.lmdb")              # (image uint8 C×H×W, label) samples
>>> for images, labels in packdata.loader(ds, batch_size=256):
...     ...
"""

from packdata.bench.timer import StepTimer
from packdata.collate import PackCollate, PadCollate
from packdata.convert import ConvertResult, convert
from packdata.dataset import HDF5Dataset, LMDBDataset, PackedDataset, TarDataset
from packdata.dataset import open_dataset as open  # noqa: A001 - the package's front door
from packdata.device import DeviceLoader
from packdata.errors import (
    DatasetError,
    MissingExtraError,
    OutputExistsError,
    PackdataError,
    SampleError,
)
from packdata.loading import Loader, loader
from packdata.manifest import Field, Manifest
from packdata.resident import ResidentLoader
from packdata.sampling import EpochBatchSampler, LengthBucketBatchSampler
from packdata.sources import open_source
from packdata.streaming import StreamingDataset

__version__ = "0.1.0"

__all__ = [
    "ConvertResult", "DatasetError", "DeviceLoader", "EpochBatchSampler", "Field", "HDF5Dataset",
    "LMDBDataset", "LengthBucketBatchSampler", "Loader", "Manifest", "MissingExtraError", "OutputExistsError",
    "PackCollate", "PackdataError", "PackedDataset", "PadCollate", "ResidentLoader", "SampleError",
    "StepTimer", "StreamingDataset", "TarDataset", "convert", "loader", "open", "open_source",
]
