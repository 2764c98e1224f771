"""Tokenisers behind one small protocol, for pre-tokenising text at conversion time.

Three kinds, chosen by :func:`load_tokenizer`:

- ``"bytes"`` — built in: a document's UTF-8 bytes (ids 0–255) plus BOS 256, EOS 257, PAD 258;
- a Hugging Face ``tokenizer.json`` (the ``tokenizers`` package, fully offline);
- a tiktoken BPE file (``*.tiktoken``: one ``base64-token rank`` per line), given by path, so
  nothing is ever downloaded at run time.

Every tokeniser encodes *without* its own special tokens or truncation: whoever pre-tokenises
decides those (``add_bos``/``add_eos``/``max_length`` of the text source). A ``tokenizer.json`` may
carry a truncation or padding setting from whoever saved it; it is switched off on loading and the
manifest says so.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from packdata.errors import TokenizerError, require

# GPT-2's pre-tokenisation pattern (tiktoken's r50k); a .tiktoken file does not carry its pattern
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
EXPECTED = "'bytes', a Hugging Face tokenizer.json (*.json) or a tiktoken BPE file (*.tiktoken)"
# names of special tokens, most specific first, used to find BOS/EOS/PAD in a vocabulary
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]", "<|endoftext|>")
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]")
PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>")


class Tokenizer(ABC):
    """Turns texts into token ids, a batch at a time."""

    kind: ClassVar[str]
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    path: Path | None = None

    @abstractmethod
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids as a 1-D integer array, without special tokens."""

    @abstractmethod
    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The text of ``ids`` (special tokens included as text where the tokeniser has one)."""

    def describe(self) -> dict[str, Any]:
        """What the manifest records: kind, file and its SHA-256, vocabulary size, special ids."""
        return {
            "kind": self.kind,
            "path": str(self.path.resolve()) if self.path else None,  # reloadable from anywhere
            "sha256": file_hash(self.path) if self.path else None,
            "vocab_size": self.vocab_size,
            "special": {"bos": self.bos_id, "eos": self.eos_id, "pad": self.pad_id},
        }


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0–255, plus BOS 256, EOS 257 and PAD 258."""

    kind = "bytes"
    vocab_size = 259
    bos_id, eos_id, pad_id = 256, 257, 258

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        ids = np.asarray(ids)
        return ids[ids < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json``; its saved truncation and padding are switched off."""

    kind = "huggingface"

    def __init__(self, path: str | Path, **special: str) -> None:
        self.path = Path(path)
        tokenizers = require("tokenizers", "text", "a tokenizer.json tokeniser")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust loader raises plain Exception with serde's message
            raise TokenizerError(
                f"{self.path}: not a valid Hugging Face tokenizer.json ({exc}); expected the JSON "
                "file written by `tokenizers.Tokenizer.save`"
            ) from None
        # whoever saved the file may have set these; pre-tokenising must keep whole documents
        self.saved_truncation = self._tok.truncation
        self._tok.no_truncation()
        self._tok.no_padding()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self.bos_id = _special(self._tok.token_to_id, added, special.get("bos"), BOS_NAMES)
        self.eos_id = _special(self._tok.token_to_id, added, special.get("eos"), EOS_NAMES)
        self.pad_id = _special(self._tok.token_to_id, added, special.get("pad"), PAD_NAMES)
        # encode_batch_fast (tokenizers ≥ 0.20) skips computing character offsets we never use
        self._encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        self._pid = os.getpid()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if os.getpid() != self._pid:
            # a conversion worker (forked after loading): the workers already take a core each,
            # and the library's own threads on top oversubscribe them. A user's setting wins.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return [np.array(e.ids, dtype=np.int64) for e in self._encode(texts, add_special_tokens=False)]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        if self.saved_truncation:
            d["ignored_truncation"] = {"max_length": self.saved_truncation.get("max_length")}
        return d


def _special(lookup, added: dict[str, int], name: str | None, candidates: tuple[str, ...]):
    if name is not None:
        found = lookup(name)
        if found is None:
            raise TokenizerError(f"special token '{name}' is not in the tokeniser's vocabulary")
        return found
    return next((added[c] for c in candidates if c in added), None)


class TiktokenTokenizer(Tokenizer):
    """A tiktoken BPE file given by path. The file carries ranks only: the split pattern defaults
    to GPT-2's and ``<|endoftext|>`` gets the id after the last rank unless told otherwise."""

    kind = "tiktoken"

    def __init__(
        self,
        path: str | Path,
        pattern: str = GPT2_PATTERN,
        special_tokens: dict[str, int] | None = None,
    ) -> None:
        self.path = Path(path)
        tiktoken = require("tiktoken", "text", "a tiktoken tokeniser")
        ranks = read_tiktoken_ranks(self.path)
        specials = special_tokens or {"<|endoftext|>": max(ranks.values()) + 1}
        self.pattern = pattern
        self._enc = tiktoken.Encoding(
            self.path.stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
        )
        self.vocab_size = self._enc.n_vocab
        self.bos_id = next((specials[n] for n in BOS_NAMES if n in specials), None)
        self.eos_id = next((specials[n] for n in EOS_NAMES if n in specials), None)
        self.pad_id = next((specials[n] for n in PAD_NAMES if n in specials), None)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # one thread: conversion already runs one worker process per core
        batch = self._enc.encode_ordinary_batch(texts, num_threads=1)
        return [np.array(ids, dtype=np.int64) for ids in batch]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return self._enc.decode(np.asarray(ids).tolist())

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "pattern": self.pattern}


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken BPE file, with errors naming the line."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read the tiktoken file ({exc.strerror})") from None
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            shown = line[:60].decode("utf-8", errors="replace")
            raise TokenizerError(
                f"{path}: line {lineno} is not 'base64-token rank' (got {shown!r}); expected a "
                "tiktoken BPE file"
            ) from None
    if not ranks:
        raise TokenizerError(f"{path}: no ranks; expected a tiktoken BPE file")
    # tiktoken's Rust core panics (an uncatchable-looking traceback) on either of these
    if len(set(ranks.values())) != len(ranks):
        raise TokenizerError(f"{path}: two tokens share a rank; expected a tiktoken BPE file")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"{path}: {len(missing)} of the 256 single bytes have no rank (e.g. "
                             f"{bytes([missing[0]])!r}); byte-level BPE needs them all")
    return ranks


