"""Text sources: real PEPs tokenised into every container read back exactly; every bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import packdata
from packdata.cli import app
from packdata.errors import PackdataError, SampleError, TokenizerError
from packdata.loading.buckets import LengthBucketBatchSampler
from packdata.loading.collate import PackCollate, PadCollate
from packdata.prep.tokenizers import load_tokenizer
from packdata.sources import text as text_source


def own_encoding(gpt2_json: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(gpt2_json))
    tok.no_truncation()
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_round_trip_equals_the_tokenizers_own_encoding(packed_text, container, peps_dir, gpt2_json):
    files = sorted(peps_dir.glob("*.txt"))
    expected = own_encoding(gpt2_json, [p.read_text(encoding="utf-8") for p in files])
    ds = packdata.open(packed_text[container])
    assert ds.keys == [p.name for p in files] and len(ds) == 21
    assert ds.manifest.fields["tokens"].dtype == "<u2"
    assert ds.lengths().tolist() == [len(e) for e in expected]
    batch = ds[list(range(len(ds)))[::-1]]
    assert [t.tolist() for t in batch] == expected[::-1]
    assert all(t.dtype == torch.int64 and t.ndim == 1 for t in batch)
    assert ds[5].tolist() == expected[5]
    tok = ds.manifest.options["tokenizer"]
    assert tok["kind"] == "huggingface" and tok["vocab_size"] == 50257
    assert tok["special"]["eos"] == 50256 and len(tok["sha256"]) == 64


def test_workers_batch_encode_in_blocks(tmp_path, peps_dir, gpt2_tiktoken, monkeypatch):
    monkeypatch.setattr(text_source, "BLOCK_BYTES", 64 << 10)  # several blocks for two workers
    source = packdata.open_source(peps_dir, tokenizer=gpt2_tiktoken)
    assert len(source.blocks(source.items())) > 4
    ds = packdata.open(packdata.convert(source, tmp_path / "t.h5", workers=2).path)
    tok = load_tokenizer(gpt2_tiktoken)
    texts = [p.read_text(encoding="utf-8") for p in sorted(peps_dir.glob("*.txt"))]
    assert [t.tolist() for t in ds[list(range(len(ds)))]] == [
        a.tolist() for a in tok.encode_batch(texts)]
    assert ds.manifest.options["tokenizer"]["kind"] == "tiktoken"


def test_split_and_truncate_with_bos_eos(tmp_path, peps_dir, gpt2_json):
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(peps_dir.glob("*.txt"))}
    whole = dict(zip(texts, own_encoding(gpt2_json, list(texts.values()))))
    split = packdata.convert(packdata.open_source(
        peps_dir, tokenizer=gpt2_json, max_length=1000, split=True, add_bos=True, add_eos=True),
        tmp_path / "split.lmdb").path
    ds = packdata.open(split)
    assert ds.lengths().max() == 1000
    chunks: dict[str, list[int]] = {}
    for key, tokens in zip(ds.keys, ds[list(range(len(ds)))]):
        name, number = key.split("#")
        assert int(number) == len(chunks.get(name, [])) // 1000  # chunks in order, numbered
        chunks.setdefault(name, []).extend(tokens.tolist())
    assert chunks == {k: [50256, *ids, 50256] for k, ids in whole.items()}
    assert "pep-0817.txt#30" in ds.keys  # 121 KB of text: ~31 chunks
    cut = packdata.open(packdata.convert(packdata.open_source(
        peps_dir, tokenizer=gpt2_json, max_length=64, add_eos=True), tmp_path / "cut.h5").path)
    assert cut.keys == list(texts)
    for key, tokens in zip(cut.keys, cut[list(range(len(cut)))]):
        assert tokens.tolist() == whole[key][:63] + [50256]


def test_jsonl_and_per_line(tmp_path, peps_dir, gpt2_json):
    lines = [p.read_text(encoding="utf-8").splitlines()[0] for p in sorted(peps_dir.glob("*.txt"))]
    src = tmp_path / "src"
    src.mkdir()
    (src / "docs.jsonl").write_text("".join(json.dumps({"id": i, "body": t}) + "\n"
                                            for i, t in enumerate(lines)) + "\n")
    (src / "lines.txt").write_text("first line\n\n  \nsecond line\r\nthird\n", encoding="utf-8")
    ds = packdata.open(packdata.convert(packdata.open_source(
        src, tokenizer=gpt2_json, text_field="body", per_line=True), tmp_path / "l.lmdb").path)
    assert ds.keys[:2] == ["docs.jsonl:1", "docs.jsonl:2"]
    assert ds.keys[-3:] == ["lines.txt:1", "lines.txt:4", "lines.txt:5"]
    texts = [*lines, "first line", "second line", "third"]
    assert [t.tolist() for t in ds[list(range(len(ds)))]] == own_encoding(gpt2_json, texts)
    assert ds.manifest.source["blank_lines"] == 3  # two in lines.txt, the trailing one in jsonl
    with pytest.raises(SampleError, match=r"docs.jsonl:1: no string field 'text' \(found: id, body\)"):
        packdata.convert(packdata.open_source(src, per_line=True), tmp_path / "x.h5")
    (src / "docs.jsonl").write_text('{"text": "fine"}\n{"text": 3\n')
    with pytest.raises(SampleError, match=r"docs.jsonl:2: not a JSON line"):
        packdata.convert(packdata.open_source(src / "docs.jsonl"), tmp_path / "y.h5")


@pytest.fixture
def bad_text(tmp_path, peps_dir) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    for p in sorted(peps_dir.glob("*.txt"))[:4]:
        (folder / p.name).write_bytes(p.read_bytes())
    good = (folder / "pep-0210.txt").read_bytes()
    (folder / "latin1.txt").write_bytes(good[:100] + "café".encode("latin-1") + good[100:])
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blank.txt").write_bytes(b"  \n\n")
    return folder


def test_non_utf8_names_file_and_byte_offset(tmp_path, bad_text):
    with pytest.raises(SampleError, match=r"latin1.txt: not UTF-8 at byte offset 103 .*--text-errors"):
        packdata.convert(packdata.open_source(bad_text), tmp_path / "o.h5")
    assert not (tmp_path / "o.h5").exists()
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"ok\nfine too\nna\xefve\n")
    with pytest.raises(SampleError, match=r"lines.txt:3: not UTF-8 at byte offset 14"):
        packdata.convert(packdata.open_source(lines, per_line=True), tmp_path / "p.h5")


def test_text_errors_replace_or_skip_and_empty_documents_counted(tmp_path, bad_text):
    replaced = packdata.open(packdata.convert(
        packdata.open_source(bad_text, text_errors="replace"), tmp_path / "r.h5").path)
    latin = replaced[replaced.keys.index("latin1.txt")].numpy()
    assert bytes(latin[100:106].astype(np.uint8)) == "caf\ufffd".encode()  # bytes tokeniser
    assert len(replaced) == 5
    empties = [s for s in replaced.manifest.skipped if s["reason"] == "empty document"]
    assert sorted(Path(s["path"]).name for s in empties) == ["blank.txt", "empty.txt"]
    skipped = packdata.convert(packdata.open_source(bad_text, text_errors="skip"), tmp_path / "s.h5")
    assert len(packdata.open(skipped.path)) == 4 and len(skipped.skipped) == 3
    assert any("latin1.txt" in s["path"] and "byte offset 103" in s["reason"]
               for s in skipped.skipped)


def test_binary_text_is_refused(tmp_path, peps_dir):
    """A .txt of NUL bytes is valid UTF-8 but not text: refused, naming the file."""
    folder = tmp_path / "nul"
    folder.mkdir()
    (folder / "a.txt").write_bytes((peps_dir / "pep-0210.txt").read_bytes())
    (folder / "b.txt").write_bytes(b"\0" * 4096)
    with pytest.raises(SampleError, match=r"b.txt: binary data, not text .*byte offset 0"):
        packdata.convert(packdata.open_source(folder), tmp_path / "o.h5", workers=1)
    skipped = packdata.convert(packdata.open_source(folder), tmp_path / "o.h5", on_error="skip")
    assert [Path(s["path"]).name for s in skipped.skipped] == ["b.txt"]


def test_errors_cross_from_worker_processes(tmp_path, bad_text, monkeypatch):
    monkeypatch.setattr(text_source, "BLOCK_BYTES", 1)  # one document per task, two workers
    result = packdata.convert(packdata.open_source(bad_text), tmp_path / "w.lmdb", workers=2,
                              on_error="skip")
    reasons = {Path(s["path"]).name: s["reason"] for s in result.skipped}
    assert reasons.keys() == {"latin1.txt", "empty.txt", "blank.txt"}
    assert reasons["latin1.txt"].startswith("not UTF-8 at byte offset 103")
    assert len(packdata.open(result.path)) == 4


def test_ids_that_do_not_fit_the_dtype(tmp_path, peps_dir, gpt2_json):
    with pytest.raises(TokenizerError, match=r"token id \d+ does not fit uint8 .*50257"):
        packdata.convert(packdata.open_source(peps_dir, tokenizer=gpt2_json, dtype="uint8"),
                         tmp_path / "o.lmdb", on_error="skip")
    assert not (tmp_path / "o.lmdb").exists()
    ds = packdata.open(packdata.convert(packdata.open_source(peps_dir, dtype="uint8"),
                                        tmp_path / "b.h5").path)  # bytes fit, without BOS/EOS
    assert ds.manifest.fields["tokens"].dtype == "|u1"
    with pytest.raises(TokenizerError, match="token id 25[67] does not fit uint8"):  # BOS/EOS
        packdata.convert(packdata.open_source(peps_dir, dtype="uint8", add_bos=True,
                                              add_eos=True), tmp_path / "c.h5")


def test_documents_that_tokenise_to_nothing_are_skipped(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True)  # drops control characters
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    (tmp_path / "in" / "b.txt").write_text("\x01\x02\x03")
    result = packdata.convert(packdata.open_source(tmp_path / "in", tokenizer=tmp_path / "tok.json"),
                              tmp_path / "o.h5", on_error="skip")
    assert packdata.open(result.path).keys == ["a.txt"]
    assert [s["reason"] for s in result.skipped] == ["empty document (no tokens)"]


def test_option_errors(peps_dir, gpt2_tiktoken):
    with pytest.raises(PackdataError, match="--split needs --max-length"):
        packdata.open_source(peps_dir, split=True)
    with pytest.raises(PackdataError, match="no room"):
        packdata.open_source(peps_dir, max_length=2, add_bos=True, add_eos=True)
    with pytest.raises(PackdataError, match="--text-errors 'ignore'"):
        packdata.open_source(peps_dir, text_errors="ignore")
    with pytest.raises(TokenizerError, match="--add-bos: the tokeniser has no BOS"):
        packdata.open_source(peps_dir, tokenizer=load_tokenizer(gpt2_tiktoken).__class__(
            gpt2_tiktoken, special_tokens={"<|pad|>": 50256}), add_bos=True)
    with pytest.raises(PackdataError, match="option --tokenizer does not apply to image"):
        packdata.open_source(peps_dir, kind="image", tokenizer="bytes")


def test_bucketed_padded_batches_from_a_dataloader(packed_text):
    ds = packdata.open(packed_text["hdf5"])
    sampler = LengthBucketBatchSampler(ds.lengths(), max_tokens=40_000, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=sampler,
                                         collate_fn=PadCollate(pad_id=50256))
    seen = []
    for (ids, mask), indices in zip(loader, sampler.batches(0)):
        assert ids.shape[0] * ids.shape[1] <= 40_000 or ids.shape[0] == 1
        for row, m, i in zip(ids, mask, indices):
            assert row[m].tolist() == ds[int(i)].tolist() and m.sum() == ds.lengths()[i]
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(len(ds)))


def test_cli_convert_and_inspect(tmp_path, peps_dir, gpt2_json):
    runner = CliRunner()
    out = tmp_path / "peps.lmdb"
    result = runner.invoke(app, ["convert", str(peps_dir), str(out), "--tokenizer", str(gpt2_json),
                                 "--max-length", "512", "--split", "--add-eos", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "text samples (lmdb)" in result.output
    info = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    assert info["kind"] == "text" and info["lengths"]["tokens"]["max"] == 512
    assert info["options"]["split"] and info["options"]["add_eos"]
    lines = tmp_path / "lines.h5"  # thousands of lines of every length: padding differs a lot
    result = runner.invoke(app, ["convert", str(peps_dir), str(lines), "--per-line"])
    assert result.exit_code == 0, result.output
    info = json.loads(runner.invoke(app, ["inspect", str(lines), "--json"]).stdout)
    assert info["count"] > 5000 and info["source"]["layout"] == "lines"
    assert 0 <= info["padding"]["bucketed"] < 0.05 < 0.3 < info["padding"]["random"], info["padding"]
    table = runner.invoke(app, ["inspect", str(lines)]).stdout
    assert "padding (batches of 64)" in table and "length-bucketed" in table
    result = runner.invoke(app, ["convert", str(peps_dir), str(tmp_path / "x.h5"),
                                 "--tokenizer", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "tokeniser file not found" in result.output
    assert "Traceback" not in result.output


def test_a_per_sample_transform_keeps_variable_length_batches(packed_text):
    ds = packdata.open(packed_text["hdf5"], transform=lambda ids: ids.long())
    batch = ds[[0, 1]]
    assert isinstance(batch, list) and [len(x) for x in batch] == [len(ds[0]), len(ds[1])]
    assert batch[0].dtype == torch.int64
    assert ds[[]] == []


def test_docs_packed_batch_mask_and_cu_seqlens(packed_text):
    """docs/text.md's PackCollate example runs on real tokens, and its attention mask and
    cu_seqlens are what brute force gives: one sequence per document piece in a block."""
    doc = (Path(__file__).parents[1] / "docs" / "text.md").read_text()
    block = doc.split("```python\nloader = packdata.loader(ds, batch_sampler=sampler, collate=PackCollate")[1]
    code = "loader = packdata.loader(ds, batch_sampler=sampler, collate=PackCollate" + block.split("```")[0]
    ds = packdata.open(packed_text["hdf5"])
    sampler = LengthBucketBatchSampler(ds.lengths(), batch_size=4, seed=0)
    scope = {"packdata": packdata, "torch": torch, "PackCollate": PackCollate, "ds": ds,
             "sampler": sampler}
    exec(code, scope)  # noqa: S102 - the documentation's own code
    segments, mask, cu = scope["segments"], scope["mask"], scope["cu_seqlens"].tolist()
    n, t = segments.shape
    pieces = []  # (start, end) of each run of one segment id within one block, brute force
    for b in range(n):
        row = segments[b].tolist()
        start = 0
        for i in range(1, t + 1):
            if i == t or row[i] != row[start]:
                pieces.append((b * t + start, b * t + i))
                start = i
    assert cu == [p[0] for p in pieces] + [n * t]
    for b in range(n):
        for i in range(0, t, 97):
            for j in range(0, t, 89):
                same = segments[b, i] == segments[b, j]
                assert bool(mask[b, i, j]) == bool(same and j <= i)
    assert mask[:, range(t), range(t)].all()  # no empty row, padding included


def test_scan_lines_matches_splitlines_across_reads_and_growth(tmp_path, monkeypatch):
    """The lines of a JSONL file as ``bytes.splitlines`` finds them (\\n, \\r\\n, a lone \\r,
    blank lines, a last line without an ending), read 4 KiB at a time, with more lines than the
    columns' first allocation."""
    import random

    from packdata.sources import lines

    rng = random.Random(3)
    parts = [("" if rng.random() < 0.1 else f"doc {i}" + " " * rng.randint(0, 3))
             + rng.choice(["\n", "\r\n", "\r"]) for i in range(80_000)]
    raw = ("".join(parts) + "a last line").encode()
    (tmp_path / "c.jsonl").write_bytes(raw)
    monkeypatch.setattr(lines, "SCAN_BYTES", 4096)
    numbers, starts, ends, blank = lines.scan_lines(tmp_path / "c.jsonl", np.int32)
    want, at, blanks = [], 0, 0
    for number, text in enumerate(raw.splitlines(keepends=True), 1):
        if text.strip():
            want.append((number, at, at + len(text)))
        else:
            blanks += 1
        at += len(text)
    assert list(zip(numbers.tolist(), starts.tolist(), ends.tolist())) == want
    assert blank == blanks and numbers.dtype == np.int32 and len(want) > 1 << 16
