"""`packdata bench` on the command line: outputs, and one-line errors for bad input."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from typer.testing import CliRunner

from packdata.cli import app

runner = CliRunner()
FAST = ["--steps", "2", "--warmup", "1", "--batch-size", "20"]
ON_CPU = ["--device", "cpu"]  # where an assertion names the model 'auto' picks on a CPU


def test_bench_writes_table_json_and_plot(packed, tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = runner.invoke(app, ["bench", str(packed["hdf5"]), *FAST, *ON_CPU, "--json", str(out),
                                 "--plot", str(png)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "small-cnn on cpu, batch 20" in text
    assert re.search(r"(does not wait|waits) for data.* (I/O alone delivers|I/O-bound|Balanced)", text)
    doc = json.loads(out.read_text())
    assert doc["dataset"]["format"] == "hdf5" and doc["settings"]["steps"] == 2
    assert png.read_bytes()[:4] == b"\x89PNG"


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # handled, not a crash
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_not_a_dataset(tmp_path):
    (tmp_path / "readme.md").write_text("x")
    assert "not a packdata dataset (found a directory holding readme.md)" in \
        one_line_error(runner.invoke(app, ["bench", str(tmp_path)]))


def test_model_that_does_not_fit(packed, tmp_path):
    (tmp_path / "m.py").write_text("import torch\ndef tiny():\n    return torch.nn.Linear(5, 2)\n")
    line = one_line_error(runner.invoke(app, ["bench", str(packed["lmdb"]), *FAST, "--model",
                                              f"{tmp_path / 'm.py'}:tiny"]))
    assert "does not accept the batch (uint8 20×3×32×32, int64 20)" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu(packed):
    line = one_line_error(runner.invoke(app, ["bench", str(packed["lmdb"]), "--device", "cuda"]))
    assert "'cuda' was asked for but" in line and "device='cpu'" in line


def test_bench_on_token_ids_counts_documents(peps_dir, gpt2_json, tmp_path):
    """Text batches reach the transformer as padded (ids, mask); samples are documents."""
    import packdata

    chunks = packdata.convert(packdata.open_source(peps_dir, tokenizer=gpt2_json, max_length=64,
                                                   split=True), tmp_path / "c.h5").path
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["bench", str(chunks), "--steps", "3", "--warmup", "1",
                                 "--batch-size", "4", "--max-seconds", "600",  # counts, not time
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())["runs"][0]
    assert run["input"]["kind"] == "text"
    assert run["io"]["samples"] == run["train"]["samples"] == run["loop"]["samples"] == 12


def test_whole_documents_stay_within_max_seconds(packed_text, tmp_path):
    """PEPs tokenised whole (up to ~30,000 tokens): --max-seconds bounds every measurement,
    warm-up included, and the built-in transformer's cap is said before measuring."""
    out = tmp_path / "w.json"
    start = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    result = runner.invoke(app, ["bench", str(packed_text["hdf5"]), "--batch-size", "4",
                                 "--steps", "1000", "--warmup", "1000", "--max-seconds", "0.2",
                                 "--json", str(out)])
    cpu = time.process_time() - start
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert re.search(r"warning: the first batch's documents run to [\d,]+ tokens; the built-in "
                     r"transformer trains on the first 512 of each", text)
    doc = json.loads(out.read_text())
    run = doc["runs"][0]
    assert run["train"]["steps"] < 1000 and run["loop"]["steps"] < 1000  # stopped by the clock
    # three measurements of 0.2 s plus a step each, and start-up: a few CPU seconds; without
    # the bound and the cap, all 1,000 warm-up steps ran whatever the clock said, each with
    # attention over whole documents (up to ~30,000 tokens): CPU hours
    assert cpu < 60


@pytest.mark.parametrize("args, message", [
    (["--target-gpu", "TPU"], "--target-gpu 'TPU': unknown; known GPUs: A100, H100, H200, L4, "
                              "V100, RTX 4090"),
    (["--target-gpu", "H100", "--mfu", "0"], "--mfu 0.0: expected a share of the peak in (0, 1]"),
    (["--target-gpu", "H100", "--mfu", "40"], "--mfu 40.0: expected a share"),
    (["--target-gpu", "H100", "--target-flops", "1e15"], "not both"),
    (["--sweep", "--sweep-repeats", "1"], "sweep repeats must be ≥ 2"),
    (["--sweep", "--sweep-seconds", "0"], "--sweep-seconds 0.0: expected the sweep's time budget"),
    (["--decode", "crop:64"], "--decode 'crop:64': expected random-resized-crop:SIZE, "
                              "center-crop:SIZE[:RESIZE] or resize:SIZE"),
    (["--decode", "center-crop:64:32"], "--decode 'center-crop:64:32': expected"),
])
def test_bad_options_are_one_line_before_measuring(packed, args, message):
    assert message in one_line_error(runner.invoke(app, ["bench", str(packed["lmdb"]), *args]))


def test_target_gpu_in_the_verdict_and_json(packed, tmp_path):
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["bench", str(packed["lmdb"]), *FAST, *ON_CPU, "--augment",
                                 "cifar", "--target-gpu", "rtx 4090", "--amp", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert re.search(r"An RTX 4090 at 40% MFU \(bf16\) would consume about [\d,]+ samples/s of "
                     r"this small-cnn; your I/O delivers [\d,]+", text)
    assert "GFLOP per sample per training step" in text
    doc = json.loads(out.read_text())
    assert doc["settings"]["augment"] == "cifar"
    assert doc["runs"][0]["target"]["target"]["peak_flops"] == 165.2e12


def test_mixed_sizes_get_a_decode_stage_said_on_the_folder_and_the_dataset(photo_folder,
                                                                           tmp_path):
    """Photos of 14 sizes: the folder (read file by file, resized one image at a time) and its
    conversion (batched through the stage) both run, the stage chosen said before measuring;
    --decode chooses another."""
    import packdata

    converted = packdata.convert(packdata.open_source(photo_folder), tmp_path / "p.h5",
                                 workers=1).path
    for path in (photo_folder, converted):
        out = tmp_path / f"{path.suffix or 'folder'}.json"
        result = runner.invoke(app, ["bench", str(path), "--steps", "1", "--warmup", "1",
                                     "--batch-size", "4", "--json", str(out)])
        assert result.exit_code == 0, result.output
        said = " ".join(result.output.split())
        assert (f"{path}: images of mixed sizes: each batch decoded with --decode "
                "random-resized-crop:224") in said
        assert "batch (uint8 4×3×224×224, int64 4)" in said
        assert json.loads(out.read_text())["runs"][0]["io"]["samples"] >= 4
    result = runner.invoke(app, ["bench", str(converted), "--steps", "1", "--warmup", "1",
                                 "--batch-size", "4", "--decode", "center-crop:48:56"])
    assert result.exit_code == 0, result.output
    assert "batch (uint8 4×3×48×48, int64 4)" in " ".join(result.output.split())
    assert "mixed sizes" not in result.output
