"""CIFAR-10 image classification: the per-file tutorial loader against packdata, same model.

    python examples/cifar10_cnn.py --data path/to/cifar10-png --epochs 3 --json cifar.json

``--data`` is an image folder as ``packdata convert`` reads it (a flat folder with
``labels.json|csv|pkl``, or class sub-folders; ``--labels FILE`` names a labels file kept
elsewhere). Samples are sorted; every 10th is held out for
testing (10,000 images → 9,000 train / 1,000 test), identically for both loaders.

- baseline: the tutorial's Dataset — one PNG opened with PIL per sample, then a per-sample CPU
  recipe (random crop with 4-pixel zero padding, horizontal flip, normalise) in a stock
  DataLoader (``--workers`` processes, default 0).
- packdata: the folder converted once to HDF5 (time reported apart), read a batch at a time by
  ``packdata.loader`` and augmented as a batch on the training device by
  ``packdata.augment.cifar_recipe`` (same recipe).

The model is the tutorial's CNN (two conv-pool stages, three fully connected layers;
``--model small-cnn`` or ``resnet18`` for packdata's bench models).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

import packdata  # noqa: E402
from packdata.augment import CIFAR10_MEAN, CIFAR10_STD, Compose, Normalize, cifar_recipe  # noqa: E402
from packdata.bench.baselines import ClassicCifarTransform, PerFileImageDataset  # noqa: E402
from packdata.bench.models import ResNet18, SmallCNN  # noqa: E402


class TutorialCNN(nn.Module):
    """The PyTorch CIFAR-10 tutorial's network: conv-pool twice, then three linear layers."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 5), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


MODELS = {"tutorial": TutorialCNN, "small-cnn": SmallCNN, "resnet18": ResNet18}


class PerSample(Dataset):
    """Apply a per-sample transform to a Dataset's images (the tutorial's ``transform=``)."""

    def __init__(self, dataset: Dataset, transform: Any) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.dataset[i]
        return self.transform(image), label


class NormalizeOnly:
    """Test-time per-sample transform of the baseline: ToTensor + Normalize."""

    def __init__(self) -> None:
        self.mean = torch.tensor(CIFAR10_MEAN).view(-1, 1, 1)
        self.std = torch.tensor(CIFAR10_STD).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return (image.float().div(255) - self.mean) / self.std


def baseline_loaders(args: Any, train_idx: Any, test_idx: Any) -> tuple[Any, Any]:
    if args.labels:
        files = PerFileImageDataset(args.data, args.labels)
    else:
        files = PerFileImageDataset.from_source(args.data)
    if files.labels is None:
        raise common.ExampleError(f"{args.data}: the images have no labels (expected labels.json|"
                                  "csv|pkl in the folder, or class sub-folders)")
    train = PerSample(Subset(files, train_idx.tolist()), ClassicCifarTransform(CIFAR10_MEAN, CIFAR10_STD))
    test = PerSample(Subset(files, test_idx.tolist()), NormalizeOnly())
    g = torch.Generator().manual_seed(args.seed)
    options = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    return (DataLoader(train, args.batch_size, shuffle=True, generator=g, **options),
            DataLoader(test, 500, **options))


def packdata_loaders(ds: packdata.PackedDataset, args: Any, device: torch.device,
                     train_idx: Any, test_idx: Any) -> tuple[Any, Any, Any]:
    sampler = common.SubsetBatches(train_idx, args.batch_size, seed=args.seed)
    train = packdata.loader(ds, batch_sampler=sampler, device=device,
                            augment=cifar_recipe(seed=args.seed, backend="torch"))
    test = packdata.loader(ds, batch_sampler=common.SubsetBatches(test_idx, 500, shuffle=False),
                           device=device,
                           augment=Compose([Normalize(CIFAR10_MEAN, CIFAR10_STD)], backend="torch"))
    return train, test, sampler


def convert(args: Any, workdir: Path) -> tuple[packdata.PackedDataset, float | None]:
    return common.convert_once(workdir / "cifar.h5", lambda: packdata.open_source(
        args.data, kind="image", labels=args.labels))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.split("\n")[0], batch_size=64, epochs=3)
    p.add_argument("--labels", type=Path, help="labels file (json, csv, pkl) outside --data")
    p.add_argument("--model", choices=sorted(MODELS), default="tutorial")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--schedule", choices=("linear", "constant"), default="linear",
                   help="learning rate: linear decay to zero over the run (default), or constant")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA or CPU)")
    args = p.parse_args(argv)
    common.check_kind(args.data, "image", "an image folder (PNG/JPEG + labels)")
    device = common.device_of(args.device)
    count = len(packdata.open_source(args.data, kind="image", labels=args.labels).items())
    train_idx, test_idx = common.split_indices(count)
    extra: dict[str, Any] = {"train_samples": len(train_idx), "test_samples": len(test_idx)}

    with common.workdir_of(args) as workdir:
        runs = {}
        for name in common.loaders_of(args.loader):
            if name == "baseline":
                train, test = baseline_loaders(args, train_idx, test_idx)
                sampler = None
            else:
                ds, seconds = convert(args, workdir)
                extra["convert_seconds"] = seconds
                if ds.manifest.kind != "image":
                    raise common.ExampleError(f"{args.data}: converted to {ds.manifest.kind}, "
                                              "expected images")
                train, test, sampler = packdata_loaders(ds, args, device, train_idx, test_idx)
            runs[name] = make_run(args, device, train, test, sampler)
        results = common.train_interleaved(runs, args.epochs, device)
    return common.finish("cifar10_cnn", args, device, results, extra)


def make_run(args: Any, device: torch.device, train: Any, test: Any, sampler: Any) -> common.Run:
    """A fresh model (the same initial weights for every loader) and its training step."""
    torch.manual_seed(args.seed)
    model = MODELS[args.model](num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    total = max(1, args.epochs * len(train))
    # linear decay to zero over the run: the last epochs' accuracy settles instead of jumping
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 1 - i / total if args.schedule == "linear" else 1.0)

    def step(batch: Any) -> common.StepResult:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            out = model(images)
            loss = F.cross_entropy(out, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        return loss.item() * len(labels), len(labels), int((out.argmax(1) == labels).sum())

    def before_epoch(epoch: int) -> None:
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()

    return common.Run(train, step, lambda: {"test_accuracy": evaluate(model, test, device, args.amp)},
                      before_epoch)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Any, device: torch.device, amp: bool) -> float:
    model.eval()
    correct = total = 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=amp):
            correct += int((model(images).argmax(1) == labels).sum())
        total += len(labels)
    return correct / max(total, 1)


if __name__ == "__main__":
    sys.exit(common.run_main(main, None))