def load_tokenizer(spec: str | Path | Tokenizer) -> Tokenizer:
    """A tokeniser from ``"bytes"``, a ``tokenizer.json`` path or a ``*.tiktoken`` path."""
    if isinstance(spec, Tokenizer):
        return spec
    if str(spec) == "bytes":
        return ByteTokenizer()
    if not isinstance(spec, (str, os.PathLike)):  # else pathlib's own TypeError
        raise TokenizerError(f"tokenizer {spec!r:.60}: expected {EXPECTED}")
    path = Path(spec)
    if not path.is_file():
        raise TokenizerError(f"{path}: tokeniser file not found; expected {EXPECTED}")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return HFTokenizer(path)
    if suffix == ".tiktoken":
        return TiktokenTokenizer(path)
    raise TokenizerError(f"{path}: cannot tell the tokeniser from the suffix '{suffix}'; expected {EXPECTED}")


def from_description(desc: dict[str, Any]) -> Tokenizer:
    """The tokeniser a manifest recorded (to decode stored ids), checking the file is unchanged."""
    if desc.get("kind") == "bytes":
        return ByteTokenizer()
    if not desc.get("path"):  # a Tokenizer object was given, not a file: nothing to reload
        raise TokenizerError(f"the {desc.get('kind')!r} tokeniser was given as an object, not "
                             "a file: pass it again (tokenizer=...)")
    path = Path(desc["path"])
    tok = load_tokenizer(path) if desc["kind"] != "tiktoken" else \
        TiktokenTokenizer(path, pattern=desc.get("pattern", GPT2_PATTERN))
    if desc.get("sha256") and file_hash(path) != desc["sha256"]:
        raise TokenizerError(f"{path}: the file changed since the dataset was converted (SHA-256)")
    return tok


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype holding every id: uint16 up to 65,536 tokens, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
