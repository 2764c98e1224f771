"""Rebuild tests/fixtures/ from the project's shared real-data folder, with SOURCE notes.

    python tools/make_fixtures.py [DATA] [--out tests/fixtures]

DATA (default ``../shared/data``, relative to the repository root) holds ``lidar/`` (``trees/``,
``laspy-samples/``), ``text/peps`` and ``tokenizer/gpt2``, each with its SOURCE.md. Rebuilt:

- ``lidar/``: six real clouds copied unchanged (two AHN4 trees, LAS and LAZ; laspy's simple.*);
- ``lidar-pieces/``: labelled pieces for the LiDAR example, cut from every cloud under DATA by
  :func:`tile_clouds` (class sub-folders by origin);
- ``text/peps``: 21 PEPs (every 37th by size from the largest, plus the shortest) and
  ``text/gpt2/tokenizer.json.gz`` (gzip -9 of the shared tokenizer.json).

The SOURCE.md files are written from the notes in this script, which follow the shared ones.
The CIFAR-10 images the tests use ship with the package (``packdata/demo_data/cifar10``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"

LIDAR_FILES = [
    "trees/ahn_filtered_tree_121913_487434.las", "trees/ahn_filtered_tree_121922_487459.las",
    "trees/ahn_surf_ahn_surf_121913_487434.laz", "trees/ahn_surf_ahn_surf_121922_487459.laz",
    "laspy-samples/simple.las", "laspy-samples/simple.laz",
]

#: class of a piece ← glob patterns of its source clouds under DATA/lidar
LIDAR_CLASSES = {
    "airborne_tree": ("trees/ahn_filtered_tree_*", "trees/ahn_surf_*"),
    "mobile_stem": ("trees/sonarski_stem_*",),
    "survey": ("laspy-samples/*.las", "laspy-samples/*.laz"),
}

LIDAR_ORIGINS = """\
- trees/: single trees from the public GitHub repository Amsterdam-AI-Team/PointCloud_Tree_Modelling,
  commit 0f439f8768225e9e1ff750c4b81e9db0b0226034, folder `dataset/` (files renamed SUBFOLDER_NAME):
  `ahn_filtered_tree_*.las` (AHN4, Dutch national airborne LiDAR, 2020, LAS 1.2),
  `ahn_surf_*.laz` (the same trees, LAZ 1.4 point format 8), `sonarski_stem_*.las` (stems from
  mobile laser scanning, Sonarski 2022). GPL-3.0 for the repository's code; the sample data is
  published there for reuse in tree modelling. Test use only.
- laspy-samples/: the public GitHub repository laspy/laspy, commit
  fbc5b375f9dad6bae499a81ca436bee361ecf047, folder `tests/data/` (BSD-2-Clause, LICENSE.txt of
  that repository).
