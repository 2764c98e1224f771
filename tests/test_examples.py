"""The examples in examples/ train on tiny real slices: both data paths run, the loss falls, the
table and the JSON are written, and a dataset of the wrong kind is refused naming what it is."""

from __future__ import annotations

import gzip
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch

import packdata
from packdata.errors import PackdataError
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import doc_snippets  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CIFAR = ROOT / "packdata" / "demo_data" / "cifar10"

pytestmark = pytest.mark.usefixtures("one_thread")


def example(name: str):
    return load_script(ROOT / "examples" / f"{name}.py", f"example_{name}")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_bytes(gzip.decompress((FIXTURES / "text" / "gpt2" / "tokenizer.json.gz").read_bytes()))
    return path


@pytest.fixture(scope="module")
def one_pep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("peps")
    shutil.copyfile(FIXTURES / "text" / "peps" / "pep-0294.txt", out / "pep-0294.txt")
    return out


def check_run(doc: dict, json_path: Path | None, out: str, learns: bool = True) -> None:
    """Both loaders ran every epoch (and, where ``learns``, the loss fell); the table and the
    JSON were written."""
    assert set(doc["epochs"]) == {"baseline", "packdata"}
    for name, rows in doc["epochs"].items():
        assert not learns or rows[-1]["loss"] < rows[0]["loss"], (name, [r["loss"] for r in rows])
        for row in rows:
            assert 0 <= row["load_share"] <= 1 and row["seconds"] > 0 and row["steps"] > 0
    if json_path is not None:
        written = json.loads(json_path.read_text())
        assert written["epochs"]["packdata"][0]["steps"] == doc["epochs"]["packdata"][0]["steps"]
    assert "| epoch | baseline s | baseline loading | baseline loss" in out
    assert "packdata loading" in out and "[packdata] epoch 0:" in out


# -- the commands examples/README.md documents, each run once ----------------------------------
# The docs test skips them (their skip-line markers name this file): each trains here, in this
# process, on the docs' workspace, and what it trained is checked, not only its exit status.

README = ROOT / "examples" / "README.md"
BY_THIS_FILE = "tests/test_examples.py runs it"


def documented(prefix: str) -> list[list[str]]:
    """The command lines of examples/README.md starting with ``prefix`` that the docs test
    leaves to this file, as argument lists (the script's path first)."""
    return [shlex.split(command)[1:] for snippet in doc_snippets.extract(README)
            if not snippet.skip for command, reason in doc_snippets.commands(snippet)
            if command.startswith(prefix) and reason and BY_THIS_FILE in reason]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The docs' workspace: the inputs examples/README.md names (tools/doc_snippets.py)."""
    return doc_snippets.make_workspace(tmp_path_factory.mktemp("examples-docs"))


@pytest.mark.parametrize("argv", documented("python examples/"), ids=lambda a: " ".join(a[:3]))
def test_each_documented_example_command_trains_on_both_paths(argv, workspace, monkeypatch,
                                                              capsys):
    """As documented: on the workspace's 40 CIFAR PNGs an epoch is one batch of the default 64
    (the loss need not fall in 3 of them: test_cifar_example_learns trains longer); the LiDAR
    pieces' 10 epochs learn."""
    monkeypatch.chdir(workspace)
    name = Path(argv[0]).stem
    doc = example(name).main(argv[1:])
    json_path = Path(argv[argv.index("--json") + 1]) if "--json" in argv else None
    check_run(doc, json_path, capsys.readouterr().out, learns=name != "cifar10_cnn")
    if name == "cifar10_cnn":  # 40 PNGs: every 10th held out
        assert doc["train_samples"] == 36 and doc["test_samples"] == 4
        assert doc["epochs"]["baseline"][0]["samples"] == doc["epochs"]["packdata"][0]["samples"]
        assert all(0 <= r["test_accuracy"] <= 1 for r in doc["epochs"]["packdata"])
    else:
        assert doc["classes"] == ["airborne_tree", "mobile_stem", "survey"]


