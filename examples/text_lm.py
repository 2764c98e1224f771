"""A small causal transformer language model: per-item tokenising against packdata.

    python examples/text_lm.py --data path/to/texts --tokenizer tokenizer.json --epochs 2

``--data`` is a folder of UTF-8 ``*.txt`` files (searched recursively, sorted). Each non-blank
line is one sequence, marked ``<bos> … <eos>`` and cut to ``--max-length`` ids; every 10th line
is held out. Lines are short and of very different lengths (PEPs: 1–70 GPT-2 tokens), which is
where batching by length matters. ``--tokenizer`` is a Hugging Face ``tokenizer.json`` read from
disk (or ``bytes``, packdata's built-in UTF-8 byte tokeniser).

- baseline: the usual Dataset — the lines are read once, each is tokenised in ``__getitem__``,
  and every batch (random order) is padded to its longest line.
- packdata: the folder converted once (time reported apart) into unpadded token records, batched
  by :class:`packdata.LengthBucketBatchSampler` and padded by :class:`packdata.PadCollate`.

The model and its loss are the same on both paths: logits at every position, cross-entropy on
the real (non-pad) next tokens only. Reported per epoch: training loss per real token, held-out
loss per real token, real tokens per second and the share of pad positions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

import packdata  # noqa: E402
from packdata.loading.collate import pad_collate  # noqa: E402
from packdata.prep.tokenizers import load_tokenizer  # noqa: E402


class CausalLM(nn.Module):
    """Token + learned position embeddings, a pre-norm causal encoder, a tied output layer."""

    def __init__(self, vocab_size: int, max_length: int, dim: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_length, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        for table in (self.embed, self.pos):  # GPT-2's scale: logits start near uniform
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(length, device=ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        x = self.blocks(x, mask=causal, is_causal=True)
        return self.norm(x) @ self.embed.weight.T


def lm_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the real next tokens, and how many there are."""
    logits = model(ids[:, :-1])
    target = ids[:, 1:].masked_fill(~mask[:, 1:], -100)  # pad positions are not predicted
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, int(mask[:, 1:].sum())


def read_lines(folder: Path) -> list[str]:
    """Every non-blank line of every ``*.txt`` under ``folder``, files sorted."""
    lines = []
    for path in sorted(folder.rglob("*.txt")):
        lines += [raw.decode("utf-8") for raw in path.read_bytes().splitlines() if raw.strip()]
    return lines


class LineDataset(Dataset):
    """Tokenise one line per access: ``<bos> ids <eos>``, cut to ``max_length``."""

    def __init__(self, lines: list[str], tokenizer_path: str, max_length: int) -> None:
        self.lines, self.tokenizer_path, self.max_length = lines, tokenizer_path, max_length
        self.tokenizer: Any = None

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            if self.tokenizer_path == "bytes":
                self.tokenizer = "bytes"
            else:
                from tokenizers import Tokenizer

                self.tokenizer = Tokenizer.from_file(self.tokenizer_path)
                self.tokenizer.no_truncation()
                self.tokenizer.no_padding()
        if self.tokenizer == "bytes":
            return list(text.encode("utf-8"))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = self._encode(self.lines[i])[: self.max_length - 2]
        return torch.tensor([self.bos, *ids, self.eos], dtype=torch.int64)


class BucketSubset(torch.utils.data.Sampler[list[int]]):
    """:class:`packdata.LengthBucketBatchSampler` over a subset of the records."""

    def __init__(self, indices: np.ndarray, lengths: np.ndarray, batch_size: int, seed: int,
                 shuffle: bool = True) -> None:
        self.indices = np.asarray(indices)
        self.inner = packdata.LengthBucketBatchSampler(lengths[self.indices], batch_size,
                                                       seed=seed, shuffle=shuffle,
                                                       rank=0, world_size=1)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def padding_fraction(self, epoch: int) -> float:
        return self.inner.padding_fraction(epoch)

    def __iter__(self):
        for batch in self.inner:
            yield self.indices[batch].tolist()

    def __len__(self) -> int:
        return len(self.inner)


