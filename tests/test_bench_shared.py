"""bench/_shared.py, what the project's bench scripts share: flags, interleaved rounds, same-run
ratios, the results file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

shared = load_script(Path(__file__).resolve().parents[1] / "bench" / "_shared.py", "_shared")


def test_interleaved_runs_every_run_once_per_round_in_order(capsys):
    calls = []
    runs = {name: (lambda name=name: calls.append(name) or len(calls)) for name in ("a", "b")}
    out = shared.interleaved(3, runs)
    assert calls == ["a", "b"] * 3
    assert out == {"a": [1, 3, 5], "b": [2, 4, 6]}
    assert capsys.readouterr().err.splitlines() == ["round 1/3", "round 2/3", "round 3/3"]
    shared.interleaved(1, runs, progress=False)
    assert capsys.readouterr().err == ""


def test_ratio_of_rounds_is_the_median_of_per_round_ratios():
    ratio, spread = shared.ratio_of_rounds([2.0, 9.0, 3.0], [1.0, 3.0, 2.0])
    assert ratio == 2.0 and spread == [1.5, 3.0]  # ratios 2, 3, 1.5
    with pytest.raises(ValueError):  # rounds that do not pair up are a mistake, not a ratio
        shared.ratio_of_rounds([1.0, 2.0], [1.0])


def test_seconds_times_the_call():
    assert 0.01 <= shared.seconds(lambda: __import__("time").sleep(0.01)) < 5


def test_parser_has_only_the_flags_given(tmp_path):
    args = shared.parser("First line.\n\nMore.", dataset=True, count=7,
                         results="x.json").parse_args(["ds"])
    assert (args.dataset, args.count, args.json) == ("ds", 7, Path("bench/results/x.json"))
    assert not hasattr(args, "rounds") and not hasattr(args, "data")
    assert shared.parser(None).parse_args([]).json is None  # --json: optional without a default
    assert shared.parser(None).description is None


def test_write_results_makes_the_folder_and_records_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/bench/bench_x.py", "--count", "5"])
    target = tmp_path / "new" / "r.json"
    shared.write_results(target, {"command": shared.command_line(), "n": 1})
    assert json.loads(target.read_text()) == {"command": "python bench/bench_x.py --count 5",
                                              "n": 1}
