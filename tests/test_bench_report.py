"""Outputs: the JSON document and its documented schema, the terminal report, the PNG plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from packdata.bench.inputs import LoaderOptions
from packdata.bench.report import SCHEMA, plot, print_report, schema_errors, write_json
from packdata.bench.settings import BenchSettings
from packdata.bench.suite import run_bench

DOC = Path(__file__).parents[1] / "docs" / "bench.md"


@pytest.fixture(scope="module")
def result(packed, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    grid = [LoaderOptions(), LoaderOptions(num_workers=1, prefetch_factor=2)]
    return run_bench(packed["lmdb"], BenchSettings(batch_size=20, steps=2, warmup=1),
                     sweep=True, sweep_grid=grid, sweep_seconds=1, sweep_repeats=2,
                     profile=out / "prof")


def test_result_and_its_json_have_the_documented_schema(result, tmp_path):
    assert schema_errors(result) == []
    path = tmp_path / "r.json"
    write_json(result, path)
    doc = json.loads(path.read_text())
    assert schema_errors(doc) == []
    assert doc["schema"] == 2 and len(doc["sweep"]["rows"]) == 2
    assert doc["flops"]["per_sample"] > 0 and doc["flops"]["achieved_per_s"] > 0
    assert doc["runs"][0]["input"]["format"] == "lmdb"
    del doc["runs"][0]["loop"]["load_ms"]
    del doc["profile"]["parts_ms"]["other"]
    assert schema_errors(doc) == ["runs[0].loop: load_ms", "profile.parts_ms: other"]


def test_json_has_no_nan(tmp_path):
    path = tmp_path / "n.json"
    write_json({"a": float("nan"), "b": [float("inf"), 1.5]}, path)
    assert json.loads(path.read_text()) == {"a": None, "b": [None, 1.5]}


def test_docs_describe_every_key():
    text = DOC.read_text()
    for level, keys in SCHEMA.items():
        for key in keys:
            assert re.search(rf"`{key}`", text), f"docs/bench.md does not describe `{key}` ({level})"


def test_terminal_report(result):
    console = Console(record=True, width=150)
    print_report(result, console)
    text = console.export_text()
    assert result["runs"][0]["verdict"][:40] in text.replace("\n", " ")
    assert "loader sweep: 2 configurations × 2 runs" in text
    assert re.search(r"best: num_workers=|no clear winner: ", text)
    assert "GFLOP per sample per training step" in text
    assert "step-time breakdown" in text and "data loading is" in text
    assert result["settings"]["warm"] is True
    assert "I/O timed warm: each measurement first read, untimed, the batches it timed" in text
    cold = {**result, "settings": {**result["settings"], "warm": False}}
    console = Console(record=True, width=150)
    print_report(cold, console)
    assert "I/O timed cold: first reads after opening" in console.export_text()


def test_plot_is_a_png(result, tmp_path):
    path = tmp_path / "bench.png"
    plot(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] > im.size[1] > 200  # two panels side by side
    single = {**result, "sweep": None}
    plot(single, tmp_path / "one.png")
    with Image.open(tmp_path / "one.png") as im:
        assert im.size[0] < 1000


def test_tables_fit_80_columns_without_cutting_numbers(result):
    """CI logs are 80 columns: no number is cut ("1,804,…"), the sweep stays readable."""
    wide = json.loads(json.dumps(result))
    wide["runs"][0]["io"]["samples_per_s"] = 1_804_123.4
    wide["runs"][0]["io_over_train"] = 11_070.3
    for row in wide["sweep"]["rows"]:
        row["rates"] = [1_234_567.0, 2_345_678.0]
        row["samples_per_s"] = 1_804_123.4
    # the marks follow the measured sweep, which noise may order either way: fix the winner
    wide["sweep"]["best"], wide["sweep"]["tied"] = 0, []
    console = Console(record=True, width=80)
    print_report(wide, console)
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "1,804,123" in text and "11,070×" in text and "1.23M–2.35M" in text
    assert re.search(r"★ +w0 ", text)
    assert "loader: wN num_workers, pfN prefetch_factor" in text
