"""The verdict in plain words, and advice drawn from the numbers. Pure functions of the timings,
so every sentence can be checked against fixed figures."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: I/O within this factor of training counts as balanced: either side can become the limit
MARGIN = 1.1
#: loop share of time waiting for data above which the loop is said to stall
STALL_SHARE = 0.15
#: the real loop at this share of training alone's rate or more: nothing waits for data
LOOP_MARGIN = 0.95


@dataclass(frozen=True)
class Facts:
    """What the verdict is drawn from: the three rates (samples/s) and the setup measured."""

    io_rate: float
    train_rate: float
    loop_rate: float | None = None
    load_share: float | None = None  # of the real loop's step time, 0…1
    device: str = "cpu"  # "cpu" or "cuda"
    format: str = "lmdb"  # a container name or "folder"
    encoded: bool = False  # records hold file bytes decoded at every load
    num_workers: int = 0
    cores: int = 1
    pin_memory: bool = False
    batch_size: int = 256
    amp: bool = False
    augmented: bool = False  # the I/O side ran the user's augmentation
    feeder: bool = False  # the loader read in its feeder process, off the training thread

    @property
    def ratio(self) -> float:
        """I/O rate over training rate: above 1, I/O outruns training."""
        return self.io_rate / self.train_rate if self.train_rate > 0 else math.inf


def verdict(f: Facts) -> str:
    """A few sentences: whether the real loop waits for data and how much of each step, why
    (I/O slower than training, or the loader's work on the training thread), and I/O alone
    against training alone. Without a real loop, the comparison of the two alone."""
    r = f.ratio
    who, who_ = ("the GPU", "The GPU") if f.device == "cuda" else ("training", "Training")
    if not f.train_rate > 0:  # NaN too: nothing to compare I/O with (no "inf×")
        return "No verdict: training processed no samples in the time allowed."
    if not f.io_rate > 0:
        return "I/O-bound: the loader delivered no samples in the time allowed."
    if r >= MARGIN:
        alone = f"I/O alone delivers {r:.1f}× what training consumes"
    elif r > 1 / MARGIN:
        alone = (f"Balanced: I/O alone delivers {r:.2f}× what training consumes; any slower "
                 "storage or extra loading work will stall training")
    else:
        alone = (f"I/O-bound: training could take {1 / r:.1f}× more samples/s than I/O delivers "
                 f"({f.io_rate:,.0f} vs {f.train_rate:,.0f} samples/s)")
    if f.loop_rate is None or not f.loop_rate > 0:
        if r >= MARGIN:
            return f"{alone}: {who} need not wait for data (the real loop was not measured)."
        return alone + "."
    share = f.loop_rate / f.train_rate
    loop = (f"the real loop runs at {f.loop_rate:,.0f} samples/s, {share:.2f}× training alone"
            + ("" if f.load_share is None else
               f", {f.load_share:.0%} of each step spent taking the next batch"))
    if share >= LOOP_MARGIN:
        text = f"{who_} does not wait for data: {loop}. {alone}."
    else:
        why = ("I/O is the limit" if r < MARGIN else
               "I/O alone is fast enough, so what is lost is the loader's work on the training "
               "thread" + (" and its competition for the same CPU cores"
                           if f.device == "cpu" else ""))
        text = (f"{who_} waits for data {1 - share:.0%} of each step: {loop}. "
                f"{alone}; {why}.")
    serial = 1 / (1 / f.io_rate + 1 / f.train_rate)
    if f.device == "cpu" and f.loop_rate < 0.8 * serial:
        # slower than loading then training one after the other: they fight for cores
        text += (f" That is below the {serial:,.0f} samples/s of loading and training run "
                 "one after the other: they compete for the same CPU cores.")
    return text


def advice(f: Facts) -> list[str]:
    """Concrete next steps, most useful first; empty when there is nothing to gain."""
    r = f.ratio
    tips: list[str] = []
    if r < MARGIN:
        if f.format == "folder":
            tips.append("Convert to a packed format (`packdata convert SRC out.lmdb`): opening "
                        "and decoding one file per sample is the slowest way to read; "
                        "`packdata bench SRC --compare` measures every container.")
        if f.encoded:
            tips.append("Store decoded pixels (`packdata convert --encoding raw`): these records "
                        "are decoded on the CPU at every load.")
        if (f.format == "folder" or f.encoded) and f.num_workers < f.cores:
            need = min(f.cores, max(f.num_workers, 1) * math.ceil(1 / max(r, 1e-9)))
            tips.append(f"More DataLoader workers: num_workers={max(need, f.num_workers + 1)} "
                        f"(now {f.num_workers}, {f.cores} cores): per-sample decoding spreads "
                        "over processes (`--sweep` measures each setting).")
        if f.format != "folder" and not f.encoded and f.num_workers > 0:
            tips.append(f"Try num_workers=0 (now {f.num_workers}): handing raw packed batches "
                        "between processes costs more than reading them.")
        if f.device == "cuda" and not f.pin_memory:
            tips.append("Pin memory (pin_memory=True) and copy with non_blocking=True, so "
                        "host-to-device copies overlap GPU work.")
        if f.batch_size < 128:
            tips.append(f"Larger batches (now {f.batch_size}): per-batch costs (sampling, "
                        "worker hand-off, copy launch) spread over more samples.")
        if f.augmented:
            tips.append("Augment whole batches on the GPU (packdata.augment on the device "
                        "batch) rather than per sample in the loader; this I/O rate includes "
                        "the augmentation, measured where it ran here.")
        else:
            tips.append("Move augmentation to the GPU: augment whole batches on the device "
                        "(packdata.augment) rather than per sample in the loader. These I/O "
                        "figures are without augmentation (--augment adds it), so a pipeline "
                        "that augments on the CPU is slower still.")
        return tips
    loses = f.loop_rate is not None and f.loop_rate < LOOP_MARGIN * f.train_rate
    if loses or (f.load_share is not None and f.load_share > STALL_SHARE):
        if f.feeder:
            pin = ("" if f.pin_memory or f.device != "cuda" else
                   "pin memory (pin_memory=True) so copies are DMA, and ")
            tips.append("I/O alone is fast enough, yet the real loop loses time to data: the "
                        "loader reads in its feeder process, so what is left on the training "
                        "thread is taking each batch, its copy to the device and the "
                        f"augmentation's launches; {pin}keep the augmentation to few batched "
                        "operations.")
        else:
            tips.append("I/O alone is fast enough, yet the real loop waits for data: loading is "
                        "not overlapped with training. Read off the training thread: "
                        "packdata.loader's feeder process (its default for packed datasets), or "
                        "num_workers ≥ 1 for a per-file Dataset.")
    if f.device == "cuda" and not f.amp:
        tips.append("Training is the limit: try mixed precision (--amp); faster storage will "
                    "not help until training is faster.")
    elif r >= MARGIN:
        tips.append("Training is the limit: faster storage will not speed this up; spend effort "
                    "on the model step (mixed precision, channels_last, torch.compile).")
    if r > 3 and f.num_workers > 1:
        tips.append(f"I/O has {r:.1f}× headroom: fewer workers (num_workers={f.num_workers // 2}) "
                    "leave CPU cores to the rest of the job.")
    return tips