def convert(args: Any, workdir: Path) -> tuple[packdata.PackedDataset, float | None]:
    return common.convert_once(
        workdir / f"lines-{args.max_length}.h5",
        lambda: packdata.open_source(args.data, kind="text", tokenizer=args.tokenizer,
                                     per_line=True, add_bos=True, add_eos=True,
                                     max_length=args.max_length))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.split("\n")[0], batch_size=64, epochs=2)
    p.add_argument("--tokenizer", default="bytes",
                   help="a tokenizer.json file, or 'bytes' (default)")
    p.add_argument("--max-length", type=int, default=128, help="ids per line at most")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    common.check_kind(args.data, "text", "a folder of UTF-8 .txt files")
    device = common.device_of(args.device)
    tokenizer = load_tokenizer(args.tokenizer)
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else eos
    lines = read_lines(args.data)
    if not lines:
        raise common.ExampleError(f"{args.data}: no non-blank line in any .txt file")
    train_idx, test_idx = common.split_indices(len(lines))
    results: dict[str, list[dict[str, Any]]] = {}
    extra: dict[str, Any] = {"lines": len(lines), "vocab_size": tokenizer.vocab_size}

    with common.workdir_of(args) as workdir:
        runs = {}
        for name in common.loaders_of(args.loader):
            sampler = None
            if name == "baseline":
                ds = LineDataset(lines, str(args.tokenizer), args.max_length)
                ds.bos, ds.eos = bos, eos
                g = torch.Generator().manual_seed(args.seed)
                options = {"num_workers": args.workers, "persistent_workers": args.workers > 0,
                           "collate_fn": PadToLongest(pad_id)}
                train = DataLoader(torch.utils.data.Subset(ds, train_idx.tolist()),
                                   args.batch_size, shuffle=True, generator=g, **options)
                test = DataLoader(torch.utils.data.Subset(ds, test_idx.tolist()), 256, **options)
            else:
                pds, seconds = convert(args, workdir)
                extra["convert_seconds"] = seconds
                if len(pds) != len(lines):
                    raise common.ExampleError(f"{args.data}: the container holds {len(pds)} lines, "
                                              f"the files {len(lines)}")
                lengths = pds.lengths()
                sampler = BucketSubset(train_idx, lengths, args.batch_size, args.seed)
                collate = packdata.PadCollate(pad_id)
                train = packdata.loader(pds, batch_sampler=sampler, collate=collate, device=device)
                test = packdata.loader(pds, batch_sampler=BucketSubset(test_idx, lengths, 256, 0, False),
                                       collate=collate, device=device)
            runs[name] = make_run(args, device, tokenizer.vocab_size, train, test, sampler)
        results = common.train_interleaved(runs, args.epochs, device)
    print_test_losses(results)
    return common.finish("text_lm", args, device, results, extra)


class PadToLongest:
    """The baseline's collate: pad each batch to its longest line (picklable for workers)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_collate(seqs, self.pad_id)


def make_run(args: Any, device: torch.device, vocab_size: int, train: Any, test: Any,
             sampler: Any) -> common.Run:
    """A fresh model (the same initial weights for every loader) and its training step."""
    torch.manual_seed(args.seed)
    model = CausalLM(vocab_size, args.max_length, dim=args.dim).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    positions = [0]  # token positions computed this epoch, pads included

    def step(batch: Any) -> common.StepResult:
        ids, mask = (t.to(device, non_blocking=True) for t in batch)
        loss, n = lm_loss(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        (loss / max(n, 1)).backward()
        opt.step()
        positions[0] += mask.numel()
        return loss.item(), n, None

    def before_epoch(epoch: int) -> None:
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        positions[0] = 0

    def after_epoch(row: dict[str, Any]) -> None:
        real = row["loss_count"]  # real next tokens; each sequence's first id is not predicted
        row["tokens_per_s"] = real / row["seconds"] if row["seconds"] else None
        row["padding"] = 1 - (real + row["samples"]) / max(positions[0], 1)

    return common.Run(train, step, lambda: {"test_loss": evaluate(model, test, device)},
                      before_epoch, after_epoch)


def print_test_losses(results: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in results.items():
        print(f"{name}: held-out loss per real token by epoch: "
              + ", ".join(f"{r['test_loss']:.4f}" for r in rows))


@torch.no_grad()
def evaluate(model: nn.Module, batches: Any, device: torch.device) -> float:
    model.eval()
    total, count = 0.0, 0
    for ids, mask in batches:
        loss, n = lm_loss(model, ids.to(device), mask.to(device))
        total, count = total + float(loss), count + n
    return total / max(count, 1)


if __name__ == "__main__":
    sys.exit(common.run_main(main, None))
