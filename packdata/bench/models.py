"""Models for ``packdata bench``: built-ins sized for each sample kind, or the user's own.

How a batch meets a model: the batch's parts are split into inputs and a target (the last part
when it is a 1-D integer tensor of one value per sample, e.g. class labels); uint8 inputs
(images) become float in [0, 1] on the device; the model is called as ``model(*inputs)``.
Built-ins: ``small-cnn``, ``resnet18`` (CIFAR-style: 3×3 stem, no max-pool) and ``fast-cifar``
(:class:`FastCIFAR`) for images B×C×H×W, ``pointnet`` for point clouds B×N×F,
``transformer`` for token ids B×T with an attention mask B×T (1 = token, 0 = padding).
``module:callable`` or ``path/to/file.py:callable`` names a function (or class) returning a
``torch.nn.Module``; it gets ``num_classes=`` if it takes that argument.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from packdata.errors import BenchError


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head: cheap enough to train on a CPU."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(in_channels, 32), nn.MaxPool2d(2), block(32, 64),
                                      nn.MaxPool2d(2), block(64, 128), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class FastCIFAR(nn.Module):
    """The kind of network the fastest CIFAR-10 trainers use: a 3×3 conv stem, three blocks of
    conv → max-pool → BatchNorm → GELU → conv → BatchNorm → GELU (64, 256, 256 channels), a
    global max-pool and a linear head. Milliseconds a batch of 1,024 on a fast GPU, most of it
    the training thread launching kernels: the step that exposes a loader's cost on that thread."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.MaxPool2d(2),
                nn.BatchNorm2d(cout), nn.GELU(), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout), nn.GELU())

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.GELU(),
            block(32, 64), block(64, 256), block(256, 256), nn.AdaptiveMaxPool2d(1))
        self.head = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x), inplace=True)


class ResNet18(nn.Module):
    """ResNet-18. ``stem="cifar"`` (the bench's built-in) for small images: a 3×3 stem at
    stride 1, no max-pool; ``stem="imagenet"`` the original: 7×7 at stride 2, then a max-pool."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, stem: str = "cifar") -> None:
        super().__init__()
        if stem == "cifar":
            self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        elif stem == "imagenet":
            self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
        else:
            raise BenchError(f"ResNet18 stem '{stem}': expected 'cifar' or 'imagenet'")
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class PointNet(nn.Module):
    """PointNet-style classifier: a shared per-point MLP, max-pooled over points (order-free)."""

    def __init__(self, num_classes: int = 10, in_features: int = 3) -> None:
        super().__init__()
        self.point_mlp = nn.Sequential(
            nn.Linear(in_features, 64), nn.ReLU(inplace=True), nn.Linear(64, 128),
            nn.ReLU(inplace=True), nn.Linear(128, 512))
        self.head = nn.Sequential(nn.Linear(512, 256), nn.ReLU(inplace=True),
                                  nn.Linear(256, num_classes))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.head(self.point_mlp(points).amax(dim=1))


#: tokens of each document the built-in transformer reads: attention costs grow with the square
#: of the length, and a stand-in model over whole 50,000-token documents would take minutes per
#: step and say nothing about I/O (the loader still delivers, and is timed on, whole documents)
MAX_MOCK_TOKENS = 512


class SmallTransformer(nn.Module):
    """Token embedding + sinusoidal positions + a 2-layer encoder, masked mean-pooled, over the
    first ``max_tokens`` tokens of each sequence."""

    def __init__(self, num_classes: int = 2, vocab_size: int = 32_768, dim: int = 128,
                 layers: int = 2, heads: int = 4, max_tokens: int = MAX_MOCK_TOKENS) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.embed = nn.Embedding(vocab_size, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)

    def positions(self, length: int, dim: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, dim, 2, device=device) * (-math.log(10_000.0) / dim))
        table = torch.zeros(length, dim, device=device)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
        return table

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        ids = ids[:, : self.max_tokens]
        mask = None if mask is None else mask[:, : self.max_tokens]
        # clamp: the bench times the work, and an id past the table would only crash it
        x = self.embed(ids.clamp(0, self.vocab_size - 1))
        x = x + self.positions(ids.shape[1], x.shape[-1], x.device).to(x.dtype)
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        x = self.encoder(x, src_key_padding_mask=~keep)
        weights = keep.unsqueeze(-1).to(x.dtype)
        return self.head((x * weights).sum(1) / weights.sum(1).clamp(min=1))


#: name → (sample kinds it fits, factory(num_classes, inputs) → module)
BUILTINS: dict[str, tuple[tuple[str, ...], Callable[[int, Sequence[torch.Tensor]], nn.Module]]] = {
    "small-cnn": (("image",), lambda n, xs: SmallCNN(n, xs[0].shape[1])),
    "resnet18": (("image",), lambda n, xs: ResNet18(n, xs[0].shape[1])),
    "fast-cifar": (("image",), lambda n, xs: FastCIFAR(n, xs[0].shape[1])),
    "pointnet": (("pointcloud",), lambda n, xs: PointNet(n, xs[0].shape[-1])),
    "transformer": (("text",), lambda n, xs: SmallTransformer(
        n, vocab_size=max(32_768, int(xs[0].max()) + 1))),
}


def default_model(kind: str, device: torch.device) -> str:
    """The built-in for a sample kind; for images ResNet-18 on a GPU, the small CNN on a CPU
    (ResNet-18 trains at a few dozen CIFAR images/s on a laptop CPU, which says nothing about I/O)."""
    if kind == "image":
        return "resnet18" if device.type == "cuda" else "small-cnn"
    for name, (kinds, _) in BUILTINS.items():
        if kind in kinds:
            return name
    raise BenchError(f"no built-in model for '{kind}' samples; pass --model module:callable")


def split_batch(batch: Any) -> tuple[tuple[Any, ...], torch.Tensor | None]:
    """(inputs, target): the last part is the target when it is one integer per sample."""
    parts = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    last = parts[-1]
    if (len(parts) > 1 and isinstance(last, torch.Tensor) and last.ndim == 1
            and not last.is_floating_point() and isinstance(parts[0], torch.Tensor)
            and len(last) == len(parts[0])):
        return parts[:-1], last
    return parts, None


def prepare_inputs(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """uint8 tensors (pixels) become float in [0, 1]; done on the device, so the copy to it
    moves a quarter of the bytes."""
    return tuple(x.float().div_(255) if isinstance(x, torch.Tensor) and x.dtype == torch.uint8
                 else x for x in inputs)


def describe_batch(batch: Any) -> str:
    """``(uint8 256×3×32×32, int64 256)``: each part's dtype and shape."""
    parts = batch if isinstance(batch, (tuple, list)) else (batch,)

    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')} {'×'.join(map(str, x.shape)) or 'scalar'}"
        if isinstance(x, (list, tuple)):
            return f"{type(x).__name__} of {len(x)}"
        return type(x).__name__

    return "(" + ", ".join(one(x) for x in parts) + ")"


