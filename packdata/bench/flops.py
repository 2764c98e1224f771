"""FLOPs of one training step, and whether a GPU that is not here would wait for data.

:func:`count_flops` counts one forward + backward with ``torch.utils.flop_counter.FlopCounterMode``
(2 FLOPs per multiply-add, as GPU datasheets count them). :func:`resolve_target` turns
``--target-gpu`` or ``--target-flops`` and ``--mfu`` into a :class:`Target`; :func:`estimate`
sets the sample rate that GPU would consume on the model against the measured I/O rate. The
arithmetic is pure, so every figure can be checked against fixed numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop, sdpa_flop

from packdata.errors import BenchError

#: peak dense (no sparsity) throughput in TFLOP/s per precision, from each vendor datasheet.
#: "fp32" is the plain FP32 rate (torch's default for matmuls), "bf16"/"fp16" the tensor-core rate
#: with FP32 accumulation; datasheets that print the sparse figure are halved.
GPUS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): FP32 19.5, TF32 156, BF16/FP16 312
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): FP32 67, TF32 989*, BF16/FP16 1,979*
    # (*with sparsity; dense is half)
    "H100": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67, TF32 989*, BF16/FP16 1,979*
    # (*with sparsity; dense is half)
    "H200": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120*, BF16/FP16 242* (*with sparsity)
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    # NVIDIA Tesla V100 GPU datasheet (SXM2): FP32 15.7, Tensor (FP16) 125; no bfloat16
    "V100": {"fp32": 15.7, "fp16": 125.0},
    # NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table for GeForce RTX 4090: FP32
    # 82.6, TF32 82.6, FP16/BF16 tensor with FP32 accumulate 165.2 (dense)
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
}

#: aten ops that do the bulk of a model's arithmetic: if one of them runs without a formula in
#: torch's counter, the count would be too low, so no estimate is made from it
HEAVY_OP = re.compile(r"mm|mv\b|dot|conv|attention|rnn|lstm|gru|einsum|matmul|linear")


def _cpu_flash_forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                       **kwargs: Any) -> int:
    return sdpa_flop(query, key, value)  # shapes: the counter passes shapes, not tensors


def _cpu_flash_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                        out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop(grad_out, query, key, value)


#: attention on the CPU, which torch's counter does not list (the same arithmetic as on a GPU)
EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {}
for _name, _formula in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash_forward),
                        ("_scaled_dot_product_flash_attention_for_cpu_backward",
                         _cpu_flash_backward)):
    if hasattr(torch.ops.aten, _name):
        EXTRA_FORMULAS[getattr(torch.ops.aten, _name)] = _formula


class _OpRecorder(TorchDispatchMode):
    """Every aten op that runs, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one training step (forward + backward) on one batch, or why there is no count."""

    per_step: int | None
    batch_size: int
    reason: str | None = None  # set when per_step is None

    @property
    def per_sample(self) -> float | None:
        return None if self.per_step is None else self.per_step / self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return {"per_step": self.per_step, "per_sample": self.per_sample,
                "batch_size": self.batch_size, "reason": self.reason}


def count_flops(step: Callable[[], Any], batch_size: int) -> FlopCount:
    """Run ``step`` (one forward + backward) once under the FLOP counter.

    The count is refused, with a one-line reason, when the step fails under the counter, when
    no op with a known formula runs, or when an arithmetic-heavy op without one runs (the count
    would be too low): never a wrong number.
    """
    counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
    recorder = _OpRecorder()
    try:
        with counter, recorder:
            step()
    except Exception as exc:  # any op of any model may refuse the dispatch mode
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return FlopCount(None, batch_size, f"FLOPs could not be counted "
                         f"({type(exc).__name__}: {first[:200]})")
    known = set(flop_registry) | set(EXTRA_FORMULAS)
    unknown = sorted(str(op) for op in recorder.ops
                     if op not in known and HEAVY_OP.search(str(op).removeprefix("aten.")))
    if unknown:
        return FlopCount(None, batch_size, f"the step runs {', '.join(unknown)}, whose FLOPs "
                         "torch's FLOP counter does not know: a count would be too low")
    total = counter.get_total_flops()
    if total <= 0:
        return FlopCount(None, batch_size, "no operation with a FLOP formula (matrix product, "
                         "convolution, attention) ran in the step")
    return FlopCount(int(total), batch_size)


def gpu_names() -> str:
    return ", ".join(GPUS)


def _key(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).lower()


@dataclass(frozen=True)
class Target:
    """A GPU to estimate for: its name, peak FLOP/s at the precision used, and the share of
    that peak the model is expected to reach (model FLOPs utilisation)."""

    name: str
    peak_flops: float  # FLOP/s
    precision: str
    mfu: float = 0.4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_mfu(mfu: float) -> float:
    if not 0 < mfu <= 1 or math.isnan(mfu):
        raise BenchError(f"--mfu {mfu}: expected a share of the peak in (0, 1], e.g. 0.4")
    return mfu


def resolve_target(gpu: str | None = None, flops: float | None = None, mfu: float = 0.4,
                   amp: bool = False) -> Target | None:
    """The target from ``--target-gpu NAME`` (the table's rate for bf16, or fp16 on GPUs
    without it, under ``amp``; fp32 otherwise) or ``--target-flops`` (FLOP/s); None when
    neither is given."""
    check_mfu(mfu)
    if gpu is not None and flops is not None:
        raise BenchError("give --target-gpu or --target-flops, not both")
    if flops is not None:
        if not 0 < flops < math.inf:
            raise BenchError(f"--target-flops {flops}: expected the peak FLOP/s, e.g. 312e12")
        return Target(f"a GPU of {flops / 1e12:g} TFLOP/s", flops, "as given", mfu)
    if gpu is None:
        return None
    by_key = {_key(name): name for name in GPUS}
    name = by_key.get(_key(gpu))
    if name is None:
        raise BenchError(f"--target-gpu '{gpu}': unknown; known GPUs: {gpu_names()} "
                         "(or give its peak with --target-flops)")
    rates = GPUS[name]
    precision = ("bf16" if "bf16" in rates else "fp16") if amp else "fp32"
    return Target(name, rates[precision] * 1e12, precision, mfu)


def estimate(target: Target, flops_per_sample: float, io_rate: float,
             model: str = "model") -> dict[str, Any]:
    """The sample rate ``target`` would consume on the model (``mfu × peak / FLOPs per
    sample``), the measured I/O rate beside it, the share of time the GPU would wait for data
    (``1 − io / gpu`` when I/O is slower, else 0) and the sentence saying so."""
    gpu_rate = target.mfu * target.peak_flops / flops_per_sample
    wait = max(0.0, 1 - io_rate / gpu_rate) if gpu_rate > 0 else 0.0
    who = target.name if target.name.startswith("a ") else f"an {target.name}" \
        if target.name[0] in "AEFHILMNORSX" else f"a {target.name}"
    text = (f"{who[0].upper()}{who[1:]} at {target.mfu:.0%} MFU ({target.precision}) would consume about "
            f"{gpu_rate:,.0f} samples/s of this {model}; your I/O delivers {io_rate:,.0f}: ")
    if wait > 0:
        text += f"it would wait for data {wait:.0%} of the time."
    else:
        text += f"{io_rate / gpu_rate:.1f}× that, so it would not wait for data."
    return {"target": target.to_dict(), "flops_per_sample": flops_per_sample,
            "gpu_samples_per_s": gpu_rate, "io_samples_per_s": io_rate, "wait_share": wait,
            "text": text}
