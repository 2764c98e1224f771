"""Batched point-cloud augmentations: plain torch ops on the batch's own device.

Each function takes a B×N×F batch whose first three columns are x, y, z (z up) and a
``torch.Generator`` on the same device (or None for torch's default), and returns a new batch;
other columns (intensity, rgb…) pass through. :class:`PointAugment` chains them with one seeded
generator per device, for ``PackedDataset(batch_transform=...)`` or a training loop on the GPU.

>>> aug = PointAugment(seed=0)
>>> aug(torch.zeros(2, 16, 4)).shape
torch.Size([2, 16, 4])
"""

from __future__ import annotations

import math

import torch

from packdata.augment.base import DeviceGenerators
from packdata.errors import ArgumentError


def _uniform(shape: tuple[int, ...], low: float, high: float, like: torch.Tensor,
             generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(shape, device=like.device, dtype=torch.float32, generator=generator)
    return (low + (high - low) * u).to(like.dtype)


def rotate_z(points: torch.Tensor, max_angle: float = 2 * math.pi,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Rotate each cloud about the up (z) axis by an angle uniform in [-max_angle/2, max_angle/2]
    (a full turn by default); normals in columns named nx, ny, nz are not handled."""
    angle = _uniform((points.shape[0],), -max_angle / 2, max_angle / 2, points, generator)
    c, s = torch.cos(angle), torch.sin(angle)
    out = points.clone()
    x, y = points[..., 0], points[..., 1]
    out[..., 0] = c[:, None] * x - s[:, None] * y
    out[..., 1] = s[:, None] * x + c[:, None] * y
    return out


def scale(points: torch.Tensor, low: float = 0.8, high: float = 1.25,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """Scale x, y and z of each cloud by independent factors uniform in [low, high]."""
    factors = _uniform((points.shape[0], 1, 3), low, high, points, generator)
    out = points.clone()
    out[..., :3] *= factors
    return out


def jitter(points: torch.Tensor, sigma: float = 0.01, clip: float = 0.05,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Add Gaussian noise (std ``sigma``, clipped to ±``clip``) to every coordinate."""
    noise = torch.randn(points[..., :3].shape, device=points.device, dtype=torch.float32,
                        generator=generator)
    out = points.clone()
    out[..., :3] += (sigma * noise).clamp_(-clip, clip).to(points.dtype)
    return out


def dropout(points: torch.Tensor, max_ratio: float = 0.875,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Drop a random fraction (uniform in [0, max_ratio]) of each cloud's points, replacing them
    with the cloud's first point so the shape stays N (as in PointNet++)."""
    b, n = points.shape[:2]
    ratio = _uniform((b, 1), 0.0, max_ratio, points, generator).float()
    drop = torch.rand((b, n), device=points.device, generator=generator) < ratio
    return torch.where(drop[..., None], points[:, :1], points)


class PointAugment:
    """Random rotation about z, anisotropic scaling, jitter and point dropout, in that order;
    pass None to skip a step. Deterministic for a seed, on each device separately."""

    def __init__(self, rotate: float | None = 2 * math.pi,
                 scale_range: tuple[float, float] | None = (0.8, 1.25),
                 jitter_sigma: float | None = 0.01, dropout_ratio: float | None = 0.875,
                 seed: int | None = None) -> None:
        self.rotate, self.scale_range = rotate, scale_range
        self.jitter_sigma, self.dropout_ratio = jitter_sigma, dropout_ratio
        self.seed = seed
        self._generators = DeviceGenerators(seed)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """This augmenter's generator on ``device`` (None, i.e. torch's default, if unseeded)."""
        return self._generators(device)

    def __call__(self, points: torch.Tensor) -> torch.Tensor:
        if points.ndim != 3 or points.shape[-1] < 3:
            raise ArgumentError(f"expected a B×N×F batch with F ≥ 3, got {list(points.shape)}")
        g = self.generator(points.device)
        if self.rotate:
            points = rotate_z(points, self.rotate, generator=g)
        if self.scale_range:
            points = scale(points, *self.scale_range, generator=g)
        if self.jitter_sigma:
            points = jitter(points, self.jitter_sigma, clip=5 * self.jitter_sigma, generator=g)
        if self.dropout_ratio:
            points = dropout(points, self.dropout_ratio, generator=g)
        return points
