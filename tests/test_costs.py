"""What a conversion reports it spent (packdata.conversion.costs): the parent's phases, the
workers' CPU and the bytes handed over, on real conversions."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np

import packdata
from packdata.conversion.costs import SPREAD, Costs

CIFAR = Path(__file__).resolve().parents[1] / "packdata" / "demo_data" / "cifar10"


def test_a_conversion_in_workers_reports_its_phases_and_bytes(png_folder, tmp_path):
    result = packdata.convert(packdata.open_source(png_folder), tmp_path / "d.lmdb", workers=2)
    costs, m = result.costs, result.manifest
    assert {"listing", "keys", "survey", "hand-over", "writing", "metadata", "finish",
            "commit"} <= set(costs.parent)
    assert "load" not in costs.parent  # the workers loaded every input
    assert costs.workers["load"] > 0 and "hashing" in costs.workers
    record = sum(f.nbytes for f in m.fields.values())
    # every record's bytes and checksum crossed from the workers, once
    assert costs.bytes["handed_over"] == m.count * (record + 8)
    wall = sum(w for w, _ in costs.parent.values())
    assert wall <= result.seconds + costs.parent["listing"][0] + costs.parent["keys"][0] + 0.05
    assert 0 < costs.serial_cpu() <= sum(c for _, c in costs.parent.values())


def test_a_conversion_in_one_process_loads_in_the_parent(png_folder, tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = packdata.convert(packdata.open_source(png_folder), tmp_path / "d.lmdb", workers=1)
    after = resource.getrusage(resource.RUSAGE_SELF)
    costs = result.costs
    assert costs.workers == {} and costs.parent["load"][1] > 0 and costs.parent["survey"][1] > 0
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert sum(c for _, c in costs.parent.values()) <= spent + 0.01
    assert costs.serial_cpu() == sum(c for n, (_, c) in costs.parent.items() if n not in SPREAD)
    shown = costs.to_dict()
    assert shown["serial_cpu"] == round(costs.serial_cpu(), 6)
    assert set(shown["parent"]) == set(costs.parent)


def test_variable_records_are_hashed_in_the_workers(png_folder, tmp_path):
    source = packdata.open_source(png_folder, max_size=20)  # pixel rows of any size
    result = packdata.convert(source, tmp_path / "v.h5", workers=2)
    assert result.manifest.fields["image"].variable
    assert result.costs.workers["hashing"] > 0
    assert "hashing" not in result.costs.parent  # the process that writes hashed nothing
    assert packdata.verify(result.path).ok  # and the checksums the workers made are right


def test_phases_add_up():
    costs = Costs()
    for _ in range(2):
        with costs.phase("writing"):
            sum(range(10_000))
    mark = costs.mark()
    costs.since("commit", mark)
    costs.add_workers({"load": 1.0})
    costs.add_workers({"load": 0.5, "pack": 0.25})
    assert costs.workers == {"load": 1.5, "pack": 0.25}
    assert costs.parent["writing"][0] > 0 and set(costs.parent) == {"writing", "commit"}


def test_the_survey_reads_headers_in_the_workers_as_here(tmp_path):
    """600 PNGs: three survey tasks of 256 headers at most, read by two workers; the rows they
    count and the choice they settle are those of a survey here."""
    from packdata.bench.baselines import tile_image_folder
    from packdata.conversion.survey import survey

    folder = tile_image_folder(CIFAR, tmp_path / "png", 600)
    source = packdata.open_source(folder, max_size=20)
    items = source.items()
    costs, here = Costs(), Costs()
    rows = survey(source, items, workers=2, costs=costs)
    alone = survey(source, items, workers=1, costs=here)
    assert costs.workers["survey"] > 0 and "survey" not in costs.parent
    assert here.parent["survey"][1] > 0 and here.workers == {}
    assert rows.keys() == alone.keys() == {"image"} and len(rows["image"]) == 600
    assert np.array_equal(rows["image"], alone["image"]) and set(rows["image"]) == {400}


def test_a_phase_not_named_in_the_tables_is_refused():
    """A misspelt phase would be timed apart and counted as serial work: refused by name."""
    import pytest

    from packdata.conversion.costs import Costs, WorkerClock

    with pytest.raises(ValueError, match="no conversion phase 'writting'"):
        Costs().phase("writting").__enter__()  # before the block runs
    with pytest.raises(ValueError, match="no conversion phase 'list'"):
        Costs().since("list", Costs.mark())
    with pytest.raises(ValueError, match="no conversion phase 'packing'"):
        WorkerClock().phase("packing").__enter__()
    costs = Costs()
    with costs.phase("writing"):
        pass
    assert list(costs.parent) == ["writing"]
