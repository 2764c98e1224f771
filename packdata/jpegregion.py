"""A crop of a stored JPEG decoded alone, for the decode stages (:mod:`packdata.imagedecode`).

Where packdata's JPEG extension was built (``packdata/_jpeg.c``, against libjpeg-turbo's
headers), a decode stage decodes only the rows and iMCU columns of an image that its crop box
covers, at the same reduced DCT scale it would decode the whole image at, and the pixels in the
box are those of the whole decode, bit for bit (tested). Elsewhere, or for a JPEG the extension
refuses (corrupt data, a colour space it does not convert), the whole image is decoded as before.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

try:
    import packdata._jpeg as _jpeg
except ImportError:  # built without libjpeg's headers: whole images are decoded instead
    _jpeg = None

#: whether crops are decoded alone here
NATIVE = _jpeg is not None
_scratch = threading.local()


def scaled_box(box: np.ndarray, shape: tuple[int, ...], h: int, w: int) -> np.ndarray:
    """``box`` (left, top, right, bottom of an H×W image) in whole pixels of the decoded image
    of ``shape`` (smaller when the JPEG was decoded at a reduced DCT scale)."""
    dh, dw = shape[:2]
    if (dh, dw) == (h, w):
        return box
    scaled = np.round(box * np.array([dw / w, dh / h, dw / w, dh / h]))
    scaled[:2] = np.minimum(scaled[:2], [dw - 1, dh - 1])  # a box at the edge keeps a pixel
    scaled[2:] = np.maximum(scaled[2:], scaled[:2] + 1)
    return np.minimum(scaled, [dw, dh, dw, dh])


def scaled_size(h: int, w: int, scale: int) -> tuple[int, int]:
    """The (H, W) libjpeg decodes an H×W JPEG to at 1/``scale``: rounded up."""
    return -(-h // scale), -(-w // scale)


def decode_crop(data: np.ndarray, hw: tuple[int, int], scale: int, box: np.ndarray,
                grey: bool) -> torch.Tensor | None:
    """The pixels of ``box`` (of the H×W image) of the JPEG ``data`` decoded at 1/``scale``
    (1, 2, 4 or 8) as a 1×C×h×w uint8 tensor: a view of this thread's scratch memory, valid
    until its next call. None where the extension is not built, or for data it refuses or that
    does not end as a whole JPEG does."""
    if _jpeg is None or data[-2:].tobytes() != b"\xff\xd9":
        # without its end marker a file may be cut short below the box, where a decode of the
        # box alone never looks: the whole decode finds (and names) what is missing
        return None
    h, w = hw
    dh, dw = scaled_size(h, w, scale)
    left, top, right, bottom = (int(v) for v in scaled_box(box, (dh, dw), h, w))
    channels = 1 if grey else 3
    rows = bottom - top
    buffer = _buffer(rows * dw * channels)
    try:
        # one column more each side than the box: the edge columns of a region decoded alone
        # differ from the whole decode's (see _jpeg.c)
        x0, width = _jpeg.decode_region(data, scale, max(left - 1, 0), top, min(right + 1, dw),
                                        bottom, grey, buffer)
    except ValueError:
        return None
    pixels = buffer[: rows * width * channels].reshape(rows, width, channels)
    return torch.from_numpy(pixels[:, left - x0 : right - x0]).permute(2, 0, 1).unsqueeze(0)


def _buffer(nbytes: int) -> np.ndarray:
    """This thread's scratch memory, of at least ``nbytes``: allocated once and grown, since a
    new array of a photo's size each image is mapped and zeroed afresh by the OS."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or len(buffer) < nbytes:
        buffer = _scratch.buffer = np.empty(max(nbytes, 1 << 20), np.uint8)
    return buffer
