"""Text sources: pre-tokenised documents, stored as unpadded token ids.

Inputs (a folder, searched recursively in sorted order, or one file):

- ``*.txt`` — one document per file (key: the path under the root, ``docs/a.txt``), or with
  ``per_line`` one document per non-blank line (key ``docs/a.txt:LINE``, 1-based);
- ``*.jsonl`` — one JSON object per line, the document in ``text_field`` (key ``a.jsonl:LINE``).

Records: ``tokens`` — a variable-length 1-D array of ids, ``uint16`` when the vocabulary fits in
16 bits, else ``uint32``; each document's length is kept by the container, readable without the
tokens. ``add_bos``/``add_eos`` mark each document's start and end. With ``max_length`` long
documents are truncated (keeping both marks), or with ``split`` cut into chunks of at most
``max_length`` ids (keys ``KEY#0``, ``KEY#1``…; BOS starts the first chunk, EOS ends the last).
Blank lines are separators, not documents (counted in the manifest's ``source.blank_lines``); an
empty file or empty JSON text is skipped and listed in the manifest's ``skipped``. Tokenising
runs in the conversion's worker processes, one batch-encode call per block of documents.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packdata.errors import PackdataError, SampleError, SkippedSample, TokenizerError
from packdata.manifest import Field
from packdata.options import Option, resolve
from packdata.prep.tokenizers import from_description, load_tokenizer, token_dtype
from packdata.remote.files import fetch_all
from packdata.sources.base import Item, Loaded, Source
from packdata.sources.lines import DocTable, TextItem, build, scan_lines

KIND = "text"
select = None  # every record serves all of itself
SUFFIXES = (".txt", ".jsonl")
TEXT_ERRORS = ("strict", "replace", "skip")
DTYPES = ("uint8", "uint16", "uint32")
OPTIONS = (
    Option("tokenizer", str, "bytes", "'bytes' (built in), a Hugging Face tokenizer.json, or a "
           "tiktoken BPE file (*.tiktoken). Used offline; its saved truncation is ignored."),
    Option("text_field", str, "text", "The field holding the document in *.jsonl lines."),
    Option("per_line", bool, False, "One document per non-blank line of each *.txt file."),
    Option("add_bos", bool, False, "Start each document with BOS."),
    Option("add_eos", bool, False, "End each document with EOS."),
    Option("max_length", int, None, "At most this many ids per record (BOS/EOS included); longer "
           "documents are truncated, or cut into chunks with --split."),
    Option("split", bool, False, "Cut documents longer than --max-length into chunks (keys "
           "KEY#0, KEY#1...) instead of truncating them."),
    Option("text_errors", str, "strict", "Bytes that are not UTF-8 stop the conversion naming "
           "file and byte offset ('strict'), become U+FFFD ('replace'), or skip the document "
           "('skip').", TEXT_ERRORS),
    Option("dtype", str, None, "Stored token id type (default: the smallest that holds the "
           "vocabulary).", DTYPES),
)
BLOCK_BYTES = 512 << 10  # text per worker task: enough to amortise a task, small enough to balance


class TextSource(Source):
    """Documents under ``root``, tokenised by ``tokenizer`` (``"bytes"``, a tokenizer.json path,
    a ``*.tiktoken`` path, or a :class:`~packdata.prep.tokenizers.Tokenizer`)."""

    kind = KIND
    unique_keys = True  # FILE and FILE:LINE (see DocTable)

    def __init__(self, root: str | Path, **options: Any) -> None:
        """``options``: see :data:`OPTIONS`; ``tokenizer`` may also be a loaded Tokenizer or the
        description a manifest recorded."""
        o = resolve(KIND, OPTIONS, options)
        tokenizer, max_length, split = o["tokenizer"], o["max_length"], o["split"]
        add_bos, add_eos, dtype = o["add_bos"], o["add_eos"], o["dtype"]
        self.root = root if isinstance(root, Path) else Path(root)  # a RemotePath stays one
        # a dict: the description a manifest recorded (see options())
        self.tokenizer = (from_description(tokenizer) if isinstance(tokenizer, dict)
                          else load_tokenizer(tokenizer))
        for flag, special in (("add_bos", "bos_id"), ("add_eos", "eos_id")):
            if o[flag] and getattr(self.tokenizer, special) is None:
                raise TokenizerError(f"--{flag.replace('_', '-')}: the tokeniser has no "
                                     f"{special[:3].upper()} token")
        self.specials = ([self.tokenizer.bos_id] if add_bos else [],
                         [self.tokenizer.eos_id] if add_eos else [])
        if split and max_length is None:
            raise PackdataError("--split needs --max-length (the chunk size)")
        if max_length is not None and max_length <= add_bos + add_eos:
            raise PackdataError(f"--max-length {max_length} leaves no room beside BOS/EOS")
        self.dtype = dtype or token_dtype(self.tokenizer.vocab_size)
        self.text_field, self.per_line = o["text_field"], o["per_line"]
        self.add_bos, self.add_eos = add_bos, add_eos
        self.max_length, self.split, self.text_errors = max_length, split, o["text_errors"]
        self.blank_lines = 0

    # -- listing ---------------------------------------------------------------------------------

    def _files(self) -> list[Path]:
        base = self.root.parent if self.root.is_file() else self.root
        return [base / f for f in self.list_inputs(SUFFIXES)]

    def items(self) -> DocTable:
        """Every document, as a table of rows (a few bytes each, however many lines)."""
        base = self.root.parent if self.root.is_file() else self.root
        files = self._files()
        sizes = [path.stat().st_size for path in files]
        dtype = np.uint32 if max(sizes, default=0) < 1 << 32 else np.int64
        rows: list = []
        self.blank_lines = 0
        for path, size in zip(files, sizes):
            key = path.relative_to(base).as_posix()
            if path.suffix.lower() == ".jsonl" or self.per_line:
                # one row per non-blank line, with its byte range: a worker reads only that line
                *lines, blank = scan_lines(path, dtype)
                self.blank_lines += blank
                rows.append((key, path, tuple(lines)))
            else:
                rows.append((key, path, size))
        return build(rows, dtype)

    def blocks(self, items: Sequence[Item]) -> list[Sequence[Item]]:
        """Tasks of about ``BLOCK_BYTES`` of text: documents vary from one line to megabytes."""
        table = items if isinstance(items, DocTable) else None
        if table is not None:  # + a little per item, for per-item costs
            return list(table.cost_blocks(BLOCK_BYTES, 64))
        blocks: list[list[Item]] = [[]]
        size = 0
        for item in items:
            if size >= BLOCK_BYTES:
                blocks.append([])
                size = 0
            blocks[-1].append(item)
            size += item.end - item.start + 64  # type: ignore[attr-defined]
        return blocks  # type: ignore[return-value]

    # -- loading (in worker processes) -----------------------------------------------------------

    def load(self, item: Item) -> dict[str, np.ndarray]:
        loaded = self.load_block([item])[0]
        if isinstance(loaded, SampleError):
            raise loaded
        return loaded if isinstance(loaded, dict) else loaded[0][1]

    def load_block(self, items: Sequence[Item]) -> list[Loaded]:
        """Read every document of the block, then tokenise them with one batch-encode call."""
        items = list(items)  # a block's rows as items, once
        results: list[Loaded | None] = [None] * len(items)
        texts, slots = [], []
        # URL inputs: whole-file documents in one batch of concurrent GETs; lines are ranged reads
        fetch_all([item.path for item in items if item.line is None])
        for i, (item, raw) in enumerate(zip(items, self._read(items))):
            text = raw if isinstance(raw, SampleError) else self._text(item, raw)
            if isinstance(text, SampleError):
                results[i] = text
            elif not text.strip():
                results[i] = SkippedSample(item.origin, "empty document")
            else:
                texts.append(text)
                slots.append(i)
        for i, ids in zip(slots, self.tokenizer.encode_batch(texts) if texts else []):
            results[i] = self._records(items[i], ids)
        return results  # type: ignore[return-value]

    def _read(self, items: list[Item]) -> list[bytes | SampleError]:
        """Each item's bytes; consecutive lines of one file come from one read."""
        out: list[bytes | SampleError] = []
        span: dict[Path, tuple[int, bytes]] = {}
        for item in items:
            try:
                if item.line is None:
                    out.append(item.path.read_bytes())
                    continue
                if item.path not in span:
                    lines = [i for i in items if i.path == item.path]
                    lo, hi = min(i.start for i in lines), max(i.end for i in lines)
                    with item.path.open("rb") as f:
                        f.seek(lo)
                        span[item.path] = (lo, f.read(hi - lo))
                lo, data = span[item.path]
                out.append(data[item.start - lo : item.end - lo])
            except OSError as exc:
                out.append(SampleError(item.origin, f"cannot read ({exc.strerror})"))
        return out

    def _text(self, item: TextItem, raw: bytes) -> str | SampleError:
        nul = raw.find(b"\0")
        if nul >= 0:  # valid UTF-8, but no text has it: a binary file with a text suffix
            return SampleError(item.origin, f"binary data, not text (a NUL byte at byte offset "
                                            f"{item.start + nul})")
        errors = "replace" if self.text_errors == "replace" else "strict"
        try:
            text = raw.decode("utf-8", errors=errors)
        except UnicodeDecodeError as exc:
            offset = item.start + exc.start  # from the start of the file, not of the line
            problem = f"not UTF-8 at byte offset {offset} ({exc.reason})"
            if self.text_errors == "skip":
                return SkippedSample(item.origin, problem)
            return SampleError(item.origin, f"{problem}; pass --text-errors replace or skip")
        if item.line is not None:
            text = text.rstrip("\r\n")  # the line ending separates documents; it is not text
        if item.path.suffix.lower() != ".jsonl":
            return text
        try:
            value = json.loads(text)
        except ValueError as exc:
            return SampleError(item.origin, f"not a JSON line ({exc})")
        if not isinstance(value, dict) or not isinstance(value.get(self.text_field), str):
            fields = ", ".join(value) if isinstance(value, dict) else type(value).__name__
            return SampleError(item.origin, f"no string field '{self.text_field}' (found: {fields}); "
                                            "choose it with --text-field")
        return value[self.text_field]

    def _records(self, item: TextItem, ids: np.ndarray) -> Loaded:
        if not ids.size:  # the tokeniser's normaliser dropped every character
            return SkippedSample(item.origin, "empty document (no tokens)")
        bos, eos = self.specials
        largest = int(max([ids.max(), *bos, *eos]))
        if largest > np.iinfo(self.dtype).max:
            raise TokenizerError(
                f"{item.origin}: token id {largest} does not fit {self.dtype} (the "
                f"tokeniser's vocabulary is {self.tokenizer.vocab_size}); use dtype='uint32'"
            )
        if self.max_length is None:
            chunks = [np.concatenate([bos, ids, eos])]
        elif self.split:  # BOS/EOS mark the document's ends, so the first and last chunk get them
            doc = np.concatenate([bos, ids, eos])
            chunks = [doc[i : i + self.max_length] for i in range(0, len(doc), self.max_length)]
        else:  # truncated, the record keeps both marks (as tokenisers' own truncation does)
            chunks = [np.concatenate([bos, ids[: self.max_length - len(bos) - len(eos)], eos])]
        records = [{"tokens": c.astype(self.dtype)} for c in chunks]
        if not self.split:
            return records[0]
        return [(f"{item.key}#{j}", r) for j, r in enumerate(records)]

    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        return {"tokens": Field(self.dtype, (None,))}

    def options(self) -> dict[str, Any]:
        # the tokeniser as its description: reloaded from its file, checked by its SHA-256
        return {"tokenizer": self.tokenizer.describe(), "text_field": self.text_field,
                "per_line": self.per_line, "add_bos": self.add_bos, "add_eos": self.add_eos,
                "max_length": self.max_length, "split": self.split,
                "text_errors": self.text_errors, "dtype": self.dtype}

    def describe(self) -> dict[str, Any]:
        layout = "lines" if self.per_line else "files"
        return {
            "source": {"path": str(self.root), "layout": layout, "blank_lines": self.blank_lines},
            "options": self.options(),
        }


SOURCE = TextSource