def test_documented_parity_commands_write_their_results(workspace, monkeypatch, capsys):
    """bench/bench_parity.py as examples/README.md runs it (the workspace's copy, so that its
    results land in the workspace): every part it names writes parity-PART.json with the
    summary its table is written from."""
    commands = documented("python bench/bench_parity.py")
    assert len(commands) == 2
    monkeypatch.chdir(workspace)
    parity = load_script(workspace / "bench" / "bench_parity.py", "bench_parity_documented")
    for argv in commands:
        monkeypatch.setattr(sys, "argv", argv)
        parity.main()
        for part in [argv[i + 1] for i, word in enumerate(argv) if word == "--only"]:
            doc = json.loads((workspace / "bench" / "results" / f"parity-{part}.json").read_text())
            assert doc["command"] == "python " + " ".join(argv) and doc["runs"], part
            assert set(doc["summary"]) >= {"load_share"} | ({"speedup", "loss_gap"}
                                                            if part == "text" else set())
    assert "== cifar:" in capsys.readouterr().out


def test_cifar_example_learns(workspace, tmp_path, capsys):
    """The small CNN in batches of 8: the loss falls on both paths over 3 epochs."""
    doc = example("cifar10_cnn").main([
        "--data", str(workspace / "cifar10" / "test-png"), "--labels",
        str(workspace / "cifar10" / "labels.json"), "--epochs", "3", "--batch-size", "8",
        "--device", "cpu", "--model", "small-cnn", "--json", str(tmp_path / "cifar.json")])
    check_run(doc, tmp_path / "cifar.json", capsys.readouterr().out)


def test_text_example_trains_on_both_paths(one_pep, tmp_path, capsys):
    doc = example("text_lm").main([
        "--data", str(one_pep), "--epochs", "3", "--batch-size", "8", "--device", "cpu",
        "--json", str(tmp_path / "text.json")])  # bytes tokeniser: a small output layer
    out = capsys.readouterr().out
    check_run(doc, tmp_path / "text.json", out)
    base, packed = doc["epochs"]["baseline"][0], doc["epochs"]["packdata"][0]
    assert base["loss_count"] == packed["loss_count"]  # the same real tokens on both paths
    assert packed["padding"] < base["padding"]  # length buckets pad less than random batches
    assert "held-out loss per real token" in out


def test_text_baseline_tokenises_as_the_container_stores(one_pep, gpt2, tmp_path):
    """The baseline's per-item tokenising gives exactly the ids packdata pre-tokenised."""
    pytest.importorskip("tokenizers")
    text_lm = example("text_lm")
    lines = text_lm.read_lines(one_pep)
    src = packdata.open_source(one_pep, kind="text", tokenizer=gpt2, per_line=True,
                               add_bos=True, add_eos=True, max_length=32)
    packdata.convert(src, tmp_path / "lines.h5", workers=1)
    ds = packdata.open(tmp_path / "lines.h5")
    items = text_lm.LineDataset(lines, str(gpt2), 32)
    items.bos = items.eos = 50256
    assert len(ds) == len(lines) > 50
    assert all(torch.equal(ds[i], items[i]) for i in range(len(lines)))


@pytest.mark.parametrize("name, data", [
    ("cifar10_cnn", FIXTURES / "lidar-pieces"),
    ("lidar_pointnet", CIFAR),
    ("text_lm", CIFAR),
])
def test_examples_refuse_the_wrong_kind_of_dataset(name, data, capsys, monkeypatch):
    module = example(name)
    with pytest.raises(PackdataError, match=r"expected .*, found (pointcloud|image) data \(\d+ \.(las|png)"):
        module.main(["--data", str(data), "--device", "cpu"])
    monkeypatch.setattr(sys, "argv", [name, "--data", str(data), "--device", "cpu"])
    assert module.common.run_main(module.main, None) == 2
    assert capsys.readouterr().err.startswith("error: ")
