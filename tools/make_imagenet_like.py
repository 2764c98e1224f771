"""Make an ImageNet-like folder of JPEGs: class sub-folders, shorter side 256–500 pixels, aspect
3:4 to 3:2 (landscape and portrait), quality 85–95, every file a random crop of a real photograph.

The photographs are the ones scikit-image and scikit-learn ship inside their wheels (licences in
the SOURCE.md written next to the images). Both packages are needed only by this script:

    pip install scikit-image scikit-learn
    python tools/make_imagenet_like.py OUT --count 10000 --classes 100 --seed 0

Deterministic: image ``i`` depends only on ``(seed, i)``, whatever ``--workers`` says.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

# (package, file, licence) — colour photographs only (no drawings, no grey textures)
PHOTOS = [
    ("skimage", "astronaut.png", "NASA, public domain"),
    ("skimage", "chelsea.png", "CC0, Stefan van der Walt"),
    ("skimage", "coffee.png", "CC0, Rachel Michetti"),
    ("skimage", "rocket.jpg", "SpaceX, released into the public domain"),
    ("skimage", "hubble_deep_field.jpg", "NASA/HubbleSite, public domain"),
    ("skimage", "ihc.png", "Center for Microscopy And Molecular Imaging, no known copyright "
     "restrictions"),
    ("skimage", "retina.jpg", "Mikael Häggström, CC0 1.0 (Wikimedia Commons)"),
    ("sklearn", "china.jpg", "danielbuechele on Flickr, CC BY 2.0"),
    ("sklearn", "flower.jpg", "vultilion on Flickr, CC BY 2.0"),
]


def photo_paths() -> list[Path]:
    import skimage
    import sklearn.datasets

    roots = {"skimage": Path(skimage.__file__).parent / "data",
             "sklearn": Path(sklearn.datasets.__file__).parent / "images"}
    return [roots[package] / name for package, name, _ in PHOTOS]


_photos: list[Image.Image] = []


def _load_photos() -> list[Image.Image]:
    if not _photos:
        for path in photo_paths():
            with Image.open(path) as im:
                _photos.append(im.convert("RGB"))
    return _photos


def make_one(seed: int, i: int) -> tuple[Image.Image, int]:
    """Image ``i``: a random crop of a random photograph, and its JPEG quality."""
    rng = np.random.default_rng([seed, i])
    photos = _load_photos()
    photo = photos[int(rng.integers(len(photos)))]
    short = int(rng.integers(256, 501))
    long = int(round(short * rng.uniform(1.0, 1.5)))
    w, h = (long, short) if rng.random() < 0.75 else (short, long)  # most photos are landscape
    # scale the photograph so the crop fits, by a random extra factor (more or less zoomed)
    factor = max(w / photo.width, h / photo.height) * rng.uniform(1.0, 1.8)
    bw, bh = min(photo.width, w / factor), min(photo.height, h / factor)
    x = rng.uniform(0, photo.width - bw)
    y = rng.uniform(0, photo.height - bh)
    box = (x, y, x + bw, y + bh)
    image = photo.resize((w, h), Image.Resampling.BICUBIC, box=box)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image, int(rng.integers(85, 96))


def _write(args: tuple[Path, int, int, int, int]) -> int:
    out, seed, start, stop, classes = args
    total = 0
    for i in range(start, stop):
        image, quality = make_one(seed, i)
        target = out / f"class_{i % classes:03d}" / f"img_{i:06d}.jpg"
        image.save(target, quality=quality)
        total += target.stat().st_size
    return total


def make(out: Path, count: int = 10_000, classes: int = 100, seed: int = 0,
         workers: int | None = None) -> dict:
    """Write ``count`` JPEGs into ``out``/class_NNN/; returns a summary (also in SOURCE.md)."""
    out.mkdir(parents=True, exist_ok=False)
    for c in range(classes):
        (out / f"class_{c:03d}").mkdir()
    workers = workers or os.cpu_count() or 1
    step = 250
    tasks = [(out, seed, s, min(s + step, count), classes) for s in range(0, count, step)]
    with ProcessPoolExecutor(workers) as pool:
        total = sum(pool.map(_write, tasks))
    summary = {"count": count, "classes": classes, "seed": seed, "bytes": total}
    shipped = {"skimage": "scikit-image", "sklearn": "scikit-learn"}
    licences = "\n".join(f"- `{name}` (shipped with {shipped[pkg]}): {lic}"
                         for pkg, name, lic in PHOTOS)
    (out / "SOURCE.md").write_text(
        "# ImageNet-like JPEGs\n\nMade by `tools/make_imagenet_like.py` "
        f"(`--count {count} --classes {classes} --seed {seed}`): random crops (shorter side "
        "256–500, aspect 3:4 to 3:2, random zoom and mirror) of these photographs, saved as JPEG "
        f"at quality 85–95. Class folders are arbitrary labels.\n\n{licences}\n\n"
        f"Summary: `{json.dumps(summary)}`\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(make(args.out, args.count, args.classes, args.seed, args.workers)))


if __name__ == "__main__":
    main()
