"""The batched augmentations: random crop with padding, horizontal flip, colour jitter, normalise,
random erasing and cutout.

Each one works on uint8 (0–255) or float (0–1) B×C×H×W batches on any device, with no Python loop
over samples: crops are one gather over the padded batch, colour jitter is one per-sample 3×3
matrix and offset. Geometric ops keep the dtype (crop and flip in uint8 move 4× fewer bytes);
colour ops and :class:`Normalize` return float32.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from packdata.augment.base import (
    AugmentInputError,
    BatchAugment,
    Params,
    factor_range,
    kornia_augmentation,
    uniform,
)
from packdata.units import size_pair

GRAY = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision's rgb_to_grayscale
RGB_TO_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class RandomCrop(BatchAugment):
    """Crop a ``size`` window at a random place of each image zero-padded by ``padding`` pixels
    (torchvision's ``RandomCrop(size, padding)``). ``fill`` is the padding value in the input's
    units (0–255 for uint8)."""

    def __init__(self, size: int | Sequence[int], padding: int = 0, fill: float = 0,
                 p: float = 1.0) -> None:
        super().__init__(p)
        self.size = size_pair(size, "RandomCrop size", AugmentInputError)
        if padding < 0:
            raise AugmentInputError(f"RandomCrop padding must be ≥ 0, got {padding}")
        self.padding = int(padding)
        self.fill = fill

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        n, _, height, width = x.shape
        span_y = height + 2 * self.padding - self.size[0] + 1
        span_x = width + 2 * self.padding - self.size[1] + 1
        if span_y < 1 or span_x < 1:
            raise AugmentInputError(
                f"RandomCrop: crop {self.size} is larger than the padded image "
                f"({height + 2 * self.padding}, {width + 2 * self.padding})")
        top = torch.randint(span_y, (n,), generator=generator, device=x.device)
        left = torch.randint(span_x, (n,), generator=generator, device=x.device)
        keep = ~self.applied(n, generator, x.device)
        if self.p < 1.0:  # untouched samples take the centre window: the identity for size == H×W
            top = torch.where(keep, span_y // 2, top)
            left = torch.where(keep, span_x // 2, left)
        return {"top": top, "left": left}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype != torch.bfloat16:  # numpy has no bfloat16
            return self._apply_numpy(x, params)
        n, c, height, width = x.shape
        h, w, pad = *self.size, self.padding
        # channels-last H×W×C rows: one window row is h contiguous runs of w·C values
        padded = x.new_full((n, height + 2 * pad, width + 2 * pad, c), self.fill)
        padded[:, pad : pad + height, pad : pad + width] = x.permute(0, 2, 3, 1)
        windows = padded.view(n, height + 2 * pad, -1).unfold(2, w * c, c)  # n×Hp×span_x×(w·C)
        rows = params["top"][:, None] + torch.arange(h, device=x.device)
        batch = torch.arange(n, device=x.device)[:, None]
        out = windows[batch, rows, params["left"][:, None]]  # one gather: n×h×(w·C)
        return out.view(n, h, w, c).permute(0, 3, 1, 2)

    def _apply_numpy(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        """The same gather in numpy, whose fancy indexing copies each w·C run with one
        memcpy."""
        n, c, height, width = x.shape
        h, w, pad = *self.size, self.padding
        padded = np.full((n, height + 2 * pad, width + 2 * pad, c), self.fill,
                         dtype=torch.empty(0, dtype=x.dtype).numpy().dtype)
        padded[:, pad : pad + height, pad : pad + width] = x.permute(0, 2, 3, 1).numpy()
        windows = sliding_window_view(padded.reshape(n, height + 2 * pad, -1), w * c, axis=2)
        rows = params["top"].numpy()[:, None] + np.arange(h)
        out = windows[:, :, ::c][np.arange(n)[:, None], rows, params["left"].numpy()[:, None]]
        return torch.from_numpy(out.reshape(n, h, w, c)).permute(0, 3, 1, 2)

    def kornia_module(self) -> torch.nn.Module:
        K = kornia_augmentation()
        return K.RandomCrop(self.size, padding=self.padding, fill=self.fill, p=self.p)

    def scaled(self, factor: float) -> RandomCrop:
        op = copy.copy(self)
        op.fill = self.fill * factor
        return op


class RandomHorizontalFlip(BatchAugment):
    """Mirror each image left–right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        return {"flip": self.applied(len(x), generator, x.device)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        flip = params["flip"]
        if x.device.type == "cpu" and x.dtype != torch.bfloat16:  # numpy has no bfloat16
            # only the chosen samples are touched (on a GPU, nonzero() would sync)
            chosen = flip.nonzero().squeeze(1).numpy()
            # in a B×H×W×C copy each image row is W·C contiguous values: one take() with a
            # precomputed column order is much cheaper than a ::-1 copy of 3-byte pixels
            out = np.array(x.permute(0, 2, 3, 1).numpy(), order="C")
            b, h, w, c = out.shape
            mirrored = (np.arange(w - 1, -1, -1)[:, None] * c + np.arange(c)).ravel()
            rows = out.reshape(b, h, w * c)
            rows[chosen] = np.take(rows[chosen], mirrored, axis=2)  # rows[chosen] is a copy
            return torch.from_numpy(out).permute(0, 3, 1, 2)
        return torch.where(flip[:, None, None, None], x.flip(-1), x)

    def kornia_module(self) -> torch.nn.Module:
        K = kornia_augmentation()
        return K.RandomHorizontalFlip(p=self.p)


class Normalize(BatchAugment):
    """``(x − mean) / std`` per channel, with mean and std on the 0–1 scale. uint8 input is
    converted in the same pass (one multiply-subtract), so a uint8 batch becomes float32 once."""

    def __init__(self, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD) -> None:
        super().__init__(1.0)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or any(s <= 0 for s in self.std):
            raise AugmentInputError(
                f"Normalize: expected as many means as stds, stds > 0; got {mean}, {std}")

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        return {}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if x.shape[1] != len(self.mean):
            raise AugmentInputError(
                f"Normalize: {len(self.mean)} means for {x.shape[1]} channels (shape {tuple(x.shape)})")
        scale = 1 / (255.0 if x.dtype == torch.uint8 else 1.0)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        # copy=True: a float32 input must not be normalised in place under the caller
        out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        return out.mul_(scale / std).sub_(mean / std)

    def kornia_module(self) -> torch.nn.Module:
        K = kornia_augmentation()
        return K.Normalize(mean=torch.tensor(self.mean), std=torch.tensor(self.std))


class ColorJitter(BatchAugment):
    """Random brightness, contrast, saturation and hue per sample (torchvision's arguments), in
    a random order drawn per batch.

    All four are affine maps of the RGB vector (hue as a rotation about the grey axis in YIQ
    space, a cheap stand-in for torchvision's HSV shift), so they compose into one 3×3 matrix and
    offset per sample, applied in one batched matmul and clamped to [0, 1] once at the end
    (torchvision clamps after each step: results differ only where a step saturates).
    """

    channels = (3,)

    def __init__(self, brightness: float | tuple[float, float] = 0.0,
                 contrast: float | tuple[float, float] = 0.0,
                 saturation: float | tuple[float, float] = 0.0,
                 hue: float | tuple[float, float] = 0.0, p: float = 1.0) -> None:
        super().__init__(p)
        self.brightness = factor_range(brightness, "brightness")
        self.contrast = factor_range(contrast, "contrast")
        self.saturation = factor_range(saturation, "saturation")
        self.hue = factor_range(hue, "hue", centre=0.0, bound=(-0.5, 0.5))

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        n, dev = len(x), x.device
        return {
            "brightness": uniform(n, *self.brightness, generator, dev),
            "contrast": uniform(n, *self.contrast, generator, dev),
            "saturation": uniform(n, *self.saturation, generator, dev),
            "hue": uniform(n, *self.hue, generator, dev),
            "order": torch.randperm(4, generator=generator, device=dev),
            "applied": self.applied(n, generator, dev),
        }

    def matrices(self, mean_rgb: torch.Tensor, params: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample ``M`` (n×3×3) and ``t`` (n×3) such that the jitter is ``clamp(M·rgb + t)``
        for images on the 0–1 scale whose mean colours are ``mean_rgb`` (n×3)."""
        n, dev = len(mean_rgb), mean_rgb.device
        eye = torch.eye(3, device=dev).expand(n, 3, 3)
        gray = torch.tensor(GRAY, device=dev)
        yiq = torch.tensor(RGB_TO_YIQ, device=dev)
        m, t = eye.clone(), torch.zeros(n, 3, device=dev)
        # .tolist() of a 4-element index: the one host sync; the order is per batch
        for step in params["order"].tolist():
            if step == 0:
                a, b = eye * params["brightness"][:, None, None], torch.zeros_like(t)
            elif step == 1:  # contrast blends with the mean grey level of the image so far
                c = params["contrast"]
                level = (torch.einsum("bij,bj->bi", m, mean_rgb) + t) @ gray
                a, b = eye * c[:, None, None], ((1 - c) * level)[:, None].expand(n, 3)
            elif step == 2:
                s = params["saturation"][:, None, None]
                a, b = eye * s + (1 - s) * gray.expand(n, 3, 3), torch.zeros_like(t)
            else:
                theta = -params["hue"] * (2 * math.pi)  # so that a positive hue turns red towards yellow
                cos, sin = torch.cos(theta), torch.sin(theta)
                rot = torch.zeros(n, 3, 3, device=dev)
                rot[:, 0, 0], rot[:, 1, 1], rot[:, 2, 2] = 1, cos, cos
                rot[:, 1, 2], rot[:, 2, 1] = -sin, sin
                a, b = torch.linalg.solve(yiq, rot @ yiq), torch.zeros_like(t)
            m, t = a @ m, torch.einsum("bij,bj->bi", a, t) + b
        keep = ~params["applied"]
        m = torch.where(keep[:, None, None], eye, m)
        t = torch.where(keep[:, None], 0.0, t)
        return m, t

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        n, c, h, w = x.shape
        # channel planes, not pixel rows: a batched (3×3)·(3×HW) matmul over long rows, not
        # (HW×3)·(3×3) over rows 3 wide, so channels-last input is converted to NCHW here, once
        planes = x.to(torch.float32, memory_format=torch.contiguous_format).view(n, c, h * w)
        scale = 1 / 255 if x.dtype == torch.uint8 else 1.0
        m, t = self.matrices(planes.mean(dim=2) * scale, params)
        out = torch.baddbmm(t[:, :, None], m * scale, planes)  # the 0–255 scale folded into M
        return out.clamp_(0, 1).view(n, c, h, w)

    def kornia_module(self) -> torch.nn.Module:
        K = kornia_augmentation()
        return K.ColorJitter(self.brightness, self.contrast, self.saturation, self.hue, p=self.p)


class RandomErasing(BatchAugment):
    """Fill a random rectangle of each image with ``value`` with probability ``p``
    (torchvision's ``RandomErasing``: area a ``scale`` fraction of the image, aspect ratio
    log-uniform in ``ratio``; a rectangle that does not fit is clipped to the image instead of
    redrawn)."""

    def __init__(self, p: float = 0.5, scale: tuple[float, float] = (0.02, 0.33),
                 ratio: tuple[float, float] = (0.3, 3.3), value: float = 0.0) -> None:
        super().__init__(p)
        if not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]:
            raise AugmentInputError(
                f"RandomErasing: expected 0 < scale ≤ 1 and 0 < ratio, got {scale}, {ratio}")
        self.scale, self.ratio, self.value = tuple(scale), tuple(ratio), value

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        n, _, height, width = x.shape
        dev = x.device
        area = uniform(n, *self.scale, generator, dev) * (height * width)
        aspect = uniform(n, math.log(self.ratio[0]), math.log(self.ratio[1]), generator, dev).exp_()
        h = (area * aspect).sqrt_().round_().clamp_(1, height).long()
        w = (area / aspect).sqrt_().round_().clamp_(1, width).long()
        top = (torch.rand(n, generator=generator, device=dev) * (height - h + 1)).long()
        left = (torch.rand(n, generator=generator, device=dev) * (width - w + 1)).long()
        return {"top": top, "bottom": top + h, "left": left, "right": left + w,
                "applied": self.applied(n, generator, dev)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        _, _, height, width = x.shape
        ys = torch.arange(height, device=x.device)
        xs = torch.arange(width, device=x.device)
        rows = (ys >= params["top"][:, None]) & (ys < params["bottom"][:, None])
        cols = (xs >= params["left"][:, None]) & (xs < params["right"][:, None])
        mask = rows[:, None, :, None] & cols[:, None, None, :]
        mask &= params["applied"][:, None, None, None]
        return x.masked_fill(mask, self.value)

    def kornia_module(self) -> torch.nn.Module:
        K = kornia_augmentation()
        return K.RandomErasing(self.scale, self.ratio, value=self.value, p=self.p)

    def scaled(self, factor: float) -> RandomErasing:
        op = copy.copy(self)
        op.value = self.value * factor
        return op


class Cutout(RandomErasing):
    """Fill a ``size``×``size`` square centred at a uniformly random pixel (clipped at the
    borders) with ``value`` (DeVries & Taylor's cutout). kornia has no cutout: both backends
    use this implementation."""

    def __init__(self, size: int = 16, p: float = 1.0, value: float = 0.0) -> None:
        BatchAugment.__init__(self, p)
        if size < 1:
            raise AugmentInputError(f"Cutout size must be ≥ 1, got {size}")
        self.size, self.value = int(size), value

    def sample(self, x: torch.Tensor, generator: torch.Generator | None) -> Params:
        n, _, height, width = x.shape
        cy = torch.randint(height, (n,), generator=generator, device=x.device)
        cx = torch.randint(width, (n,), generator=generator, device=x.device)
        half = self.size // 2
        return {"top": (cy - half).clamp_(min=0), "bottom": (cy - half + self.size).clamp_(max=height),
                "left": (cx - half).clamp_(min=0), "right": (cx - half + self.size).clamp_(max=width),
                "applied": self.applied(n, generator, x.device)}

    def kornia_module(self) -> None:
        return None
