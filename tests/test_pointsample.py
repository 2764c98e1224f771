"""Presampling on real clouds: exact FPS (fast path equals the textbook loop), voxel, random."""

from __future__ import annotations

from pathlib import Path

import laspy
import numpy as np
import pytest

import packdata.errors
from packdata.prep.pointsample import (
    SampleSpec,
    coverage_radius,
    farthest_point_sample,
    farthest_point_sample_reference,
    presample,
    voxel_sample,
)

FIXTURES = Path(__file__).parent / "fixtures" / "lidar"


@pytest.fixture(scope="module")
def cloud() -> np.ndarray:
    """A real airborne tree scan (11,059 points, LAZ), float64 coordinates in metres."""
    las = laspy.read(FIXTURES / "ahn_surf_ahn_surf_121913_487434.laz")
    return np.stack([las.x, las.y, las.z], axis=1)


def assert_farthest_at_every_step(xyz: np.ndarray, chosen: np.ndarray) -> None:
    """Each choice after the first is a point at the largest distance (float32, as both
    implementations compute it) from the points chosen before it: FPS, whichever tie it took."""
    pts = (xyz - xyz.mean(axis=0)).astype(np.float32)
    mind = np.full(len(pts), np.inf, dtype=np.float32)
    for j, i in enumerate(chosen):
        assert j == 0 or mind[i] == mind.max(), f"step {j}: {mind[i]} < {mind.max()}"
        np.minimum(mind, ((pts - pts[i]) ** 2).sum(axis=1), out=mind)


@pytest.mark.parametrize("k", [64, 1000])
def test_fast_fps_is_exact_fps(cloud, k):
    fast = farthest_point_sample(cloud, k, start=17, per_cell=32)
    slow = farthest_point_sample_reference(cloud, k, start=17)
    # the same float32 arithmetic and, on this cloud, no exact tie for farthest: the same choices
    assert np.array_equal(fast, slow)
    assert_farthest_at_every_step(cloud, fast)
    assert coverage_radius(cloud, fast) == pytest.approx(coverage_radius(cloud, slow), rel=1e-5)
    assert len(np.unique(fast)) == k


def test_fps_on_exact_ties_takes_a_farthest_point_every_step():
    """A 12×12×12 lattice: at most steps many points tie exactly for farthest. The fast path
    visits points in grid-cell order and the reference in index order, so they may break a tie
    differently (and diverge from there); both must take a farthest point every time."""
    axis = np.arange(12, dtype=np.float64)
    lattice = np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3)
    fast = farthest_point_sample(lattice, 200, start=5, per_cell=16)
    assert len(np.unique(fast)) == 200
    assert_farthest_at_every_step(lattice, fast)
    assert_farthest_at_every_step(lattice, farthest_point_sample_reference(lattice, 200, start=5))


def test_fps_covers_better_than_random_and_voxel_between(cloud):
    rng = np.random.default_rng(0)
    k = 512
    fps = coverage_radius(cloud, farthest_point_sample(cloud, k))
    rand = coverage_radius(cloud, rng.choice(len(cloud), k, replace=False))
    vox = coverage_radius(cloud, voxel_sample(cloud, k, rng))
    assert fps < vox < rand


def test_voxel_sample_exactly_k_one_per_voxel(cloud):
    rng = np.random.default_rng(1)
    for k in (100, 3000, 11000):
        chosen = voxel_sample(cloud, k, rng)
        assert len(chosen) == k and len(np.unique(chosen)) == k
    coarse = voxel_sample(cloud, 50, rng, voxel_size=1.0)  # many more voxels than 50
    cells = np.floor((cloud[coarse] - cloud.min(axis=0)) / 1.0)
    assert len(np.unique(cells, axis=0)) == 50  # at most one point per voxel kept


@pytest.mark.parametrize("method", ["random", "fps", "voxel"])
def test_presample_deterministic_and_variants_differ(cloud, method):
    spec = SampleSpec(points=256, method=method, variants=3, seed=5)
    a = presample(cloud, spec, np.random.default_rng(5)).indices
    b = presample(cloud, spec, np.random.default_rng(5)).indices
    assert a.shape == (3, 256) and np.array_equal(a, b)
    assert all(set(a[i]) != set(a[j]) for i in range(3) for j in range(i))


def test_presample_fewer_points(cloud):
    small = cloud[:100]
    rep = presample(small, SampleSpec(points=256, fewer="replace"), np.random.default_rng(0))
    assert rep.replaced and rep.mask is None and set(rep.indices[0]) == set(range(100))
    pad = presample(small, SampleSpec(points=256, fewer="pad"), np.random.default_rng(0))
    assert pad.padded and pad.mask.sum() == 100 and set(pad.indices[0][pad.mask[0]]) == set(range(100))


def test_spec_validation():
    with pytest.raises(ValueError, match="sampling 'grid'"):
        SampleSpec(method="grid")
    with pytest.raises(ValueError, match="needs --sampling voxel"):
        SampleSpec(method="fps", voxel_size=0.5)
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="finite and > 0"):
            SampleSpec(method="voxel", voxel_size=bad)
    with pytest.raises(ValueError, match="must be >= 1"):
        SampleSpec(points=0)


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_a_sampling_seed_that_is_not_a_count_is_refused_by_name_not_blamed_on_a_file(seed):
    # numpy's generator refused -1 at the first cloud, reported as that file's error
    with pytest.raises(packdata.errors.ArgumentError, match=f"seed must be an integer ≥ 0, got {seed!r}"):
        SampleSpec(points=256, seed=seed)
