"""Point-cloud augmentations: geometry kept where it must be, seeded, on the batch's device."""

from __future__ import annotations

from pathlib import Path

import laspy
import numpy as np
import pytest
import torch

from packdata.augment.points import PointAugment, dropout, jitter, rotate_z, scale

FIXTURES = Path(__file__).parent / "fixtures" / "lidar"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    """Two real trees, centred, 1,000 points each, with intensity as a 4th column."""
    clouds = []
    for f in sorted(FIXTURES.glob("ahn_filtered_*.las")):
        las = laspy.read(f)
        xyz = np.stack([las.x, las.y, las.z], axis=1)[:1000]
        clouds.append(np.c_[xyz - xyz.mean(axis=0), np.asarray(las.intensity[:1000])])
    return torch.tensor(np.stack(clouds), dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_rotation_keeps_z_and_horizontal_distances(batch, device):
    x = batch.to(device)
    out = rotate_z(x, generator=torch.Generator(device).manual_seed(0))
    assert out.device == x.device
    assert torch.equal(out[..., 2:], x[..., 2:])
    assert torch.allclose(out[..., :2].norm(dim=-1), x[..., :2].norm(dim=-1), atol=1e-3)
    assert not torch.allclose(out[..., :2], x[..., :2])


def test_scale_jitter_dropout(batch):
    g = torch.Generator().manual_seed(1)
    s = scale(batch, 0.9, 1.1, generator=g)
    ratio = s[..., :3] / batch[..., :3]
    per_cloud = ratio.nan_to_num(1.0).median(dim=1).values
    assert ((per_cloud >= 0.9) & (per_cloud <= 1.1)).all() and torch.equal(s[..., 3], batch[..., 3])
    j = jitter(batch, sigma=0.01, clip=0.02, generator=g)
    delta = (j - batch)[..., :3].abs()
    assert 0 < delta.max() <= 0.02 + 1e-6 and torch.equal(j[..., 3], batch[..., 3])
    d = dropout(batch, max_ratio=0.5, generator=g)
    dropped = (d != batch).any(dim=-1)
    assert d.shape == batch.shape and dropped.float().mean() < 0.5
    assert torch.equal(d[dropped[:, :, None].expand_as(d)].view(-1, 4),
                       batch[:, :1].expand_as(d)[dropped[:, :, None].expand_as(d)].view(-1, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_pipeline_is_seeded(batch, device):
    x = batch.to(device)
    a, b = PointAugment(seed=3), PointAugment(seed=3)
    assert torch.equal(a(x), b(x))
    assert not torch.equal(PointAugment(seed=3)(x), PointAugment(seed=4)(x))
    assert a(x).shape == x.shape
    with pytest.raises(ValueError, match="B×N×F"):
        a(x[0])
