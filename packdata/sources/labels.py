"""Per-sample class labels shared by every source kind: a labels file, or class sub-folders."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import pickle
import warnings
from pathlib import Path

import numpy as np

from packdata.errors import InputWarning, PackdataError
from packdata.options import Option

LABEL_FILES = ("labels.json", "labels.csv", "labels.pkl")
MISSING = -1  # a file with no entry in the labels file; the source's load() reports it
#: the option of every kind that takes per-sample labels
LABELS = Option("labels", Path, None, "Labels file: .json, .csv or .pkl mapping file name → "
                "class index. Found automatically as SRC/labels.*; class sub-folders need none. "
                "A .pkl is unpickled: use only one you trust.")


def load_labels(path: Path) -> tuple[dict[str, int], list[str] | None]:
    """Read a labels file: ``{file name: class index}`` and the class names when it gives them.

    ``.json``: ``{name: index}`` or ``{"classes": [...], "labels": {name: index}}``, with class
    names in place of indices if you like (looked up in ``classes`` when given, else in the
    sorted names);
    ``.csv``: rows ``name,label`` (label an index or a class name; a header row is skipped);
    ``.pkl``: a pickled dict of str → int (numpy integers too) or str → class name. Unpickling
    runs code from the file: only load a ``labels.pkl`` you trust. Anything else is refused.
    """
    suffix = path.suffix.lower()
    classes = None
    try:
        if suffix == ".json":
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "labels" in data:
                classes, data = data.get("classes"), data["labels"]
        elif suffix == ".pkl":
            with path.open("rb") as f:
                data = pickle.load(f)  # noqa: S301 - documented: labels.pkl must be trusted
        elif suffix == ".csv":
            with path.open(newline="") as f:
                rows = [r for r in csv.reader(f) if r]
            if rows and not rows[0][1].strip().lstrip("-").isdigit():
                if any(not r[1].strip().lstrip("-").isdigit() for r in rows[1:]):
                    classes = sorted({r[1].strip() for r in rows[1:]})
                    index = {c: i for i, c in enumerate(classes)}
                    return {r[0]: index[r[1].strip()] for r in rows[1:]}, classes
                rows = rows[1:]
            data = {r[0]: int(r[1]) for r in rows}
        else:
            raise PackdataError(f"{path}: labels must be .json, .csv or .pkl")
    except PackdataError:
        raise
    except Exception as exc:  # unpickling can raise anything (missing classes, modules…)
        raise PackdataError(f"{path}: cannot read labels ({type(exc).__name__}: {exc})") from None
    if type(data) is dict and data and all(isinstance(v, str) for v in data.values()):
        data, classes = _by_name(data, classes, path)
    if type(data) is not dict or not all(isinstance(k, str) for k in data):
        raise PackdataError(f"{path}: expected a dict of file name (str) → class index (int)")
    if any(isinstance(v, str) for v in data.values()):
        raise PackdataError(f"{path}: the labels file mixes class names and indices; use one")
    # numpy integers (a pickle of a numpy array's values) are indices too; bools are not
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in data.values()):
        raise PackdataError(f"{path}: expected a dict of file name (str) → class index (int)")
    data = {k: int(v) for k, v in data.items()}
    negative = next((k for k, v in data.items() if v < 0), None)
    if negative is not None:
        raise PackdataError(f"{path}: class indices must be ≥ 0; '{negative}' has "
                            f"{data[negative]}")
    return data, classes


def _by_name(data: dict[str, str], classes: list[str] | None, path: Path
             ) -> tuple[dict[str, int], list[str]]:
    """Class names as indices: into ``classes`` when the file lists them, else into the sorted
    names (as for a CSV of names)."""
    if classes is None:
        classes = sorted(set(data.values()))
    index = {c: i for i, c in enumerate(classes)}
    unknown = next((k for k, v in data.items() if v not in index), None)
    if unknown is not None:
        raise PackdataError(f"{path}: the label '{data[unknown]}' of '{unknown}' is not in its "
                            f"classes ({', '.join(map(str, classes[:10]))})")
    return {k: index[v] for k, v in data.items()}, classes


def find_labels_file(root: Path) -> Path | None:
    """``root/labels.{json,csv,pkl}`` when present."""
    for name in LABEL_FILES:
        if (root / name).is_file():
            return root / name
    return None


def recorded(labels_path: Path | None, root: Path) -> str | None:
    """The ``labels`` option that finds ``labels_path`` again: None when there is none or when
    it is the file found automatically in ``root`` (so a moved source still finds its own), else
    its absolute path."""
    if labels_path is None or labels_path == find_labels_file(root):
        return None
    return os.path.abspath(labels_path)


def warn_unlabelled(root: Path, what: str, files: list[str]) -> None:
    """The InputWarning for a source that found no labels, naming a labels file that lies beside
    ``root`` (as CIFAR exports keep it) if some of its entries name some of ``files``: labels are
    looked for only inside it."""
    beside = None
    with contextlib.suppress(Exception):  # only a hint: a folder that cannot be listed has none
        beside = labels_beside(root.parent, files)
    hint = f"; {beside} lies beside it: pass --labels {beside}" if beside else \
        "; pass --labels FILE if they are in a file elsewhere"
    warnings.warn(f"{root}: no labels found (no {', '.join(LABEL_FILES)} in it, no class "
                  f"sub-folders): each sample is {what} alone, without a label{hint}",
                  InputWarning, stacklevel=3)


def labels_beside(folder: Path, files: list[str]) -> Path | None:
    """``folder/labels.json`` or ``.csv`` when one of its entries names one of ``files`` (a
    ``labels.pkl`` is never read unasked: unpickling runs its code)."""
    for name in LABEL_FILES:
        path = folder / name
        if name.endswith(".pkl") or not path.is_file():
            continue
        with contextlib.suppress(PackdataError):
            table, _ = load_labels(path)
            if any(entry(table, f) is not None for f in files):
                return path
    return None


def layout(files: list[str], labels_path: Path | None) -> str:
    """How ``files`` (paths relative to the root, forward slashes) are labelled."""
    if labels_path:
        return "labels-file"
    if files and all("/" in f for f in files):
        return "class-folders"
    return "unlabelled"


def assign(
    files: list[str], labels_path: Path | None, unused: list[str] | None = None
) -> tuple[list[int | None], list[str] | None]:
    """Each file's label (``MISSING`` when the labels file lacks it) and the class names; the
    labels file's entries that name none of ``files`` are appended to ``unused``."""
    kind = layout(files, labels_path)
    if kind == "labels-file":
        table, classes = load_labels(labels_path)  # type: ignore[arg-type]
        names = [entry(table, f) for f in files]
        if unused is not None:
            found = set(names)
            unused.extend(name for name in table if name not in found)
        return [MISSING if n is None else table[n] for n in names], classes
    if kind == "class-folders":
        classes = sorted({f.split("/", 1)[0] for f in files})
        index = {c: i for i, c in enumerate(classes)}
        return [index[f.split("/", 1)[0]] for f in files], classes
    return [None] * len(files), None


def entry(table: dict[str, int], relpath: str) -> str | None:
    """The labels file's entry for a file: by relative path, file name, or name without suffix."""
    if relpath in table:  # the common case: no name made
        return relpath
    name = relpath.rsplit("/", 1)[-1]
    for candidate in (name, os.path.splitext(name)[0]):
        if candidate in table:
            return candidate
    return None
