"""Tokenisers: each encodes real PEPs exactly as its own library does, and bad files are named."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from packdata.errors import TokenizerError
from packdata.prep.tokenizers import (
    ByteTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    from_description,
    load_tokenizer,
    token_dtype,
)


@pytest.fixture(scope="module")
def texts(peps_dir) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted(peps_dir.glob("*.txt"))]


def test_bytes_are_utf8_plus_specials(texts):
    tok = load_tokenizer("bytes")
    ids = tok.encode_batch(texts)
    assert all(a.tobytes() == t.encode("utf-8") for a, t in zip(ids, texts))
    assert any((a >= 128).any() for a in ids)  # the slice holds non-ASCII text
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258, 259)
    assert tok.decode(np.concatenate([[256], ids[0], [257]])) == texts[0]
    assert tok.describe()["kind"] == "bytes" and token_dtype(tok.vocab_size) == "uint16"


def test_tokenizer_json_ignores_its_saved_truncation(texts, gpt2_json):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(gpt2_json))
    assert reference.truncation["max_length"] == 50  # the trap this file carries
    reference.no_truncation()
    tok = load_tokenizer(gpt2_json)
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode_batch(texts)
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    assert [a.tolist() for a in ids] == expected
    assert max(len(a) for a in ids) > 20_000 and min(len(a) for a in ids) < 100
    assert tok.decode(ids[3]) == texts[3]
    d = tok.describe()
    assert d["vocab_size"] == 50257 and d["special"] == {"bos": 50256, "eos": 50256, "pad": None}
    assert d["ignored_truncation"] == {"max_length": 50}
    assert d["sha256"] == "df6e222d37a6b4f350054433e95477958a0a9da2de91ffcdb62f9d87314b3210"


def test_tiktoken_file_matches_tiktoken_and_gpt2(texts, gpt2_tiktoken, gpt2_json):
    import tiktoken

    tok = load_tokenizer(gpt2_tiktoken)
    assert isinstance(tok, TiktokenTokenizer) and tok.vocab_size == 50257 and tok.eos_id == 50256
    ids = tok.encode_batch(texts)
    ranks = {}
    for line in gpt2_tiktoken.read_text().splitlines():  # tiktoken's own reading of the same file
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    own = tiktoken.Encoding("ref", pat_str=tok.pattern, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    assert [a.tolist() for a in ids] == [own.encode_ordinary(t) for t in texts]
    # two independent implementations of GPT-2 agree on real text
    gpt2 = load_tokenizer(gpt2_json).encode_batch(texts)
    assert all(np.array_equal(a, b) for a, b in zip(ids, gpt2))
    assert tok.decode(ids[0]) == texts[0]


def test_missing_or_invalid_files_say_what_was_expected(tmp_path, gpt2_tiktoken):
    with pytest.raises(TokenizerError, match=r"nope.json: tokeniser file not found; expected 'bytes'"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "vocab.txt").write_text("a 1\n")
    with pytest.raises(TokenizerError, match=r"suffix '.txt'.*tokenizer.json.*\.tiktoken"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "bad.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    with pytest.raises(TokenizerError, match="bad.json: not a valid Hugging Face tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
    lines = gpt2_tiktoken.read_text().splitlines()[:5] + ["not-base64!! x"]
    (tmp_path / "bad.tiktoken").write_text("\n".join(lines))
    with pytest.raises(TokenizerError, match=r"bad.tiktoken: line 6 is not 'base64-token rank'"):
        load_tokenizer(tmp_path / "bad.tiktoken")
    (tmp_path / "empty.tiktoken").write_text("")
    with pytest.raises(TokenizerError, match="no ranks"):
        load_tokenizer(tmp_path / "empty.tiktoken")
    lines = gpt2_tiktoken.read_text().splitlines()
    (tmp_path / "dup.tiktoken").write_text("\n".join(lines[:300] + [lines[300].split()[0] + " 0"]))
    with pytest.raises(TokenizerError, match="dup.tiktoken: two tokens share a rank"):
        load_tokenizer(tmp_path / "dup.tiktoken")
    (tmp_path / "few.tiktoken").write_text("\n".join(lines[100:300]))  # 100 bytes unranked
    with pytest.raises(TokenizerError, match="few.tiktoken: 100 of the 256 single bytes"):
        load_tokenizer(tmp_path / "few.tiktoken")


def test_special_token_override(gpt2_json):
    assert HFTokenizer(gpt2_json, pad="<|endoftext|>").pad_id == 50256
    with pytest.raises(TokenizerError, match="'<pad>' is not in the tokeniser's vocabulary"):
        HFTokenizer(gpt2_json, pad="<pad>")


def test_reload_from_manifest_description_checks_the_file(tmp_path, gpt2_json, gpt2_tiktoken):
    for path in (gpt2_json, gpt2_tiktoken):
        copy = tmp_path / path.name
        copy.write_bytes(path.read_bytes())
        desc = load_tokenizer(copy).describe()
        assert from_description(desc).encode_batch(["Hello PEP 8"])[0].tolist() == [
            15496, 350, 8905, 807]
        copy.write_bytes(path.read_bytes() + b"\n")
        with pytest.raises(TokenizerError, match="changed since the dataset was converted"):
            from_description(desc)
    assert isinstance(from_description(ByteTokenizer().describe()), ByteTokenizer)
    assert token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"


def test_description_reloads_from_another_directory(tmp_path, gpt2_json, monkeypatch):
    (tmp_path / "tokenizer.json").write_bytes(gpt2_json.read_bytes())
    monkeypatch.chdir(tmp_path)
    desc = load_tokenizer("tokenizer.json").describe()  # given relative, as on a command line
    monkeypatch.chdir(tmp_path.parent)
    assert from_description(desc).encode_batch(["Hello"])[0].tolist() == [15496]


@pytest.mark.parametrize("spec", [5, None, 1.5])
def test_a_tokenizer_that_is_neither_a_name_nor_a_path_is_refused_by_name(spec):
    # pathlib's "expected str, bytes or os.PathLike object, not int" before
    with pytest.raises(TokenizerError, match="expected 'bytes'"):
        load_tokenizer(spec)
