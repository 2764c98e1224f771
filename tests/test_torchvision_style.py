"""A torchvision-style training script runs unchanged on photos of mixed sizes in every
container: a per-sample resizing ``transform`` (``Resize`` + ``CenterCrop`` + to float, as
torchvision's v2 transforms run them on uint8 tensors, written in torch: torchvision does not
install beside the CPU torch) and a stock ``DataLoader`` with workers. Every path (``ds[[...]]``,
a stock DataLoader with 0 or 2 workers, ``packdata.loader``) serves what ``ds[i]`` serves: the
transform of each image as stored. Real photographs (tests/fixtures/images), 14 crops of 14
sizes, converted with the default options."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import packdata

CONTAINERS = {"lmdb": "p.lmdb", "hdf5": "p.h5", "tar": "p-tar"}


class Resize:
    """v2.Resize(size) on a uint8 C×H×W tensor: the shorter side to ``size`` (aspect kept, the
    long side truncated), antialiased bilinear."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1:]
        size = (self.size, int(self.size * w / h)) if h <= w else (int(self.size * h / w), self.size)
        return nn.functional.interpolate(x[None], size=size, mode="bilinear", antialias=True)[0]


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1:]
        top, left = round((h - self.size) / 2), round((w - self.size) / 2)
        return x[:, top : top + self.size, left : left + self.size]


class Compose:
    def __init__(self, steps: list) -> None:
        self.steps = steps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x


def to_float(x: torch.Tensor) -> torch.Tensor:
    """v2.ToDtype(torch.float32, scale=True)."""
    return x.float() / 255


TRANSFORM = Compose([Resize(40), CenterCrop(32), to_float])


def train_one_epoch(ds) -> int:
    """The tutorial's loop: a stock shuffled DataLoader with 2 workers, a small CNN, SGD."""
    torch.manual_seed(0)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = 0
    for images, labels in loader:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
        seen += len(images)
    return seen


@pytest.mark.parametrize("container", list(CONTAINERS))
def test_a_torchvision_style_script_runs_unchanged_on_photos_of_mixed_sizes(
        tmp_path, photo_folder, container, one_thread):
    options = {"shard_size": "5"} if container == "tar" else None
    path = packdata.convert(packdata.open_source(photo_folder), tmp_path / CONTAINERS[container],
                            workers=1, container_options=options).path
    stored = packdata.open(path)
    assert stored.manifest.source["mixed_sizes"]  # the defaults: each photo at its own size
    ds = packdata.open(path, transform=TRANSFORM)
    n = len(ds)
    expected = torch.stack([TRANSFORM(stored[i][0]) for i in range(n)])
    labels = torch.tensor([stored[i][1] for i in range(n)])
    assert len({tuple(stored[i][0].shape) for i in range(n)}) == n
    served = {
        "ds[i]": (torch.stack([ds[i][0] for i in range(n)]), torch.tensor([ds[i][1] for i in range(n)])),
        "ds[[...]]": ds[list(range(n))],
        **{f"DataLoader, {w} workers": _joined(DataLoader(ds, batch_size=5, num_workers=w))
           for w in (0, 2)},
        "packdata.loader": _joined(packdata.loader(ds, batch_size=5)),
        "packdata.loader, in process": _joined(packdata.loader(ds, batch_size=5, feeder=False)),
    }
    for name, (images, got) in served.items():
        assert images.dtype == torch.float32 and images.shape == (n, 3, 32, 32), name
        assert torch.equal(images, expected) and torch.equal(got, labels), name
    assert train_one_epoch(ds) == n


def _joined(batches) -> tuple[torch.Tensor, torch.Tensor]:
    parts = list(batches)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def test_a_transform_that_leaves_several_sizes_is_named_with_the_fix(tmp_path, photo_folder):
    path = packdata.convert(packdata.open_source(photo_folder), tmp_path / "p.h5", workers=1).path
    ds = packdata.open(path, transform=to_float)  # no resize: the photos keep their sizes
    assert ds[0][0].dtype == torch.float32  # one sample is fine
    with pytest.raises(packdata.DatasetError, match=r"the transform left this batch's images in "
                       r"3 shapes .*v2.Resize\(256\).*decode=packdata.CenterCrop"):
        ds[[0, 1, 2]]
