"""Point-cloud presampling: reduce a cloud to exactly N points, K times, deterministically.

Methods (all return indices into the input, so stored points are exact input points):

- ``random``: a uniform subset without replacement;
- ``fps``: farthest-point sampling, exact (the same choice as the textbook O(N·k) loop), made
  fast by pruning: points live in grid cells, and a new sample only updates cells whose box lies
  closer to it than the cell's current largest distance-to-nearest-sample;
- ``voxel``: one random point per occupied voxel of edge ``voxel_size`` (chosen so that about N
  voxels are occupied when not given), then brought to exactly N by a random subset, or by
  adding random other points.

Clouds with fewer than N points are completed with replacement (every point at least once) or
padded (``fewer="pad"``, with a mask). Non-finite coordinates are dropped before sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from packdata.errors import ArgumentError, OptionError
from packdata.units import count_argument

METHODS = ("random", "fps", "voxel")
FEWER = ("replace", "pad")
NORMALIZE = ("none", "center", "unit_sphere")
DTYPES = ("float32", "float16", "float64")


@dataclass(frozen=True)
class SampleSpec:
    """How to presample every cloud of a dataset (recorded in the manifest)."""

    points: int = 4096
    method: str = "fps"
    variants: int = 1
    seed: int = 0
    voxel_size: float | None = None
    fewer: str = "replace"
    normalize: str = "none"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name, value, allowed in (("sampling", self.method, METHODS), ("fewer", self.fewer, FEWER),
                                     ("normalize", self.normalize, NORMALIZE),
                                     ("dtype", self.dtype, DTYPES)):
            if value not in allowed:
                raise OptionError(f"{name} '{value}': expected one of {', '.join(allowed)}")
        if self.points < 1 or self.variants < 1:
            raise OptionError(f"points ({self.points}) and variants ({self.variants}) must be >= 1")
        count_argument("seed", self.seed)  # numpy's refused it at the first cloud, as the file's fault
        if self.voxel_size is not None and (self.method != "voxel" or not 0 < self.voxel_size < math.inf):
            raise OptionError("--voxel-size must be finite and > 0, and needs --sampling voxel")


@dataclass
class Presampled:
    """The K×N indices chosen from one cloud, plus what had to be done to get them."""

    indices: np.ndarray  # (K, N) int64 into the finite points
    mask: np.ndarray | None  # (K, N) bool, with fewer="pad": False marks padding rows
    dropped: int = 0  # non-finite points removed
    replaced: bool = False  # fewer than N points, completed with replacement
    padded: bool = False
    extra: dict = field(default_factory=dict)


def finite_rows(xyz: np.ndarray) -> np.ndarray:
    """Boolean mask of the points whose three coordinates are finite."""
    return np.isfinite(xyz).all(axis=1)


def presample(xyz: np.ndarray, spec: SampleSpec, rng: np.random.Generator) -> Presampled:
    """Choose ``spec.variants`` sets of exactly ``spec.points`` indices into finite ``xyz``.

    ``xyz`` must already be free of non-finite rows (see :func:`finite_rows`).
    """
    n, k = len(xyz), spec.points
    rows = np.empty((spec.variants, k), dtype=np.int64)
    mask = np.ones((spec.variants, k), dtype=bool) if spec.fewer == "pad" else None
    for v in range(spec.variants):
        if n >= k:
            rows[v] = sample(xyz, k, spec.method, rng, voxel_size=spec.voxel_size)
        elif spec.fewer == "replace":
            extra = rng.choice(n, k - n, replace=True)
            rows[v] = rng.permutation(np.concatenate([np.arange(n), extra]))
        else:
            rows[v, :n] = rng.permutation(n)
            rows[v, n:] = 0  # padding rows repeat point 0; callers zero them
            mask[v, n:] = False  # type: ignore[index]
    return Presampled(rows, mask, replaced=n < k and spec.fewer == "replace",
                      padded=n < k and spec.fewer == "pad")


def sample(xyz: np.ndarray, k: int, method: str, rng: np.random.Generator,
           voxel_size: float | None = None) -> np.ndarray:
    """``k`` distinct indices into ``xyz`` (``len(xyz) >= k``) chosen by ``method``."""
    if method == "random":
        return np.sort(rng.choice(len(xyz), k, replace=False))
    if method == "fps":
        return farthest_point_sample(xyz, k, start=int(rng.integers(len(xyz))))
    if method == "voxel":
        return voxel_sample(xyz, k, rng, voxel_size)
    raise OptionError(f"sampling '{method}': expected one of {', '.join(METHODS)}")


def _grid_keys(xyz: np.ndarray, edge: float) -> np.ndarray:
    q = np.floor((xyz - xyz.min(axis=0)) / edge).astype(np.int64)
    dims = q.max(axis=0) + 1
    return (q[:, 0] * dims[1] + q[:, 1]) * dims[2] + q[:, 2]


def grid_for(xyz: np.ndarray, occupied: int) -> tuple[float, np.ndarray]:
    """A cubic cell edge giving roughly ``occupied`` occupied cells (at least half of it), and
    each point's cell key. Real scans are surfaces, not volumes: the first guess (a volume
    estimate) is refined from the count it gives."""
    extent = float(np.ptp(xyz, axis=0).max()) or 1.0
    edge = extent / max(1.0, occupied ** (1 / 3))
    keys = _grid_keys(xyz, edge)
    for _ in range(6):
        found = len(np.unique(keys))
        if found >= 0.5 * occupied or found == len(xyz):
            break
        edge /= max(1.2, (occupied / found) ** 0.5)
        keys = _grid_keys(xyz, edge)
    return edge, keys


def voxel_sample(xyz: np.ndarray, k: int, rng: np.random.Generator,
                 voxel_size: float | None = None) -> np.ndarray:
    """One random point per occupied voxel, brought to exactly ``k`` distinct indices."""
    keys = _grid_keys(xyz, voxel_size) if voxel_size else grid_for(xyz, k)[1]
    perm = rng.permutation(len(xyz))
    _, first = np.unique(keys[perm], return_index=True)  # first of a random order: random pick
    reps = perm[first]
    if len(reps) >= k:
        return np.sort(rng.choice(reps, k, replace=False))
    others = np.setdiff1d(np.arange(len(xyz)), reps, assume_unique=True)
    return np.sort(np.concatenate([reps, rng.choice(others, k - len(reps), replace=False)]))


def farthest_point_sample(xyz: np.ndarray, k: int, start: int = 0, per_cell: int = 256) -> np.ndarray:
    """Exact farthest-point sampling of ``k`` indices from ``xyz`` (n×3), starting at ``start``.

    Each step adds the point farthest from the samples so far. The textbook loop updates every
    point's nearest-sample distance at every step (n·k work; bench/bench_pointclouds.py times
    both). Here points are sorted into grid cells of ~``per_cell`` points, each cell keeps its box and its
    largest distance; a new sample only updates the cells its distance could lower, which after
    the first few dozen steps is a small neighbourhood. Steps touching most cells run dense.
    """
    n = len(xyz)
    if k > n:
        raise ArgumentError(f"cannot choose {k} points from {n}")
    _, keys = grid_for(xyz, max(1, n // per_cell))
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    # float32 relative to the mean: UTM-sized coordinates lose nothing that matters here
    pts = (xyz[order] - xyz.mean(axis=0)).astype(np.float32)
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    counts = np.diff(np.r_[starts, n])
    lo = np.minimum.reduceat(pts, starts, axis=0).T.copy()
    hi = np.maximum.reduceat(pts, starts, axis=0).T.copy()
    cols = pts.T.copy()
    mind = np.full(n, np.inf, dtype=np.float32)
    cellmax = np.full(len(starts), np.inf, dtype=np.float32)
    acc, tmp = np.empty(n, np.float32), np.empty(n, np.float32)
    bound, gap = np.empty(len(starts), np.float32), np.empty(len(starts), np.float32)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    i = int(inverse[start])
    chosen = np.empty(k, dtype=np.int64)
    for j in range(k):
        chosen[j] = i
        p = cols[:, i].copy()
        bound.fill(0)
        for a in range(3):  # squared distance from p to each cell's box
            np.subtract(lo[a], p[a], out=gap)
            np.maximum(gap, p[a] - hi[a], out=gap)
            np.maximum(gap, 0, out=gap)
            gap *= gap
            bound += gap
        touched = np.flatnonzero(bound < cellmax)
        lens = counts[touched]
        total = int(lens.sum())
        if total > n // 4:  # most cells: a dense pass is cheaper than gathering
            np.subtract(cols[0], p[0], out=acc)
            acc *= acc
            for a in (1, 2):
                np.subtract(cols[a], p[a], out=tmp)
                tmp *= tmp
                acc += tmp
            np.minimum(mind, acc, out=mind)
            cellmax = np.maximum.reduceat(mind, starts)
        elif total:
            offsets = np.cumsum(lens) - lens
            idx = np.arange(total) + np.repeat(starts[touched] - offsets, lens)
            d = cols[0, idx] - p[0]
            d *= d
            for a in (1, 2):
                t = cols[a, idx] - p[a]
                t *= t
                d += t
            m = mind[idx]
            np.minimum(m, d, out=m)
            mind[idx] = m
            cellmax[touched] = np.maximum.reduceat(m, offsets)
        c = int(cellmax.argmax())
        i = int(starts[c] + mind[starts[c] : starts[c] + counts[c]].argmax())
    return order[chosen]


def coverage_radius(xyz: np.ndarray, chosen: np.ndarray, chunk: int = 1 << 16) -> float:
    """Largest distance from any point of ``xyz`` to its nearest chosen point."""
    import torch

    centre = xyz.mean(axis=0)
    pts = torch.from_numpy((xyz - centre).astype(np.float32))
    ref = pts[torch.from_numpy(np.asarray(chosen))]
    worst = 0.0
    for s in range(0, len(pts), chunk):
        worst = max(worst, float(torch.cdist(pts[s : s + chunk], ref).min(dim=1).values.max()))
    return worst


def normalization(xyz: np.ndarray, mode: str) -> tuple[np.ndarray, float]:
    """Centre (mean of all points) and scale (largest distance from it, for unit_sphere)."""
    centre = xyz.mean(axis=0) if mode != "none" else np.zeros(3)
    if mode != "unit_sphere":
        return centre, 1.0
    radius = float(np.sqrt(((xyz - centre) ** 2).sum(axis=1).max()))
    return centre, radius or 1.0


def farthest_point_sample_reference(xyz: np.ndarray, k: int, start: int = 0) -> np.ndarray:
    """The textbook O(n·k) farthest-point loop: the yardstick for :func:`farthest_point_sample`."""
    pts = (xyz - xyz.mean(axis=0)).astype(np.float32)
    mind = np.full(len(pts), np.inf, dtype=np.float32)
    chosen = np.empty(k, dtype=np.int64)
    i = start
    for j in range(k):
        chosen[j] = i
        np.minimum(mind, ((pts - pts[i]) ** 2).sum(axis=1), out=mind)
        i = int(mind.argmax())
    return chosen
