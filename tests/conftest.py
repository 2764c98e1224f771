"""Shared fixtures: real CIFAR-10 PNGs (the sample shipped in packdata/demo_data) and their
conversions into every container."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packdata

SAMPLE = Path(packdata.__file__).parent / "demo_data" / "cifar10"
CONTAINERS = {"lmdb": "data.lmdb", "hdf5": "data.h5", "tar": "data-tar"}


def pillow_pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def copy_sample(dst: Path, count: int = 120) -> Path:
    """A flat folder of ``count`` real PNGs (12 per class) plus labels.json."""
    meta = json.loads((SAMPLE / "labels.json").read_text())
    per_class = count // len(meta["classes"])
    names = [n for n in sorted(meta["labels"]) if int(n.rsplit("_", 1)[1][:4]) < per_class]
    dst.mkdir(parents=True)
    for n in names:
        shutil.copy(SAMPLE / n, dst / n)
    labels = {n: meta["labels"][n] for n in names}
    (dst / "labels.json").write_text(json.dumps({"classes": meta["classes"], "labels": labels}))
    return dst


@pytest.fixture(scope="session")
def png_folder(tmp_path_factory) -> Path:
    return copy_sample(tmp_path_factory.mktemp("cifar") / "png")


@pytest.fixture(scope="session")
def packed(tmp_path_factory, png_folder) -> dict[str, Path]:
    """The PNG folder converted into every container (raw pixels)."""
    out = tmp_path_factory.mktemp("packed")
    source = packdata.open_source(png_folder)
    return {
        name: packdata.convert(source, out / target, workers=2, container_options=(
            {"shard_size": "50"} if name == "tar" else None)).path
        for name, target in CONTAINERS.items()
    }


@pytest.fixture(params=list(CONTAINERS))
def container(request) -> str:
    return request.param
