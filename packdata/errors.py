"""packdata's errors: one base class; each subclass also inherits the builtin a caller would expect."""

from __future__ import annotations


class PackdataError(Exception):
    """Base of every error packdata raises on purpose."""


class SampleError(PackdataError, ValueError):
    """One input file could not be turned into a sample (corrupt, unreadable, unlabelled...)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):  # rebuilt from (path, reason): workers send these back to the parent
        return type(self), (self.path, self.reason)


class SkippedSample(SampleError):
    """An input left out on purpose, by policy rather than failure (e.g. an empty document):
    recorded in the manifest's ``skipped`` list whatever ``on_error`` says."""


class DatasetError(PackdataError, ValueError):
    """A path is not a valid packdata dataset, or a request does not fit its manifest."""


class UnreadableDataset(DatasetError):
    """A packdata dataset, by its files, that cannot be read: its manifest damaged or missing,
    or a part of it missing (``convert --overwrite`` may replace it)."""


class TokenizerError(PackdataError, ValueError):
    """A tokeniser cannot be loaded (missing or invalid file) or does not fit the data."""


class OutputExistsError(PackdataError, FileExistsError):
    """The conversion target exists and overwriting was not asked for."""


class MissingExtraError(PackdataError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{module}' package: pip install \"packdata[{extra}]\""
        )
        self.module, self.extra, self.purpose = module, extra, purpose

    def __reduce__(self):  # workers send these back to the parent
        return type(self), (self.module, self.extra, self.purpose)


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency where it is used, or raise MissingExtraError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module, extra, purpose) from exc


class BenchError(PackdataError, ValueError):
    """``packdata bench`` cannot run as asked: no such device, a model that does not fit the
    batch, an input that is neither a packdata dataset nor an image folder."""


class ArgumentError(PackdataError, ValueError):
    """An argument whose value cannot work (a batch size of 0, a rank outside the world size,
    an unknown choice), named with the value given."""


class ArgumentTypeError(PackdataError, TypeError):
    """An argument of the wrong type (e.g. float sample indices)."""


class OptionError(ArgumentError):
    """A conversion option that the sample kind does not have, or a value it does not accept."""


class InputWarning(UserWarning):
    """Conversion goes on but the user should know: inputs left out (files with other suffixes,
    labels naming no file), or precision a stored type loses. ``packdata convert`` prints these."""


class AugmentInputError(PackdataError, ValueError):
    """A batch given to an augmentation is not what it expects (type, dtype, layout, shape)."""


class DeviceError(PackdataError, RuntimeError):
    """The device asked for is not present (e.g. ``device="cuda"`` on a machine without CUDA)."""


class ResidentMemoryError(PackdataError, MemoryError):
    """The dataset does not fit in the memory of the device asked for resident mode."""


class ResumeError(PackdataError, ValueError):
    """A saved loader or sampler state that does not fit what it is loaded into."""


class WorkerDied(PackdataError):
    """A worker process stopped unexpectedly (killed, out of memory, a crash in a native
    decoder): a conversion worker while ``task`` (None: any of the tasks) was in flight, which
    conversion turns into an error naming the inputs, or a loader's feeder (``which``)."""

    def __init__(self, task: object = None, which: str = "a worker process") -> None:
        super().__init__(f"{which} stopped unexpectedly")
        self.task = task
