"""The Source protocol: an ordered list of input items, and how to load one into a record."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packdata.manifest import Field


@dataclass(frozen=True)
class Item:
    """One input sample: its key (kept in the manifest), its file, and its label if known."""

    key: str
    path: Path
    label: int | None = None


class Source(ABC):
    """Turns an input tree into records. ``load`` runs in worker processes, so keep it picklable."""

    kind: ClassVar[str]
    root: Path
    #: appended to shape errors, telling the user how to make records uniform
    shape_hint: ClassVar[str] = ""
    classes: list[str] | None = None

    @abstractmethod
    def items(self) -> list[Item]:
        """Every input, in a sorted, deterministic order."""

    @abstractmethod
    def load(self, item: Item) -> dict[str, np.ndarray]:
        """One record; raise :class:`packdata.errors.SampleError` naming the file when it fails."""

    @abstractmethod
    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        """The fields every record must match, given the first record loaded."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The source (path, layout) and the conversion options, for the manifest (and
        optionally ``extra`` facts, e.g. gathered by :meth:`observe`)."""

    def observe(self, record: dict[str, np.ndarray]) -> None:  # noqa: B027 - optional hook
        """Called in the converting process with each stored record, in order (``load`` runs in
        workers, whose state is lost): a place to count facts for the manifest."""


def relative_key(path: Path, root: Path) -> str:
    """A sample's key: its path under ``root`` without the suffix, with forward slashes."""
    return path.relative_to(root).with_suffix("").as_posix()
