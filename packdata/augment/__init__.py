"""Batched augmentations that run on the device of the batch they receive.

>>> from packdata.augment import cifar_recipe
>>> augment = cifar_recipe(seed=0, backend="torch")   # crop pad 4, flip, normalise
>>> x = augment(images)                               # uint8 B×3×32×32 → float32, same device

Operations (:mod:`packdata.augment.ops`) take uint8 0–255 or float 0–1 B×C×H×W batches; a
:class:`Compose` chains them, seeds them and picks the backend (packdata's torch code, or kornia).
"""

from packdata.augment.base import AugmentInputError, BatchAugment, check_images, to_float
from packdata.augment.compose import Compose, cifar_recipe, kornia_available, resolve_backend
from packdata.augment.ops import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    ColorJitter,
    Cutout,
    Normalize,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
)

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "AugmentInputError", "BatchAugment", "ColorJitter", "Compose",
    "Cutout", "Normalize", "RandomCrop", "RandomErasing", "RandomHorizontalFlip", "check_images",
    "cifar_recipe", "kornia_available", "resolve_backend", "to_float",
]
