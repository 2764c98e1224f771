"""Tar members in webdataset's naming, and the bytes of their headers.

A record's fields are consecutive members named ``KEY.EXT``: dots in the key become ``_``
(:func:`member_key`: webdataset splits a member name at its first dot), an integer scalar
``label`` is ``KEY.cls`` (decimal text), encoded image bytes ``KEY.png``/``KEY.jpg``, every other
field ``KEY.<field>.npy``.
"""

from __future__ import annotations

import functools
import io
import tarfile

import numpy as np

from packdata.manifest import Field


def member_key(key: str) -> str:
    """The stem of a record's member names: its key with dots made ``_``."""
    return key.replace(".", "_")


def image_suffix(head: bytes) -> str:
    """The extension encoded image bytes get, from their first 4 bytes: png, jpg, else img."""
    return "png" if head.startswith(b"\x89PNG") else "jpg" if head[:2] == b"\xff\xd8" else "img"


def member_suffix(name: str, field: Field, value: np.ndarray) -> str:
    """The webdataset extension a field's member gets."""
    if field.codec == "image":
        return image_suffix(value[:4].tobytes())
    if name == "label" and field.shape == () and field.np_dtype.kind in "iu":
        return "cls"
    return f"{name}.npy"


@functools.lru_cache(maxsize=256)
def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header for a C-order array (cached: fixed fields share one)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


# The constant parts of a POSIX ustar header for a regular file (mode 0644, owner 0, time 0)
_MODE_OWNER = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
_MTIME = b"00000000000\x00"
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(247)  # type, link name, magic, the rest
_CONSTANT_SUM = sum(_MODE_OWNER) + sum(_MTIME) + sum(b" " * 8) + sum(_TAIL)


def ustar_header(name: str, size: int) -> bytes:
    """A POSIX ustar header for a regular file (mode 0644, owner 0, time 0): assembled from
    constant parts, since building a TarInfo per member costs more than the rest of a
    conversion's main loop."""
    encoded = name.encode()
    if len(encoded) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size = size
        return info.tobuf(tarfile.PAX_FORMAT)
    size_field = b"%011o\x00" % size
    checksum = _CONSTANT_SUM + sum(encoded) + sum(size_field)  # the checksum field counts as spaces
    return b"".join((encoded, bytes(100 - len(encoded)), _MODE_OWNER, size_field, _MTIME,
                     b"%06o\x00 " % checksum, _TAIL))

