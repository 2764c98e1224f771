"""Photos of mixed sizes resized to one: a per-sample transform against a decode stage.

    python bench/bench_transform.py [--count 300] [--rounds 5] [--batch-size 32]

The input is ``--count`` crops of the two real photographs in tests/fixtures/images, each a
random size with its shorter side 256-500 pixels (what a folder of photos holds), converted with
the defaults (raw pixels, each image at its own size) into HDF5. Each round reads one epoch,
batches of ``--batch-size`` in a shuffled order, every record already checked, through
``packdata.loader(..., feeder=False)`` (reads in this process) made to 224×224 three ways:

- ``decode``: the decode stage ``CenterCrop(224, resize=256)`` (one resampling of each image's
  box, in the decode threads, straight into the batch);
- ``transform``: a per-sample ``transform`` doing the same in torch on each uint8 C×H×W image
  (torchvision's ``v2.Resize(256)`` + ``v2.CenterCrop(224)`` on a tensor: antialiased bilinear
  resize of the whole image, then the crop), the samples stacked after it;
- ``transform, stock DataLoader, 2 workers``: the same transform through
  ``DataLoader(ds, batch_size, shuffle=True, num_workers=2)``.

Rates are images/s, medians of interleaved rounds; ratios are per round against ``decode``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from _shared import command_line, interleaved, parser, ratio_of_rounds, seconds, write_results
from PIL import Image

PHOTOS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "images"


def photo_folder(out: Path, count: int, seed: int = 0) -> Path:
    """``count`` crops of the fixture photographs, upscaled so that the shorter side is
    256-500 pixels, alternately JPEG and PNG, in two class folders."""
    rng = np.random.default_rng(seed)
    photos = {name: Image.open(PHOTOS / f"{name}.jpg").convert("RGB")
              for name in ("chelsea", "coffee")}
    for i in range(count):
        name = ("chelsea", "coffee")[i % 2]
        photo = photos[name]
        w, h = int(rng.integers(100, photo.width)), int(rng.integers(100, photo.height))
        x, y = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
        short = int(rng.integers(256, 501))
        scale = short / min(w, h)
        crop = photo.crop((x, y, x + w, y + h)).resize((round(w * scale), round(h * scale)),
                                                       Image.Resampling.BILINEAR)
        (out / name).mkdir(parents=True, exist_ok=True)
        crop.save(out / name / f"{i:05d}.{('jpg', 'png')[i % 2]}", quality=90)
    return out


class ResizeCenterCrop:
    """torchvision's ``v2.Resize(resize)`` + ``v2.CenterCrop(size)`` on a uint8 C×H×W tensor:
    the shorter side resized to ``resize`` (antialiased bilinear, the long side truncated),
    then the centre ``size``×``size`` box."""

    def __init__(self, size: int = 224, resize: int = 256) -> None:
        self.size, self.resize = size, resize

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        h, w = image.shape[1:]
        if h <= w:
            nh, nw = self.resize, int(self.resize * w / h)
        else:
            nh, nw = int(self.resize * h / w), self.resize
        x = torch.nn.functional.interpolate(image[None], size=(nh, nw), mode="bilinear",
                                            antialias=True, align_corners=False)[0]
        top, left = int(round((nh - self.size) / 2)), int(round((nw - self.size) / 2))
        return x[:, top : top + self.size, left : left + self.size]


def epoch(batches) -> int:
    n = 0
    for images, _ in batches:
        n += len(images)
    return n


def main() -> None:
    p = parser(__doc__, count=300, rounds=5, results="transform.json")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    import packdata
    from packdata.loading.loader import loader

    with tempfile.TemporaryDirectory(prefix="bench-transform-") as tmp:
        folder = photo_folder(Path(tmp) / "photos", args.count)
        path = packdata.convert(packdata.open_source(folder), Path(tmp) / "photos.h5").path
        decoded = packdata.open(path, decode=packdata.CenterCrop(224, resize=256))
        transformed = packdata.open(path, transform=ResizeCenterCrop())
        for ds in (decoded, transformed):  # every record checked once, before timing
            epoch(loader(ds, args.batch_size, feeder=False))
        runs = {
            "decode": lambda: seconds(lambda: epoch(loader(
                decoded, args.batch_size, shuffle=True, feeder=False))),
            "transform": lambda: seconds(lambda: epoch(loader(
                transformed, args.batch_size, shuffle=True, feeder=False))),
            "transform, stock DataLoader, 2 workers": lambda: seconds(lambda: epoch(
                torch.utils.data.DataLoader(transformed, args.batch_size, shuffle=True,
                                            num_workers=2))),
        }
        times = interleaved(args.rounds, runs)
    rates = {k: [args.count / t for t in v] for k, v in times.items()}
    rows = []
    for name, r in rates.items():
        ratio, spread = ratio_of_rounds(r, rates["decode"])
        rows.append({"path": name, "images_per_s": statistics.median(r), "rounds": r,
                     "x_decode": ratio, "x_decode_range": spread})
        print(f"{name:45s} {statistics.median(r):9,.0f} images/s  {ratio:.2f}x decode "
              f"({spread[0]:.2f}-{spread[1]:.2f})")
    doc = {"command": command_line(), "count": args.count, "batch_size": args.batch_size,
           "rounds": args.rounds, "cpus": len(os.sched_getaffinity(0)),
           "load_average": list(os.getloadavg()), "rows": rows}
    if args.json:
        write_results(args.json, doc)


if __name__ == "__main__":
    main()