"""


def tile_clouds(src: Path, dst: Path, *, max_pieces: int, max_points: int, min_points: int = 64,
                seed: int = 0) -> dict[str, int]:
    """Cut every LAS/LAZ cloud under ``src`` (the shared ``lidar/`` folder) into up to
    ``max_pieces`` slabs along x (each ≥ ``min_points`` points), thin each slab at random to at
    most ``max_points`` points, and write them as LAS files under ``dst/CLASS/`` (classes by
    origin, :data:`LIDAR_CLASSES`). Returns the number of pieces per class."""
    import laspy

    if not any(src.glob(pattern) for patterns in LIDAR_CLASSES.values() for pattern in patterns):
        raise FileNotFoundError(f"{src}: none of the LiDAR clouds the pieces are cut from "
                                "(trees/, laspy-samples/)")
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for label, patterns in LIDAR_CLASSES.items():
        files = sorted({f for pattern in patterns for f in src.glob(pattern)})
        (dst / label).mkdir(parents=True, exist_ok=True)
        for path in files:
            las = laspy.read(path)
            n = len(las.points)
            pieces = max(1, min(max_pieces, n // min_points))
            order = np.argsort(np.asarray(las.x), kind="stable")
            for j, chunk in enumerate(np.array_split(order, pieces)):
                if len(chunk) > max_points:
                    chunk = np.sort(rng.choice(chunk, max_points, replace=False))
                piece = laspy.LasData(las.header)
                piece.points = las.points[chunk].copy()
                piece.write(dst / label / f"{path.stem}_{j:02d}.las")
                counts[label] = counts.get(label, 0) + 1
    return counts


def build_lidar(data: Path, out: Path) -> None:
    target = out / "lidar"
    target.mkdir(parents=True, exist_ok=True)
    for name in LIDAR_FILES:
        shutil.copyfile(data / "lidar" / name, target / Path(name).name)
    (target / "SOURCE.md").write_text(
        "# Real LiDAR test clouds\n\nCopied unchanged from the project's shared LiDAR sample "
        "(`../shared/data/lidar`, see its SOURCE.md) by `tools/make_fixtures.py`: "
        + ", ".join(f"`{Path(n).name}`" for n in LIDAR_FILES) + ".\n\n" + LIDAR_ORIGINS
        + "\nRead with laspy 2.7 + lazrs (LAZ needs the lazrs backend: "
          "`pip install \"packdata[lidar]\"`).\n")


def build_lidar_pieces(data: Path, out: Path) -> None:
    target = out / "lidar-pieces"
    if target.exists():
        shutil.rmtree(target)
    counts = tile_clouds(data / "lidar", target, max_pieces=2, max_points=300)
    listing = ", ".join(f"{label} {n}" for label, n in counts.items())
    (target / "SOURCE.md").write_text(
        "# Labelled LiDAR pieces (for the LiDAR example's test)\n\n"
        "Cut by `tools/make_fixtures.py` (`tile_clouds(max_pieces=2, max_points=300, seed=0)`) "
        "from every LAS/LAZ cloud of the shared LiDAR sample: each cloud is split into up to 2 "
        "slabs along x, each slab thinned at random to at most 300 points and written as LAS "
        "(same header, point format and scales). Class = origin of the cloud: "
        f"{listing} pieces.\n\n" + LIDAR_ORIGINS)


def build_text(data: Path, out: Path) -> None:
    peps = sorted((data / "text" / "peps").glob("*.txt"), key=lambda p: (-p.stat().st_size, p.name))
    chosen = peps[::37] + [peps[-1]]
    target = out / "text"
    if (target / "peps").exists():
        shutil.rmtree(target / "peps")
    (target / "peps").mkdir(parents=True)
    for path in chosen:
        shutil.copyfile(path, target / "peps" / path.name)
    raw = (data / "tokenizer" / "gpt2" / "tokenizer.json").read_bytes()
    (target / "gpt2").mkdir(exist_ok=True)
    with gzip.GzipFile(target / "gpt2" / "tokenizer.json.gz", "wb", compresslevel=9, mtime=0) as f:
        f.write(raw)
    (target / "SOURCE.md").write_text(f"""# Text test fixtures

## peps/ — {len(chosen)} Python Enhancement Proposals
- From: the public GitHub repository python/peps, commit ba4deeb7969588d937da609008d05bb83a47b1ab,
  files `peps/pep-NNNN.rst`, saved unchanged as `pep-NNNN.txt` (a slice of the 736 PEPs the project's
  benchmarks use: every 37th by size, from {chosen[0].name} ({chosen[0].stat().st_size:,} bytes)
  down, plus the shortest, {chosen[-1].name} at {chosen[-1].stat().st_size} bytes), chosen by
  `tools/make_fixtures.py`.
- License: each PEP states it is placed in the public domain or under CC0-1.0-Universal.

## gpt2/tokenizer.json.gz — the GPT-2 byte-level BPE tokenizer
- From: the public GitHub repository itsnsreehari/KV260-Accelerated-Platform, commit
  feef3a3cd494e552ed184be2b2d247475817a4c5, file `gpt2/tokenizer.json`, a copy of the GPT-2
  tokenizer published by OpenAI (modified MIT license) as redistributed on model hubs; the
  repository itself is MIT.
- Stored gzip-compressed (`gzip -9`); the tests decompress it into a temporary folder. SHA-256 of
  the uncompressed file: {hashlib.sha256(raw).hexdigest()}.
- Vocabulary 50,257, `<|endoftext|>` = 50256. The file carries a truncation setting (max_length 50)
  that packdata must switch off; a test checks it does.
- The tiktoken tests build a `.tiktoken` ranks file from this file's vocabulary (GPT-2's byte-to-
  unicode mapping reversed), offline.
""")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    p.add_argument("--only", choices=("lidar", "lidar-pieces", "text"), action="append")
    args = p.parse_args(argv)
    steps = {"lidar": build_lidar, "lidar-pieces": build_lidar_pieces, "text": build_text}
    for name in args.only or steps:
        steps[name](args.data, args.out)
        print(f"rebuilt {args.out / name}")


if __name__ == "__main__":
    main()
