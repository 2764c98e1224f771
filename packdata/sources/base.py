"""The Source protocol: an ordered list of input items, and how to load one into a record.

Conversion hands items to worker processes in blocks (:meth:`Source.blocks`) and each worker calls
:meth:`Source.load_block` once per block. The default loads item by item; a source whose work is
cheaper in batches (a tokeniser's batch encoding) overrides it.
"""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packdata.errors import InputWarning, PackdataError, SampleError
from packdata.manifest import Field
from packdata.recordmeta import packed
from packdata.remote.files import RemotePath, fetch_all
from packdata.units import plural

#: the nouns :meth:`Source.ignore` counts, one of each
SINGULAR = {"files": "file", "entries": "entry"}

BLOCK = 256  # items per worker task at most, unless a source groups them otherwise
#: tasks a conversion is cut into at least, where its items allow (MIN_BLOCK each): enough for
#: every core of a large machine to get several (a few thousand photos in blocks of BLOCK would
#: leave most of 16 workers idle)
TASKS, MIN_BLOCK = 64, 16
SHOWN = 5  # names listed when reporting what was left out

Record = dict[str, np.ndarray]
#: what loading one item gives: a record; several ``(key, record)`` pairs when one input makes
#: several records (a long document split into chunks); or the error that names the input
Loaded = Record | list[tuple[str, Record]] | SampleError


@dataclass
class Survey:
    """What the headers of one block of inputs tell, read without decoding them (in a worker
    process: :meth:`Source.survey`): each input's rows of each variable-length field its record
    will hold (None where some header of the block did not tell), and facts of the source's own
    that :meth:`Source.surveyed` settles (e.g. the images' sizes)."""

    rows: dict[str, np.ndarray] | None
    facts: Any = None


@dataclass(frozen=True)
class Item:
    """One input sample: its key (kept in the manifest), its file, and its label if known."""

    key: str
    path: Path
    label: int | None = None


class ItemTable(Sequence[Item]):
    """Inputs as rows of arrays, each row's Item made when asked for (:meth:`_item`); a slice
    is the table of its rows (:meth:`_rows`), or a list of items where it has a step."""

    @abstractmethod
    def _item(self, i: int) -> Item: ...

    @abstractmethod
    def _rows(self, a: int, b: int) -> ItemTable: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self._item(j) for j in range(a, b, step)]
            return self._rows(a, max(a, b))
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"item {i} out of range for {n} items")
        return self._item(i % n)

    def __iter__(self) -> Iterator[Item]:
        return (self._item(i) for i in range(len(self)))

    def keys(self) -> list[str]:
        """Every row's key (a table may give them without making its items)."""
        return [item.key for item in self]

    def paths(self) -> list[Path | str]:
        """Every row's file (a table may give local ones as strings, making no Path)."""
        return [item.path for item in self]


def keys_of(items: Sequence[Item]) -> list[str]:
    """The keys of ``items``: a table's from its rows, without making an Item (and a Path) each
    in the converting process."""
    return items.keys() if isinstance(items, ItemTable) else [item.key for item in items]


def paths_of(items: Sequence[Item]) -> list[Path | str]:
    """The files of ``items``, as :func:`keys_of` gives their keys."""
    return items.paths() if isinstance(items, ItemTable) else [item.path for item in items]


