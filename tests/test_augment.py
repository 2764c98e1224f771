"""Batched augmentations on real CIFAR-10 images: statistics, bounds, seeds, devices, errors."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

import packdata
from packdata.augment import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    AugmentInputError,
    ColorJitter,
    Compose,
    Cutout,
    Normalize,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
    cifar_recipe,
    kornia_available,
    resolve_backend,
)
from packdata.bench.baselines import ClassicCifarTransform


@pytest.fixture(scope="module")
def images(packed) -> torch.Tensor:
    """120 real CIFAR images, uint8 B×3×32×32 in channels-last memory, as stored."""
    ds = packdata.open(packed["lmdb"], channels_last=True)
    return ds[list(range(len(ds)))][0]


@pytest.fixture(scope="module")
def many(images) -> torch.Tensor:
    return images.repeat(20, 1, 1, 1)  # 2,400 samples for rates


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_flip_rate_near_p_and_each_output_is_the_image_or_its_mirror(many, layout):
    if layout == "contiguous":
        many = many.contiguous()
    flip = RandomHorizontalFlip(p=0.3)
    out = flip(many, generator=torch.Generator().manual_seed(1))
    same = (out == many).flatten(1).all(1)
    mirrored = (out == many.flip(-1)).flatten(1).all(1)
    assert bool((same | mirrored).all())
    rate = float(mirrored.float().mean())
    assert abs(rate - 0.3) < 4 * (0.3 * 0.7 / len(many)) ** 0.5  # within 4 sigma
    assert torch.equal(mirrored, flip.last_params["flip"])


def test_crop_is_a_window_of_the_zero_padded_image(images):
    crop = RandomCrop(32, padding=4)
    out = crop(images, generator=torch.Generator().manual_seed(2))
    top, left = crop.last_params["top"], crop.last_params["left"]
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert int(top.min()) >= 0 and int(top.max()) <= 8 and int(left.max()) <= 8
    padded = F.pad(images, (4, 4, 4, 4))
    for i in range(len(images)):
        t, lf = int(top[i]), int(left[i])
        assert torch.equal(out[i], padded[i, :, t : t + 32, lf : lf + 32])
    assert len(torch.unique(top)) > 5  # offsets spread over the 9 positions


def test_crop_to_a_smaller_size_and_float_input(images):
    x = images.float() / 255
    crop = RandomCrop((24, 20), padding=0)
    out = crop(x, generator=torch.Generator().manual_seed(3))
    t, lf = int(crop.last_params["top"][0]), int(crop.last_params["left"][0])
    assert out.shape == (len(x), 3, 24, 20)
    assert torch.equal(out[0], x[0, :, t : t + 24, lf : lf + 20])


def test_normalise_gives_zero_mean_unit_std(images):
    x = images.float() / 255
    mean, std = x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3))
    out = Normalize(mean.tolist(), std.tolist())(images)  # uint8 in: conversion fused
    assert out.dtype == torch.float32
    assert torch.allclose(out.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(out.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)
    assert torch.allclose(Normalize(mean.tolist(), std.tolist())(x), out, atol=1e-5)


def test_colour_jitter_factors_match_their_definitions(images):
    x = images.float() / 255
    gen = torch.Generator().manual_seed(4)
    bright = ColorJitter(brightness=(1.3, 1.3))(images, generator=gen)
    assert torch.allclose(bright, (x * 1.3).clamp(0, 1), atol=1e-5)
    gray = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    luma = (x * gray).sum(1, keepdim=True)
    desat = ColorJitter(saturation=(0.0, 0.0))(images, generator=gen)
    assert torch.allclose(desat, luma.expand_as(x), atol=1e-5)
    contrast = ColorJitter(contrast=(0.5, 0.5))(images, generator=gen)
    level = luma.mean(dim=(2, 3), keepdim=True)
    assert torch.allclose(contrast, (0.5 * x + 0.5 * level).clamp(0, 1), atol=1e-5)
    hue = ColorJitter(hue=(0.25, 0.25))(images, generator=gen)
    inside = ((hue > 0) & (hue < 1)).all(1, keepdim=True)  # unclamped pixels keep their luma
    hue_luma = (hue * gray).sum(1, keepdim=True)
    assert torch.allclose(hue_luma[inside], luma[inside], atol=1e-4)
    assert not torch.allclose(hue, x, atol=0.05)
    same = ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.0)(images, generator=gen)
    assert torch.allclose(same, x)


def test_random_erasing_fills_one_rectangle_and_cutout_a_clipped_square(images):
    x = images.float() / 255 + 0.01  # no true zeros, so erased pixels are exactly the zeros
    erase = RandomErasing(p=1.0, value=0.0)
    out = erase(x, generator=torch.Generator().manual_seed(5))
    zero = (out == 0).all(1)
    p = erase.last_params
    area = (p["bottom"] - p["top"]) * (p["right"] - p["left"])
    assert torch.equal(zero.sum(dim=(1, 2)), area)
    assert float((area.float() / 1024).min()) >= 0.01 and float((area.float() / 1024).max()) <= 0.4
    cut = Cutout(16)
    out = cut(x, generator=torch.Generator().manual_seed(6))
    sides = (cut.last_params["bottom"] - cut.last_params["top"])
    assert int(sides.max()) == 16 and int(sides.min()) >= 8  # clipped at the borders
    assert torch.equal(RandomErasing(p=0.0)(x), x)


def test_recipe_same_seed_same_output_and_replay(images):
    a = cifar_recipe(jitter=0.4, cutout=8, seed=7, backend="torch")
    b = cifar_recipe(jitter=0.4, cutout=8, seed=7, backend="torch")
    first = a(images)
    assert torch.equal(first, b(images))
    assert torch.equal(a(images), b(images))  # the sequence replays too
    assert not torch.equal(first, a(images))
    assert not torch.equal(first, a.manual_seed(8)(images))
    assert torch.equal(a.manual_seed(7)(images), first)
    op = RandomCrop(32, padding=4)
    out = op(images)
    assert torch.equal(op(images, params=op.last_params), out)


def test_output_is_float_on_the_input_device_and_standardised(many):
    out = cifar_recipe(seed=0, backend="torch")(many)
    assert out.dtype == torch.float32 and out.device == many.device and out.shape == many.shape
    # CIFAR statistics, lowered by the zero padding the crops bring in: near 0 and 1
    assert out.mean(dim=(0, 2, 3)).abs().max() < 0.4
    assert ((out.std(dim=(0, 2, 3)) - 1).abs() < 0.3).all()
    assert Compose([RandomHorizontalFlip()], backend="torch")(many).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_output_stays_on_the_gpu(images):
    x = images.cuda()
    out = cifar_recipe(jitter=0.4, cutout=8, seed=0, backend="torch")(x)
    assert out.device == x.device
    assert torch.equal(cifar_recipe(seed=1, backend="torch")(x),
                       cifar_recipe(seed=1, backend="torch")(x))


def test_kornia_backend_runs_the_same_recipe_reproducibly(many):
    pytest.importorskip("kornia")
    a = cifar_recipe(jitter=0.4, seed=3, backend="kornia")(many)
    b = cifar_recipe(jitter=0.4, seed=3, backend="kornia")(many)
    assert torch.equal(a, b) and a.dtype == torch.float32
    ours = cifar_recipe(jitter=0.4, seed=3, backend="torch")(many)
    assert (a.mean(dim=(0, 2, 3)) - ours.mean(dim=(0, 2, 3))).abs().max() < 0.1
    assert (a.std(dim=(0, 2, 3)) - ours.std(dim=(0, 2, 3))).abs().max() < 0.1


def test_batched_recipe_matches_the_classic_per_sample_recipe_in_distribution(many):
    torch.manual_seed(0)
    classic = ClassicCifarTransform(CIFAR10_MEAN, CIFAR10_STD)
    ref = torch.stack([classic(x) for x in many[:600]])
    ours = cifar_recipe(seed=0, backend="torch")(many[:600])
    assert (ref.mean(dim=(0, 2, 3)) - ours.mean(dim=(0, 2, 3))).abs().max() < 0.05
    assert (ref.std(dim=(0, 2, 3)) - ours.std(dim=(0, 2, 3))).abs().max() < 0.05


@pytest.mark.parametrize("bad, expected", [
    (lambda x: x.numpy(), "torch.Tensor"),
    (lambda x: x[0], "4 dimensions"),
    (lambda x: x.to(torch.int32), "uint8"),
    (lambda x: x.permute(0, 2, 3, 1), "channels-last"),
    (lambda x: x[:, :2], "1 or 3 channels"),
])
def test_bad_input_says_what_was_expected(images, bad, expected):
    with pytest.raises(AugmentInputError, match=expected) as info:
        cifar_recipe(backend="torch")(bad(images))
    assert isinstance(info.value, ValueError) and isinstance(info.value, packdata.PackdataError)


def test_bad_arguments_and_missing_kornia(monkeypatch):
    with pytest.raises(AugmentInputError, match="backend"):
        resolve_backend("jax")
    with pytest.raises(AugmentInputError, match="p must be"):
        RandomHorizontalFlip(p=1.5)
    with pytest.raises(AugmentInputError, match="larger than the padded"):
        RandomCrop(48)(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(AugmentInputError, match="3 channels"):
        ColorJitter(0.4)(torch.zeros(2, 1, 8, 8))
    monkeypatch.setitem(sys.modules, "kornia", None)  # import kornia now raises ImportError
    monkeypatch.setitem(sys.modules, "kornia.augmentation", None)
    assert resolve_backend("auto") == "torch"
    with pytest.raises(packdata.MissingExtraError, match=r'packdata\[gpu\]'):
        resolve_backend("kornia")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("op", [RandomCrop(32, padding=4), RandomHorizontalFlip(1.0),
                                ColorJitter(0.4, 0.4, 0.4, 0.1), Normalize(), RandomErasing(1.0),
                                Cutout(8)], ids=lambda op: type(op).__name__)
def test_ops_leave_their_input_untouched(images, op, dtype):
    x = images if dtype == torch.uint8 else (images.float() / 255).contiguous()
    before = x.clone()
    op(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, before)


def test_seeded_pipeline_draws_differently_in_each_dataloader_worker(packed):
    """The same 16 images as two batches, one per worker: forked workers must not replay one
    generator state (identical crops and flips), and the run must repeat for the same seed."""

    def run() -> list[torch.Tensor]:
        ds = packdata.open(packed["lmdb"], batch_transform=cifar_recipe(seed=3, backend="torch"))
        same = list(range(16))
        return [b[0] for b in packdata.loader(ds, batch_sampler=[same, same], num_workers=2)]

    first, second = run()
    assert not torch.equal(first, second)
    assert all(torch.equal(a, b) for a, b in zip(run(), (first, second)))


# kornia is an extra ([gpu]; CI installs it): where it is missing, its rows skip, saying so
BACKENDS = ["torch", pytest.param("kornia", marks=pytest.mark.skipif(
    not kornia_available(), reason="kornia is not installed (pip install 'packdata[gpu]')"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_positive_hue_turns_red_towards_yellow_as_torchvision_does(backend):
    red = torch.zeros(4, 3, 8, 8)
    red[:, 0] = 1.0
    out = Compose([ColorJitter(hue=(0.1, 0.1))], seed=0, backend=backend)(red)
    green, blue = out[:, 1].mean(), out[:, 2].mean()
    assert green > blue + 0.2 and blue < 0.05  # before the fix: magenta


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_pipeline_returns_float32_for_any_float_input(images, dtype):
    out = cifar_recipe(seed=0, backend="torch")(images.to(dtype) / 255)
    assert out.dtype == torch.float32 and out.shape == images.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_and_erase_values_are_in_the_inputs_units_for_both_backends(images, backend):
    ops = [RandomCrop(32, padding=8, fill=255), RandomErasing(1.0, scale=(0.3, 0.3), value=255)]
    out = Compose(ops, seed=0, backend=backend)(images)  # uint8: 255 is white, 1.0 out
    assert out.max() <= 1.0 and (out == 1.0).float().mean() > 0.2


def test_auto_runs_the_backend_measured_fastest_on_the_batch_device():
    from packdata.augment.compose import AUTO_BACKEND

    assert AUTO_BACKEND["cpu"] == "torch" and resolve_backend("auto", "cpu") == "torch"
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    auto = cifar_recipe(seed=3, backend="auto")
    assert auto.backend == "auto"
    assert torch.equal(auto(x), cifar_recipe(seed=3, backend="torch")(x))


@pytest.mark.parametrize("size", ["a", 2.5, (24, "x"), (0, 24)])
def test_a_crop_size_that_is_not_a_pair_of_positive_integers_is_refused(size):
    with pytest.raises(AugmentInputError, match="RandomCrop size"):  # 'a' failed unpacking
        RandomCrop(size)
