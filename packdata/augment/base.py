"""The base every batched augmentation shares: input checks, per-sample probability, parameters
sampled for the whole batch on the batch's device, kept, and replayable.

An augmentation is two steps: :meth:`BatchAugment.sample` draws every random number the batch
needs (one tensor per parameter, on the batch's device, from an optional ``torch.Generator``) and
:meth:`BatchAugment.apply` applies them without any randomness. ``aug(x, params=aug.last_params)``
replays the previous call exactly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.utils.data

from packdata.errors import AugmentInputError, require

Params = dict[str, torch.Tensor]
BACKENDS = ("auto", "torch", "kornia")


def kornia_augmentation() -> Any:
    """``kornia.augmentation``, imported where the kornia backend runs, or MissingExtraError
    naming the extra to install."""
    require("kornia", "gpu", "backend='kornia'")
    import kornia.augmentation

    return kornia.augmentation


def check_images(x: Any, where: str, channels: tuple[int, ...] = (1, 3)) -> None:
    """Raise :class:`AugmentInputError` unless ``x`` is a B×C×H×W uint8 or float image tensor."""
    if not isinstance(x, torch.Tensor):
        raise AugmentInputError(
            f"{where}: expected a torch.Tensor batch of images B×C×H×W, got {type(x).__name__}")
    if x.ndim != 4:
        hint = " (one image? use x[None])" if x.ndim == 3 else ""
        raise AugmentInputError(
            f"{where}: expected a batch B×C×H×W (4 dimensions), got shape {tuple(x.shape)}{hint}")
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise AugmentInputError(
            f"{where}: expected dtype uint8 (0–255) or a float dtype (0–1), got {x.dtype}")
    if x.shape[1] not in channels:
        wanted = " or ".join(str(c) for c in channels)
        if x.shape[-1] in channels:
            raise AugmentInputError(
                f"{where}: expected channels first, B×C×H×W with {wanted} channels; got shape "
                f"{tuple(x.shape)}, which looks channels-last: use x.permute(0, 3, 1, 2)")
        raise AugmentInputError(
            f"{where}: expected B×C×H×W with {wanted} channels, got shape {tuple(x.shape)}")


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 0–255 → float32 0–1 on the tensor's device; float input is returned as is."""
    if x.dtype == torch.uint8:
        # contiguous NCHW output: on CPU the channels-last float conversion is ~2x slower
        return x.to(torch.float32, memory_format=torch.contiguous_format).mul_(1 / 255)
    return x


def uniform(n: int, low: float, high: float, generator: torch.Generator | None,
            device: torch.device) -> torch.Tensor:
    """``n`` floats uniform in [low, high) on ``device``."""
    u = torch.rand(n, generator=generator, device=device)
    return u.mul_(high - low).add_(low)


def factor_range(value: float | tuple[float, float], name: str, centre: float = 1.0,
                 bound: tuple[float, float] = (0.0, float("inf"))) -> tuple[float, float]:
    """torchvision-style jitter argument: ``v`` → [centre − v, centre + v] (clipped), or a pair."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise AugmentInputError(f"{name}: expected a non-negative number, got {value}")
        low, high = max(centre - value, bound[0]), min(centre + value, bound[1])
    else:
        low, high = (float(v) for v in value)
    if not bound[0] <= low <= high <= bound[1]:
        raise AugmentInputError(f"{name}: expected {bound[0]} ≤ low ≤ high ≤ {bound[1]}, "
                                f"got ({low}, {high})")
    return low, high


class BatchAugment:
    """One batched augmentation. Subclasses define :meth:`sample`, :meth:`apply` and, where kornia
    has the same operation, :meth:`kornia_module`.

    ``p`` is the probability that each sample is transformed (drawn per sample); ``channels`` are
    the channel counts the operation accepts.
    """

    channels: ClassVar[tuple[int, ...]] = (1, 3)

    def __init__(self, p: float = 1.0) -> None:
        if not 0.0 <= p <= 1.0:
            raise AugmentInputError(f"{type(self).__name__}: p must be in [0, 1], got {p}")
        self.p = float(p)
        self.last_params: Params | None = None

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        """Every random number the batch ``x`` needs, as tensors on ``x.device``."""
        raise NotImplementedError(f"{type(self).__name__} must define sample()")

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        """The deterministic transform of ``x`` given ``params``."""
        raise NotImplementedError(f"{type(self).__name__} must define apply()")

    def kornia_module(self) -> torch.nn.Module | None:
        """The equivalent ``kornia.augmentation`` module, or None to use :meth:`apply` there too."""
        return None

    def scaled(self, factor: float) -> BatchAugment:
        """This augmentation with its pixel values (a fill colour, an erase value) multiplied by
        ``factor``: the kornia backend runs on 0–1 floats, where a uint8 batch's 255 is 1."""
        return self

    def applied(self, n: int, generator: torch.Generator | None,
                device: torch.device) -> torch.Tensor:
        """Bool mask: which of ``n`` samples this augmentation transforms."""
        if self.p >= 1.0:
            return torch.ones(n, dtype=torch.bool, device=device)
        return torch.rand(n, generator=generator, device=device) < self.p

    def __call__(self, x: torch.Tensor, params: Params | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        check_images(x, type(self).__name__, self.channels)
        if params is None:
            params = self.sample(x, generator)
        self.last_params = params
        return self.apply(x, params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "last_params")
        return f"{type(self).__name__}({args})"


class DeviceGenerators:
    """One seeded ``torch.Generator`` per device, created on first use (a generator lives on one
    device, and a batch may arrive on any). Without a seed: None, i.e. torch's global RNG.

    In a DataLoader worker the seed is mixed with the worker's id: forked workers would otherwise
    share one generator state and give their batches identical crops and flips."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._by_device: dict[tuple[torch.device, int | None], torch.Generator] = {}

    def __call__(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        worker = torch.utils.data.get_worker_info()
        key = (device, None if worker is None else worker.id)
        if key not in self._by_device:
            seed = self.seed if worker is None else hash((self.seed, worker.id)) & (2**63 - 1)
            self._by_device[key] = torch.Generator(device=device).manual_seed(seed)
        return self._by_device[key]
