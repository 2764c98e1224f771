"""This process's LMDB environments, shared by its readers, and their :class:`Tree` (packdata's
own lookups in data.mdb)."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from packdata.containers.base import holds_record_arrays, unreadable
from packdata.containers.lmdbcheck import Tree, check_tree
from packdata.errors import DatasetError

# LMDB refuses a second open of the same files in one process (it knows them by device and
# inode, whatever the path: a dataset renamed into place is the same files), so readers share an
# environment per file; an entry made before a fork is closed and replaced in the child, and so
# is one whose file was replaced (a dataset converted again with --overwrite may get the same
# inode number back: its size and modification time tell it apart). Entries for files no
# longer at their path (deleted, replaced) are closed before another environment opens: LMDB
# also refuses files whose device and inode numbers an open environment's deleted files had.
MANIFEST_KEY = b"__manifest__"
RECORDS = "records.npz"  # beside data.mdb: the record arrays (format 2 and later)
_envs: dict[tuple[int, int], tuple[int, tuple[int, int], lmdb.Environment, str, Tree]] = {}


#: the files whose B-tree :func:`check_tree` found sound: (device, inode), (size, mtime)
_checked: set[tuple[tuple[int, int], tuple[int, int]]] = set()


def _close_stale_envs() -> None:
    """Close the environments whose ``data.mdb`` is no longer at their path."""
    for key, (_, _, env, where, _) in list(_envs.items()):
        try:
            st = os.stat(Path(where) / "data.mdb")
            current = (st.st_dev, st.st_ino) == key
        except OSError:
            current = False
        if not current:
            del _envs[key]
            env.close()


def shared_env(path: Path) -> lmdb.Environment:
    """This process's read-only environment for the LMDB at ``path``."""
    return _shared(path)[2]


def shared_tree(path: Path) -> Tree:
    """This process's :class:`Tree` of the LMDB at ``path`` (its keys looked up by packdata)."""
    return _shared(path)[4]


def checked_env(path: Path) -> lmdb.Environment:
    """:func:`shared_env`, once :func:`check_tree` found that no lookup by LMDB leaves the file:
    for datasets read through LMDB's own lookups."""
    _, version, env, _, tree = _shared(path)
    st = os.stat(path / "data.mdb")
    key = ((st.st_dev, st.st_ino), version)
    if key not in _checked:  # once per file version: the result survives fork
        check_tree(path, env.info()["last_pgno"], env.info()["last_txnid"])
        _checked.add(key)
    return env


def _shared(path: Path) -> tuple[int, tuple[int, int], lmdb.Environment, str, Tree]:
    st = os.stat(path / "data.mdb")
    key, pid, version = (st.st_dev, st.st_ino), os.getpid(), (st.st_size, st.st_mtime_ns)
    entry = _envs.pop(key, None)
    if entry is not None and entry[:2] == (pid, version):
        _envs[key] = entry
        return entry
    if entry is not None:
        entry[2].close()
    _close_stale_envs()
    try:
        env = lmdb.open(
            str(path), readonly=True, lock=False, readahead=False, subdir=True, max_readers=1024
        )
    except lmdb.Error as exc:
        raise DatasetError(f"{path}: LMDB cannot be opened ({exc}); the dataset is damaged") from None
    # LMDB maps the file and trusts its page count: reading past the end of a truncated file
    # would kill the process with SIGBUS instead of raising
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if st.st_size < needed:
        env.close()
        raise DatasetError(f"{path}: truncated (data.mdb holds {st.st_size} bytes, its pages need "
                           f"{needed}); the dataset is damaged")
    try:
        tree = Tree(path, env.info()["last_pgno"], env.info()["last_txnid"])
    except DatasetError:
        env.close()
        raise
    _envs[key] = entry = (pid, version, env, str(path), tree)
    return entry


def damaged(path: Path) -> str | None:
    """Why the LMDB at ``path``, a packdata dataset by its files (``records.npz`` holding the
    record arrays), cannot be read; None where nothing says it is one."""
    if not ((path / "data.mdb").is_file() and holds_record_arrays(path / RECORDS)):
        return None
    try:
        raw = shared_tree(path).get(MANIFEST_KEY)
    except DatasetError as exc:
        return str(exc)
    return unreadable(None if raw is None else raw.tobytes(), path)