class FileTable(ItemTable):
    """Inputs of one file each: every file's path under ``root`` (UTF-8, in one byte array with
    ``offsets``) and its label (``labels``, None when unlabelled), so that listing millions of
    files costs tens of bytes each, not an Item, a Path and two strings each. An item's key is
    its path without suffix. A slice copies its own rows, so a block sent to a worker carries
    those alone."""

    def __init__(self, root: Path, names: np.ndarray, offsets: np.ndarray,
                 labels: np.ndarray | None) -> None:
        self.root, self.names, self.offsets, self.labels = root, names, offsets, labels

    @classmethod
    def of(cls, root: Path, files: Sequence[str], labels: Sequence[int | None]) -> FileTable:
        """The table of ``files`` (paths under ``root``) and their labels (all None: none)."""
        _, names, offsets = packed(files)
        labelled = any(label is not None for label in labels)
        return cls(root, names, offsets, np.asarray(labels, np.int64) if labelled else None)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _rows(self, a: int, b: int) -> FileTable:
        lo, hi = int(self.offsets[a]), int(self.offsets[b])
        return FileTable(self.root, self.names[lo:hi].copy(), self.offsets[a : b + 1] - lo,
                         None if self.labels is None else self.labels[a:b].copy())

    def _item(self, i: int) -> Item:
        name = self.names[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()
        label = None if self.labels is None else int(self.labels[i])
        return Item(split_suffix(name)[0], self.root / name, label)

    def _names(self) -> list[str]:
        names, ends = self.names.tobytes(), self.offsets.tolist()
        return [names[a:b].decode() for a, b in zip(ends, ends[1:])]

    def keys(self) -> list[str]:
        return [split_suffix(name)[0] for name in self._names()]

    def paths(self) -> list[Path | str]:
        if isinstance(self.root, RemotePath):
            return [self.root / name for name in self._names()]
        root = os.fspath(self.root)
        return [os.path.join(root, name) for name in self._names()]


class Source(ABC):
    """Turns an input tree into records. ``load`` runs in worker processes, so keep it picklable."""

    kind: ClassVar[str]
    root: Path
    #: appended to shape errors, telling the user how to make records uniform
    shape_hint: ClassVar[str] = ""
    classes: list[str] | None = None
    #: keys unique by construction (e.g. text's ``FILE:LINE``): conversion does not compare them,
    #: which would hold every key of millions of inputs in memory at once
    unique_keys: ClassVar[bool] = False
    #: inputs left out by reason, set while listing (see :meth:`ignore`); absent until then
    ignored: dict[str, list[str]]
    #: whether :meth:`observe` does anything (conversion then hands it every record)
    OBSERVES: ClassVar[bool] = False
    #: whether loading runs native decoders that a damaged input can crash (LAZ's): conversion
    #: then loads in a worker process even with one worker, so a crash is an error naming the
    #: inputs, not the end of the converting process
    ISOLATE_LOADING: ClassVar[bool] = False

    @abstractmethod
    def items(self) -> list[Item]:
        """Every input, in a sorted, deterministic order."""

    @abstractmethod
    def load(self, item: Item) -> dict[str, np.ndarray]:
        """One record; raise :class:`packdata.errors.SampleError` naming the file when it fails."""

    def load_block(self, items: list[Item]) -> list[Loaded]:
        """Load ``items`` in one call, one result per item (never raising for one bad input)."""
        fetch_all([item.path for item in items])  # URL inputs: one batch of concurrent GETs
        return [safe_load(self, item) for item in items]

    def blocks(self, items: list[Item]) -> list[list[Item]]:
        """Group items into worker tasks: ``BLOCK`` at a time, fewer where that would make fewer
        than ``TASKS`` tasks (but ``MIN_BLOCK`` at least), unless a source knows better (e.g. by
        bytes, when items vary widely in cost)."""
        size = max(MIN_BLOCK, min(BLOCK, -(-len(items) // TASKS)))
        return [items[i : i + size] for i in range(0, len(items), size)]

    @property
    def surveying(self) -> bool:
        """Whether conversion surveys the inputs (:meth:`survey`, block by block in its worker
        processes) after listing them and before loading any."""
        return False

    def survey(self, items: Sequence[Item]) -> Survey:
        """What the headers of ``items`` (one block) tell without a decode: run in a worker
        process, where :attr:`surveying`."""
        raise NotImplementedError(f"{type(self).__name__} does not survey its inputs")

    def surveyed(self, surveys: Sequence[Survey]) -> None:  # noqa: B027 - optional hook
        """Settle what the surveys of every block (in order, in the converting process) decide,
        before any input is loaded (e.g. whether images of several sizes are stored as rows)."""

    @abstractmethod
    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        """The fields every record must match, given the first record loaded."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The options that recreate this source: each of its kind's ``OPTIONS`` by name, as
        JSON values that ``open_source(root, kind, **options)`` accepts. :meth:`describe` puts
        them in the manifest's options, and ``packdata verify --source`` passes them back."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The source (path, layout) and the conversion options (:meth:`options`, plus facts
        derived from them), for the manifest (and optionally ``extra`` facts, e.g. gathered by
        :meth:`observe`)."""

    def list_inputs(self, suffixes: tuple[str, ...], used: Path | None = None) -> list[str]:
        """:func:`list_files` under ``self.root``; the other files there, but ``used`` (e.g. the
        labels file), are noted as ignored (:meth:`ignore`)."""
        others: list[str] = []
        files = list_files(self.root, suffixes, others)
        self.ignore(f"files of another kind than {self.kind} (suffix not {', '.join(suffixes)})",
                    [f for f in others if used is None or self.root / f != used])
        return files

    def ignore(self, why: str, names: list[str]) -> None:
        """Record inputs left out for reason ``why`` (its first word a plural noun: "files …",
        "entries …"; the latest listing's, once per reason): :func:`packdata.convert` puts a
        count and the first names in the manifest's ``source.ignored``, and they are announced
        as an InputWarning."""
        ignored = self.__dict__.setdefault("ignored", {})
        if names and ignored.get(why) != names:
            noun, _, rest = why.partition(" ")
            counted = plural(len(names), SINGULAR.get(noun, noun), noun)
            warnings.warn(f"{self.root}: ignored {counted} {rest}: {shown(names)}",
                          InputWarning, stacklevel=3)
        ignored[why] = names

    def note(self, why: str, name: str) -> None:
        """Count an input whose values loading changed for reason ``why`` (e.g. "alpha
        dropped …"), keeping the first :data:`SHOWN` names. Called in workers: conversion
        gathers the counts (:meth:`take_notes`, :meth:`add_notes`) into the converting process's
        source, records them in the manifest (``source.changed``) and warns once per reason."""
        self.add_notes({why: (1, [name])})

    def take_notes(self) -> dict[str, tuple[int, list[str]]]:
        """The notes counted here since the last call (per reason: count, first names)."""
        return self.__dict__.pop("noted", {})

    def add_notes(self, notes: dict[str, tuple[int, list[str]]]) -> None:
        """Add counts from :meth:`take_notes` (a worker's, in input order)."""
        noted = self.__dict__.setdefault("noted", {})
        for why, (count, names) in notes.items():
            had, first = noted.get(why, (0, []))
            noted[why] = (had + count, (first + names)[:SHOWN])

    def observe(self, record: dict[str, np.ndarray]) -> None:  # noqa: B027 - optional hook
        """Called in the converting process with each stored record, in order (``load`` runs in
        workers, whose state is lost): a place to count facts for the manifest. Only where the
        source declares ``OBSERVES = True`` (a block of records is then taken apart for it;
        otherwise it is stored as it arrived)."""


#: what a failure while loading one input never is: the user's or the interpreter's own stop.
#: Anything else a decoder raises is that input's failure, BaseException subclasses included
#: (lazrs panics as pyo3's PanicException, which derives from BaseException).
STOPS = (KeyboardInterrupt, SystemExit, GeneratorExit)


def safe_load(source: Source, item: Item) -> Loaded:
    """``source.load(item)``, with any failure returned as a SampleError naming the file."""
    try:
        return source.load(item)
    except SampleError as exc:
        # only its path and reason travel: a library's exception chained to it (lazrs's panic)
        # may not pickle where exceptions pickle their chain (e.g. once tblib's support is on)
        exc.__context__ = exc.__cause__ = exc.__traceback__ = None
        return exc
    except (PackdataError, *STOPS):  # not about one input (e.g. a tokeniser that does not fit)
        raise
    except BaseException as exc:  # a library failing on bad input: name the file, keep the reason
        return SampleError(str(item.path), reason_of(exc))


def reason_of(exc: BaseException) -> str:
    """A library's failure as one line: its type and message (plain strings, so it pickles)."""
    return f"{type(exc).__name__}: {exc}"


def split_suffix(name: str) -> tuple[str, str]:
    """``os.path.splitext`` of a relative POSIX path, at a fraction of its cost where the base
    name does not start with a dot (then its last dot starts the suffix): listing and keys make
    one for every input."""
    dot, base = name.rfind("."), name.rfind("/") + 1
    if dot > base and name[base] != ".":
        return name[:dot], name[dot:]
    return os.path.splitext(name)


def list_files(root: Path, suffixes: tuple[str, ...], others: list[str] | None = None) -> list[str]:
    """Files under ``root`` with one of ``suffixes``, as sorted relative POSIX paths (``root``
    itself if it is such a file); the rest are appended to ``others``, sorted. os.walk and
    strings: building a Path per file costs more than the listing itself on folders of millions
    of files."""
    if root.is_file():
        return [root.name]
    found, rest = [], []
    if isinstance(root, RemotePath):  # a folder at a URL: one listing
        listed = root.files()
    else:
        listed = []
        for folder, _, names in os.walk(root):
            rel = os.path.relpath(folder, root)
            prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            listed.extend(prefix + n for n in names)
    for f in listed:
        (found if split_suffix(f)[1].lower() in suffixes else rest).append(f)
    if others is not None:
        others.extend(sorted(rest))
    return sorted(found)


def shown(names: list[str], count: int | None = None) -> str:
    """The first few of ``names`` (of ``count`` in all: by default, as many as given), and how
    many more."""
    count = len(names) if count is None else count
    more = f" and {count - SHOWN} more" if count > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
