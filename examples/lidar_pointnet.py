"""LiDAR cloud classification with a PointNet: laspy in ``__getitem__`` against packdata.

    python examples/lidar_pointnet.py --data path/to/clouds --epochs 5 --json lidar.json

``--data`` is a folder of LAS/LAZ clouds in class sub-folders (``oak/a.las``) or with a labels
file, as ``packdata convert`` reads it. Clouds are sorted; every 10th is held out for testing.

- baseline: the usual Dataset — ``__getitem__`` reads the file with laspy, centres the cloud and
  scales it into the unit sphere, draws ``--points`` random points, and augments them in numpy
  (rotation about z, scaling, jitter), one cloud at a time.
- packdata: the folder converted once (time reported apart) into HDF5 holding ``--variants``
  presamples of ``--points`` points per cloud (same sampling and normalisation); each epoch
  serves another variant, and the batch is augmented at once on the training device by
  ``packdata.augment.points.PointAugment`` (same rotation, scaling and jitter).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

import packdata  # noqa: E402
from packdata.augment.points import PointAugment  # noqa: E402
from packdata.bench.models import PointNet  # noqa: E402
from packdata.errors import require  # noqa: E402

SCALE = (0.8, 1.25)
JITTER = 0.01


class RawCloudDataset(Dataset):
    """Read, normalise, sample and augment one cloud per access (the workflow packdata replaces)."""

    def __init__(self, files: list[Path], labels: list[int], points: int, augment: bool) -> None:
        self.files, self.labels, self.points, self.augment = files, labels, points, augment

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import laspy

        las = laspy.read(self.files[i])
        xyz = np.stack([las.x, las.y, las.z], axis=1)
        xyz = xyz - xyz.mean(0)
        xyz /= max(float(np.linalg.norm(xyz, axis=1).max()), 1e-12)
        idx = np.random.choice(len(xyz), self.points, replace=len(xyz) < self.points)
        pts = xyz[idx].astype(np.float32)
        if self.augment:
            a = np.random.uniform(-math.pi, math.pi)
            c, s = math.cos(a), math.sin(a)
            pts[:, :2] = pts[:, :2] @ np.array([[c, s], [-s, c]], dtype=np.float32)
            pts *= np.random.uniform(*SCALE, size=3).astype(np.float32)
            pts += np.clip(JITTER * np.random.randn(*pts.shape), -5 * JITTER, 5 * JITTER).astype(np.float32)
        return torch.from_numpy(pts), self.labels[i]


def convert(args: Any, workdir: Path) -> tuple[packdata.PackedDataset, float | None]:
    return common.convert_once(
        workdir / f"clouds-{args.points}x{args.variants}.h5",
        lambda: packdata.open_source(args.data, kind="pointcloud", points=args.points,
                                     sampling=args.sampling, variants=args.variants,
                                     seed=args.seed, normalize="unit_sphere"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.split("\n")[0], batch_size=32, epochs=5)
    p.add_argument("--points", type=int, default=1024, help="points per cloud (default 1024)")
    p.add_argument("--variants", type=int, default=4, help="presamples stored per cloud (K)")
    p.add_argument("--sampling", choices=("random", "fps", "voxel"), default="random",
                   help="packdata's presampling (the baseline draws random points)")
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)
    common.check_kind(args.data, "pointcloud", "a folder of LAS/LAZ point clouds")
    require("laspy", "lidar", "the LiDAR example")
    device = common.device_of(args.device)
    source = packdata.open_source(args.data, kind="pointcloud")
    items = source.items()
    if any(item.label is None for item in items):
        raise common.ExampleError(f"{args.data}: the clouds have no labels (expected class "
                                  "sub-folders or a labels file)")
    classes = len(source.classes or []) or max(item.label for item in items) + 1
    train_idx, test_idx = common.split_indices(len(items))
    files, labels = [item.path for item in items], [int(item.label) for item in items]
    extra: dict[str, Any] = {"classes": source.classes, "train_samples": len(train_idx),
                             "test_samples": len(test_idx)}

    with common.workdir_of(args) as workdir:
        runs = {}
        for name in common.loaders_of(args.loader):
            ds = sampler = None
            if name == "baseline":
                def subset(idx: np.ndarray, augment: bool) -> RawCloudDataset:
                    return RawCloudDataset([files[i] for i in idx], [labels[i] for i in idx],
                                           args.points, augment)
                g = torch.Generator().manual_seed(args.seed)
                options = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
                train = DataLoader(subset(train_idx, True), args.batch_size, shuffle=True,
                                   generator=g, **options)
                test = DataLoader(subset(test_idx, False), 256, **options)
            else:
                ds, seconds = convert(args, workdir)
                extra["convert_seconds"] = seconds
                sampler = common.SubsetBatches(train_idx, args.batch_size, seed=args.seed)
                augment = PointAugment(scale_range=SCALE, jitter_sigma=JITTER, dropout_ratio=None,
                                       seed=args.seed)
                train = packdata.loader(ds, batch_sampler=sampler, device=device, augment=augment)
                test = packdata.loader(ds, batch_sampler=common.SubsetBatches(test_idx, 256, shuffle=False),
                                       device=device)
            runs[name] = make_run(args, device, classes, train, test, sampler, ds)
        results = common.train_interleaved(runs, args.epochs, device)
    return common.finish("lidar_pointnet", args, device, results, extra)


def make_run(args: Any, device: torch.device, classes: int, train: Any, test: Any,
             sampler: Any, ds: Any) -> common.Run:
    """A fresh PointNet (the same initial weights for every loader) and its training step."""
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = PointNet(num_classes=classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    def step(batch: Any) -> common.StepResult:
        points, target = (t.to(device, non_blocking=True) for t in batch[:2])
        out = model(points)
        loss = F.cross_entropy(out, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item() * len(target), len(target), int((out.argmax(1) == target).sum())

    def before_epoch(epoch: int) -> None:
        if sampler is not None:
            sampler.set_epoch(epoch)
            ds.set_epoch(epoch)  # each cloud serves another of its K presamples
        model.train()

    return common.Run(train, step, lambda: {"test_accuracy": evaluate(model, test, device)},
                      before_epoch)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Any, device: torch.device) -> float:
    model.eval()
    correct = total = 0
    for batch in batches:
        points, target = batch[0].to(device), batch[1].to(device)
        correct += int((model(points).argmax(1) == target).sum())
        total += len(target)
    return correct / max(total, 1)


if __name__ == "__main__":
    sys.exit(common.run_main(main, None))
