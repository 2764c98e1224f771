"""What conversion does to an image's values on the way to the stored mode, and what it tells.

By default an image is converted as torchvision's ``ImageFolder`` converts it (Pillow's
``convert("RGB")``): 16-bit grey values above 255 are clipped to 255, an alpha channel (or a
palette's transparency) is dropped, and the EXIF orientation a camera wrote is not applied.
Conversion keeps that choice, so that a dataset holds what a torchvision loader of the same
folder would give, and says it: :func:`changes` names what converting one image changes, the
source counts the images per change (:meth:`packdata.sources.base.Source.note`) and conversion
warns once per change, naming the first files. ``keep_16bit`` stores 16-bit values as uint16
(8-bit images scaled by 257, so that every record holds one scale), ``exif_orientation``
rotates and mirrors each image as its EXIF tag says, as a photo viewer shows it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import numpy as np
from PIL import Image, ImageOps

from packdata.errors import InputWarning, OptionError

#: Pillow modes of one 16-bit (or wider integer) channel: converted to 8 bits, they clip
WIDE = ("I", "I;16", "I;16B", "I;16L", "I;16N")
#: modes that keep an alpha channel
ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")
#: the stored modes ``keep_16bit`` can write (one grey channel, or three)
SIXTEEN_BIT_MODES = ("L", "RGB")
ORIENTATION = 0x0112  # the EXIF tag

_TORCHVISION = "as torchvision's ImageFolder does"


def clipped(mode: str) -> str:
    return (f"16-bit values above 255 clipped by the conversion to {mode} ({_TORCHVISION}; "
            "--keep-16bit stores them)")


def alpha_dropped(mode: str) -> str:
    return (f"alpha (transparency) dropped by the conversion to {mode} ({_TORCHVISION}; "
            "--mode RGBA keeps it)")


NOT_ORIENTED = ("EXIF orientation not applied: stored as the pixels lie in the file, not as a "
                f"photo viewer shows them ({_TORCHVISION}; --exif-orientation applies it)")


def check(mode: str, encoding: str, keep_16bit: bool, exif_orientation: bool) -> None:
    """Refuse options that cannot work together, naming them."""
    if (keep_16bit or exif_orientation) and encoding != "raw":
        raise OptionError("--keep-16bit and --exif-orientation need --encoding raw: 'keep' "
                          "stores the file unchanged")
    if keep_16bit and mode not in SIXTEEN_BIT_MODES:
        raise OptionError(f"--keep-16bit stores modes {' or '.join(SIXTEEN_BIT_MODES)}, not "
                          f"--mode {mode}")


def orientation(im: Image.Image) -> int:
    """The EXIF orientation tag of ``im`` (1, upright, when it has none or it cannot be read)."""
    try:
        return int(im.getexif().get(ORIENTATION, 1))
    except Exception:  # noqa: BLE001 - a damaged EXIF block says nothing about the pixels
        return 1


def changes(im: Image.Image, mode: str, keep_16bit: bool = False,
            exif_orientation: bool = False) -> list[str]:
    """What converting the loaded ``im`` to ``mode`` changes, one phrase per kind (none: [])."""
    said = []
    narrowed = im.mode in WIDE and mode not in (*WIDE, "F") and not keep_16bit
    if narrowed and im.getextrema()[1] > 255:  # values that fit 8 bits lose nothing
        said.append(clipped(mode))
    if mode not in ALPHA and (im.mode in ALPHA or "transparency" in im.info):
        said.append(alpha_dropped(mode))
    if not exif_orientation and orientation(im) not in (0, 1):
        said.append(NOT_ORIENTED)
    return said


def prepared(im: Image.Image, mode: str, keep_16bit: bool = False,
             exif_orientation: bool = False) -> Image.Image:
    """``im`` rotated as its EXIF tag says (with ``exif_orientation``) and in ``mode``; with
    ``keep_16bit``, an image of wide values in Pillow's 32-bit mode "I" instead (resizable, no
    value lost; :func:`array` makes it ``mode``'s channels)."""
    if exif_orientation and orientation(im) not in (0, 1):
        im = ImageOps.exif_transpose(im)
    if keep_16bit and im.mode in WIDE:
        return im if im.mode == "I" else im.convert("I")
    if im.mode == "P" and "transparency" in im.info and mode not in ("P", "RGBA"):
        # through RGBA: the same colours, without Pillow's warning (changes() names the file)
        im = im.convert("RGBA")
    return im if im.mode == mode else im.convert(mode)


def array(im: Image.Image, mode: str, keep_16bit: bool = False) -> np.ndarray:
    """The pixels of a :func:`prepared` image: uint8, or uint16 with ``keep_16bit`` (wide values
    as they are, 8-bit ones times 257), H×W for one channel, H×W×C otherwise."""
    pixels = np.asarray(im)
    if not keep_16bit:
        return pixels
    if im.mode == "I":
        grey = np.clip(pixels, 0, 65535).astype(np.uint16)
        return grey if mode == "L" else np.repeat(grey[:, :, None], len(mode), axis=2)
    return pixels.astype(np.uint16) * 257


@contextlib.contextmanager
def named_warnings(path: object, said: Callable[[str], None] | None = None) -> Iterator[None]:
    """Warnings raised inside (Pillow's, about one file: a decompression bomb, corrupt EXIF
    data) said again naming ``path``, each as one line: passed to ``said`` (conversion counts
    them per message, :meth:`packdata.sources.base.Source.note`), else as an InputWarning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = "Pillow warned: " + " ".join(str(w.message).split())
        if said is not None:
            said(text)
        else:
            warnings.warn(f"{path}: {text}", InputWarning, stacklevel=3)