def _load_callable(spec: str) -> Callable[..., Any]:
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        known = ", ".join(BUILTINS)
        raise BenchError(f"model '{spec}': expected a built-in ({known}) or module:callable")
    try:
        if where.endswith(".py"):
            path = Path(where)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(where)
    except Exception as exc:  # the user's module: any failure to import is theirs to see
        raise BenchError(f"model '{spec}': cannot import '{where}' "
                         f"({type(exc).__name__}: {exc})") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BenchError(f"model '{spec}': '{where}' has no attribute '{attr}'") from None


def build_model(spec: str, kind: str, batch: Any, num_classes: int) -> tuple[str, nn.Module]:
    """(name, module) for ``spec`` (a built-in name or module:callable), sized from ``batch``."""
    inputs, _ = split_batch(batch)
    if spec in BUILTINS:
        kinds, factory = BUILTINS[spec]
        if kind not in kinds:
            raise BenchError(f"model '{spec}' is for {'/'.join(kinds)} samples, this dataset "
                             f"holds {kind} samples")
        return spec, factory(num_classes, inputs)
    factory = _load_callable(spec)
    if isinstance(factory, nn.Module):
        return spec, factory
    try:
        takes = "num_classes" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes = False
    try:
        model = factory(num_classes=num_classes) if takes else factory()
    except Exception as exc:  # the user's code: show what it raised, in one line
        raise BenchError(f"model '{spec}': building it failed ({type(exc).__name__}: {exc})"
                         ) from exc
    if not isinstance(model, nn.Module):
        raise BenchError(f"model '{spec}' returned {type(model).__name__}, not a torch.nn.Module")
    return spec, model


def loss_of(output: Any, target: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy for class scores B×C against labels; otherwise the mean square of the
    output, a stand-in loss with the same backward cost (the bench measures speed, not learning)."""
    out = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(out, torch.Tensor):
        raise BenchError(f"the model returned {type(out).__name__}; the bench needs a tensor")
    if target is not None and out.ndim == 2 and out.shape[0] == target.shape[0]:
        return F.cross_entropy(out.float(), target.clamp(0, out.shape[1] - 1))
    return out.float().square().mean()
