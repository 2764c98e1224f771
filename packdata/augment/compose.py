"""A pipeline of batched augmentations: uint8 or float B×C×H×W in, float32 out, seeded.

Two backends run the same list of operations: ``"torch"`` (packdata's own, vectorised, fastest
on CPU) and ``"kornia"`` (``kornia.augmentation`` modules, extra ``gpu``); ``"auto"`` runs, for
each batch, the backend measured fastest on that batch's device (:data:`AUTO_BACKEND`).
Operations kornia lacks run packdata's implementation in either backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packdata.augment.base import (
    BACKENDS,
    AugmentInputError,
    BatchAugment,
    DeviceGenerators,
    check_images,
    kornia_augmentation,
    to_float,
)
from packdata.augment.ops import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    ColorJitter,
    Cutout,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
)


def kornia_available() -> bool:
    try:
        import kornia.augmentation  # noqa: F401
    except ImportError:
        return False
    return True


#: The backend ``"auto"`` runs on each device type, as measured by bench/bench_augment.py: on the
#: CPU packdata's own ops ran the CIFAR recipe ~4× kornia's rate (bench/results/augment.json),
#: on an H100 the recipe with colour jitter 2.7× (bench/results/augment_gpu.json).
#: A device type not listed has not been measured and runs packdata's own ops (they run on any
#: device); ask for ``backend="kornia"`` by name there, or measure and add it here.
AUTO_BACKEND: dict[str, str] = {"cpu": "torch", "cuda": "torch"}


def resolve_backend(backend: str, device: torch.device | str | None = None) -> str:
    """The backend that runs: ``"auto"`` → :data:`AUTO_BACKEND` for ``device``'s type (torch
    when kornia is missing); names are checked."""
    if backend not in BACKENDS:
        raise AugmentInputError(f"backend '{backend}': expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        kind = torch.device(device).type if device is not None else "cpu"
        chosen = AUTO_BACKEND.get(kind, "torch")
        return chosen if chosen != "kornia" or kornia_available() else "torch"
    if backend == "kornia":
        kornia_augmentation()
    return backend


class Compose:
    """Apply ``ops`` in order to a batch on its own device; returns float32.

    ``seed`` makes the sequence of outputs reproducible: the pipeline keeps one
    ``torch.Generator`` per device, seeded with it (kornia draws from torch's global generator,
    so there each call runs under ``torch.random.fork_rng`` seeded from the pipeline's
    generator). Use it as ``batch_transform=`` of a dataset, ``augment=`` of
    :func:`packdata.loader`, or call it in the training loop.
    """

    def __init__(self, ops: Sequence[BatchAugment], *, seed: int | None = None,
                 backend: str = "auto") -> None:
        for op in ops:
            if not isinstance(op, BatchAugment):
                raise AugmentInputError(
                    f"Compose: expected packdata.augment operations, got {type(op).__name__}")
        self.ops = list(ops)
        resolve_backend(backend)  # checked now; "auto" is resolved per batch, for its device
        self.backend = backend
        self.seed = seed
        self._generators = DeviceGenerators(seed)
        self._kornia: dict[tuple[torch.device, float], tuple[list, list]] = {}

    def manual_seed(self, seed: int) -> Compose:
        """Restart the random sequence from ``seed``."""
        self.seed = seed
        self._generators = DeviceGenerators(seed)
        return self

    def generator(self, device: torch.device) -> torch.Generator | None:
        """This pipeline's generator on ``device`` (None without a seed: torch's global one)."""
        return self._generators(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        check_images(x, "Compose")
        if x.is_floating_point() and x.dtype != torch.float32:  # float32 out, whatever came in
            x = x.float()
        generator = self.generator(x.device)
        backend = self.backend if self.backend != "auto" else resolve_backend("auto", x.device)
        if backend == "kornia":
            return self._kornia_call(x, generator)
        for op in self.ops:
            x = op(x, generator=generator)
        return to_float(x)

    def _kornia_call(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        factor = 1 / 255 if x.dtype == torch.uint8 else 1.0  # kornia works on 0–1 floats
        if (x.device, factor) not in self._kornia:
            ops = [op.scaled(factor) for op in self.ops]
            self._kornia[x.device, factor] = ops, [
                m.to(x.device) if (m := op.kornia_module()) is not None else None for op in ops]
        ops, modules = self._kornia[x.device, factor]
        x = to_float(x)
        if generator is None:
            return self._run_kornia(x, ops, modules, None)
        # one seed per call from our generator, so kornia's draws replay with the pipeline's seed
        seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device))
        devices = [x.device.index or 0] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=x.device.type):
            torch.manual_seed(seed)
            return self._run_kornia(x, ops, modules, generator)

    def _run_kornia(self, x: torch.Tensor, ops: list[BatchAugment], modules: list,
                    generator: torch.Generator | None) -> torch.Tensor:
        for op, module in zip(ops, modules):
            x = op(x, generator=generator) if module is None else module(x)
        return x

    def __repr__(self) -> str:
        inner = ", ".join(repr(op) for op in self.ops)
        return f"Compose([{inner}], seed={self.seed}, backend='{self.backend}')"


def cifar_recipe(*, jitter: float = 0.0, cutout: int = 0, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD, size: int = 32, seed: int | None = None,
                 backend: str = "auto") -> Compose:
    """The standard CIFAR training recipe: random crop with 4-pixel padding, horizontal flip,
    normalise; ``jitter`` adds colour jitter (brightness, contrast and saturation ``jitter``,
    hue ``jitter / 4``) and ``cutout`` a cutout square of that size."""
    ops: list[BatchAugment] = [RandomCrop(size, padding=4), RandomHorizontalFlip(0.5)]
    if jitter:
        ops.append(ColorJitter(jitter, jitter, jitter, min(jitter / 4, 0.5)))
    ops.append(Normalize(mean, std))
    if cutout:
        ops.append(Cutout(cutout))
    return Compose(ops, seed=seed, backend=backend)
