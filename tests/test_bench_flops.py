"""FLOPs of a training step, the target-GPU table, and the "would it wait for data?" estimate."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from packdata.bench.flops import GPUS, Target, count_flops, estimate, resolve_target
from packdata.bench.models import ResNet18, SmallTransformer
from packdata.bench.runner import Trainer
from packdata.errors import BenchError

CPU = torch.device("cpu")


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def test_linear_and_conv2d_forward_equal_the_formulas():
    b, i, o = 8, 100, 30
    assert forward_flops(nn.Linear(i, o), torch.randn(b, i)) == 2 * b * i * o
    b, cin, cout, k, h, w, stride, pad = 4, 3, 16, 5, 32, 30, 2, 1
    hout, wout = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    conv = nn.Conv2d(cin, cout, k, stride, pad)
    assert forward_flops(conv, torch.randn(b, cin, h, w)) == 2 * b * cout * hout * wout * cin * k * k


def test_a_training_step_counts_forward_and_backward():
    """One multiply-add is 2 FLOPs; backward computes the weight gradient (as many FLOPs as the
    forward) and no input gradient (the batch needs none): 2 × forward in all."""
    b, i, o = 8, 100, 30
    x, y = torch.randn(b, i), torch.randint(0, o, (b,))
    linear = count_flops(lambda: Trainer(nn.Linear(i, o), CPU)((x, y)), b)
    assert linear.per_step == 2 * (2 * b * i * o) and linear.reason is None
    assert linear.per_sample == 2 * (2 * i * o)  # per sample: the step over its 8 samples
    b, cin, cout, k = 4, 3, 8, 3
    conv_net = nn.Sequential(nn.Conv2d(cin, cout, k), nn.Flatten())
    images = torch.randn(b, cin, 10, 10)
    conv = count_flops(lambda: Trainer(conv_net, CPU)((images,)), b)
    assert conv.per_step == 2 * (2 * b * cout * 8 * 8 * cin * k * k)


def test_resnet18_matches_the_published_figure():
    """ResNet-18 (ImageNet stem) at 224×224: about 1.8 GMACs per image forward."""
    model = ResNet18(1000, stem="imagenet").to("meta")  # shapes only: no arithmetic is run
    macs = forward_flops(model, torch.empty(1, 3, 224, 224, device="meta")) / 2
    assert macs == pytest.approx(1.8e9, rel=0.02)


def test_attention_on_the_cpu_is_counted():
    """torch's counter has no formula for the CPU attention kernel; packdata adds one, so the
    built-in transformer is counted rather than refused."""
    ids = torch.randint(0, 1000, (2, 64))
    count = count_flops(lambda: Trainer(SmallTransformer(2, vocab_size=1000), CPU)(
        (ids, torch.ones_like(ids), torch.zeros(2, dtype=torch.long))), 2)
    assert count.per_step and count.per_step > 0, count.reason


def test_cpu_attention_equals_a_hand_count():
    """Scaled dot-product attention, by hand, per (batch, head): forward Q·Kᵀ and P·V are
    s×d×s multiply-adds each (2·s²·d FLOPs each); backward recomputes Q·Kᵀ (the flash kernel
    keeps no s×s matrix) and takes four products of the same size (dV = Pᵀ·dO, dP = dO·Vᵀ,
    dQ = dS·K, dK = dSᵀ·Q). 14·b·h·s²·d in all."""
    b, h, s, d = 2, 4, 16, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    count = count_flops(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward(), b)
    forward, backward = 2 * (2 * s * d * s), 5 * (2 * s * d * s)
    assert count.per_step == b * h * (forward + backward), count.reason


def test_models_that_cannot_be_counted_say_why():
    lstm = nn.LSTM(3, 8, batch_first=True)
    count = count_flops(lambda: Trainer(lstm, CPU)((torch.randn(2, 5, 3),)), 2)
    assert count.per_step is None and count.per_sample is None
    assert "rnn" in count.reason and "too low" in count.reason

    class Scale(nn.Module):  # elementwise only: no op with a formula
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w

    count = count_flops(lambda: Trainer(Scale(), CPU)((torch.randn(2, 4),)), 2)
    assert count.per_step is None and "no operation with a FLOP formula" in count.reason

    def broken():
        raise RuntimeError("custom kernel refuses\nsecond line")

    count = count_flops(broken, 2)
    assert count.reason == "FLOPs could not be counted (RuntimeError: custom kernel refuses)"


def test_targets_by_name_and_by_flops():
    assert set(GPUS) >= {"A100", "H100", "H200", "L4", "V100", "RTX 4090"}
    h100 = resolve_target("h100", amp=True)
    assert (h100.name, h100.precision, h100.peak_flops, h100.mfu) == ("H100", "bf16", 989.5e12, 0.4)
    assert resolve_target("H100").precision == "fp32"
    assert resolve_target("V100", amp=True).precision == "fp16"  # no bfloat16 on V100
    assert resolve_target("rtx-4090", mfu=1.0).name == "RTX 4090"
    given = resolve_target(flops=312e12, mfu=0.5)
    assert given.peak_flops == 312e12 and given.name == "a GPU of 312 TFLOP/s"
    assert resolve_target() is None


def test_bad_targets_are_clear_errors():
    with pytest.raises(BenchError, match="unknown; known GPUs: A100, H100, H200, L4, V100, "
                       "RTX 4090"):
        resolve_target("B300")
    for bad in (0.0, -0.1, 1.01, math.nan):
        with pytest.raises(BenchError, match=r"--mfu .*expected a share of the peak in \(0, 1\]"):
            resolve_target("A100", mfu=bad)
    with pytest.raises(BenchError, match="not both"):
        resolve_target("A100", flops=1e12)
    with pytest.raises(BenchError, match="--target-flops"):
        resolve_target(flops=-5.0)


def test_estimate_arithmetic():
    target = Target("H100", peak_flops=100e12, precision="bf16", mfu=0.5)
    slow = estimate(target, flops_per_sample=1e9, io_rate=20_000, model="resnet18")
    assert slow["gpu_samples_per_s"] == 50_000  # 0.5 × 100e12 / 1e9
    assert slow["wait_share"] == pytest.approx(0.6)  # 1 − 20,000 / 50,000
    assert slow["text"] == ("An H100 at 50% MFU (bf16) would consume about 50,000 samples/s of "
                            "this resnet18; your I/O delivers 20,000: it would wait for data "
                            "60% of the time.")
    fast = estimate(target, flops_per_sample=1e9, io_rate=100_000, model="resnet18")
    assert fast["wait_share"] == 0
    assert fast["text"].endswith("your I/O delivers 100,000: 2.0× that, so it would not wait "
                                 "for data.")
    assert estimate(Target("V100", 1e12, "fp16"), 1e9, 10)["text"].startswith("A V100 at 40%")
