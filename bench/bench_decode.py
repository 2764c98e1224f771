"""Image decoding speed with Pillow and with pillow-simd, measured in the same run.

    python bench/bench_decode.py --python .venv/bin/python --python /path/to/simd-venv/bin/python

Each interpreter (one with Pillow, one with pillow-simd installed in place of Pillow) decodes the
same real CIFAR-10 files: 32×32 PNG, 32×32 JPEG, and 512×512 JPEGs (the CIFAR JPEGs upscaled
once and re-encoded, for a conversion-sized workload) decoded and resized to 224×224. Rates are
images/s on one core; the table gives each interpreter's rate relative to the first.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

from _shared import parser, write_results

DATA = Path("../shared/data/cifar10")


def measure(data: Path, count: int) -> dict[str, float]:
    import numpy as np
    from PIL import Image

    pngs = [p.read_bytes() for p in sorted((data / "test-png").glob("*.png"))[:count]]
    jpgs = [p.read_bytes() for p in sorted((data / "test-jpg").rglob("*.jpg"))[:count]]
    big = []
    for raw in jpgs[: max(1, count // 10)]:
        buf = io.BytesIO()
        Image.open(io.BytesIO(raw)).convert("RGB").resize((512, 512), Image.BICUBIC).save(
            buf, "JPEG", quality=90)
        big.append(buf.getvalue())

    def rate(blobs, work) -> float:
        best = 0.0
        for _ in range(3):
            start = time.perf_counter()
            for b in blobs:
                work(b)
            best = max(best, len(blobs) / (time.perf_counter() - start))
        return best

    def decode(b):
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(im.convert("RGB"))

    def decode_resize(b):
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(im.convert("RGB").resize((224, 224), Image.BILINEAR))

    import PIL

    return {
        "pillow": PIL.__version__,
        "png_32": rate(pngs, decode),
        "jpeg_32": rate(jpgs, decode),
        "jpeg_512_resize_224": rate(big, decode_resize),
    }


def main() -> None:
    p = parser(__doc__, data=DATA, count=2000, results="decode.json")
    p.add_argument("--python", action="append", default=None,
                   help="an interpreter to measure (repeat); default: this one")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.data, args.count)))
        return
    results = []
    for python in args.python or [sys.executable]:
        out = subprocess.run([python, __file__, "--child", "--data", str(args.data),
                              "--count", str(args.count)], check=True, capture_output=True,
                             text=True).stdout
        results.append(json.loads(out))
    write_results(args.json, results)
    keys = ["png_32", "jpeg_32", "jpeg_512_resize_224"]
    print("| Pillow | " + " | ".join(f"{k} img/s (× first)" for k in keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for r in results:
        cells = [f"{r[k]:,.0f} ({r[k] / results[0][k]:.2f})" for k in keys]
        print(f"| {r['pillow']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
