"""Mid-epoch resume: every stateful piece through one definition (packdata.loading.resume.resumable),
refusals of states that do not fit, and check-resume catching deliberately broken samplers."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

import packdata
from packdata.errors import ArgumentError, ResumeError
from packdata.loading.buckets import LengthBucketBatchSampler
from packdata.loading.resume import resumable
from packdata.loading.sampling import EpochBatchSampler
from packdata.resume_check import check_resume, sample_ids

LENGTHS = np.random.default_rng(3).integers(1, 300, size=203)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("options", [{}, {"shuffle": False}, {"drop_last": True},
                                     {"world_size": 3, "rank": 2},
                                     {"world_size": 4, "rank": 1, "drop_last": True}])
def test_epoch_sampler_resumes(options, k):
    ok, why = resumable(lambda: EpochBatchSampler(101, 8, seed=5, **options), k, epochs=2)
    assert ok, why


@pytest.mark.parametrize("k", [1, 5, 12])
@pytest.mark.parametrize("options", [{"batch_size": 8}, {"max_tokens": 900},
                                     {"batch_size": 8, "world_size": 3, "rank": 1}])
def test_bucket_sampler_resumes(options, k):
    ok, why = resumable(lambda: LengthBucketBatchSampler(LENGTHS, seed=2, **options), k, epochs=2)
    assert ok, why


@pytest.mark.parametrize("options", [{"num_workers": 0}, {"num_workers": 2, "workers": "thread"},
                                     {"num_workers": 2, "workers": "process"}])
def test_loader_resumes(packed, options):
    ds = packdata.open(packed["tar"])
    ok, why = resumable(lambda: packdata.loader(ds, 16, shuffle=True, seed=1, **options), 5, epochs=2,
                        key=sample_ids)
    assert ok, why


def test_loader_resumes_with_other_num_workers(packed):
    ds = packdata.open(packed["lmdb"])
    reference = [sample_ids(b) for b in packdata.loader(ds, 16, shuffle=True, seed=3, num_workers=0)]
    first = packdata.loader(ds, 16, shuffle=True, seed=3, num_workers=2, workers="process", epoch=0)
    it = iter(first)
    head = [sample_ids(next(it)) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    again = packdata.loader(ds, 16, shuffle=True, seed=3, num_workers=0, epoch=0)
    again.load_state_dict(state)
    assert head + [sample_ids(b) for b in again] == reference


@pytest.mark.parametrize("sampler", ["epoch", "bucket"])
@pytest.mark.parametrize(("world", "new_world"), [(2, 3), (3, 2), (4, 1)])
def test_other_world_size_re_splits_the_rest_exactly_once(sampler, world, new_world):
    def make(rank, w):
        if sampler == "epoch":
            return EpochBatchSampler(203, 8, seed=9, rank=rank, world_size=w)
        return LengthBucketBatchSampler(LENGTHS, 8, seed=9, rank=rank, world_size=w)

    ranks = [make(r, world) for r in range(world)]
    iters = [iter(s) for s in ranks]
    served = [i for it in iters for _ in range(4) for i in next(it)]
    state = ranks[0].state_dict()
    assert all(s.state_dict() == state for s in ranks)
    rest = [list(s) for s in (make(r, new_world) for r in range(new_world))
            if s.load_state_dict(state) is None]
    assert len({len(r) for r in rest}) == 1  # equal batch counts on the new ranks
    served += [i for r in rest for b in r for i in b]
    counts = Counter(served)
    assert set(counts) == set(range(203))  # nothing skipped
    assert sum(counts.values()) - 203 < max(world, new_world)  # only the stated padding repeats


def test_state_is_small_and_plain_json():
    sampler = EpochBatchSampler(1_000_000, 64, seed=1, world_size=2, rank=0)
    it = iter(sampler)
    next(it)
    assert len(json.dumps(sampler.state_dict())) < 300


def test_state_of_another_dataset_version_or_corrupted_is_refused(packed):
    ds = packdata.open(packed["lmdb"])
    dl = packdata.loader(ds, 16, shuffle=True, seed=0, num_workers=0)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    other = packdata.loader(packdata.open(packed["hdf5"]), 16, shuffle=True, seed=0, num_workers=0)
    other.load_state_dict(state)  # the same records in another container: the same manifest
    smaller = packdata.loader(ds, 16, shuffle=True, seed=1, num_workers=0)
    with pytest.raises(ResumeError, match="seed 0 .now 1"):
        smaller.load_state_dict(state)
    dl.load_state_dict({**state, "packdata": "0.0.1"})  # another version, the same order
    with pytest.raises(ResumeError, match=r"saved by packdata 0.0.1, whose sampling order "
                                          r"\(version 0\) is not this packdata"):
        dl.load_state_dict({**state, "packdata": "0.0.1", "order": 0})
    old = {k: v for k, v in state.items() if k not in ("order", "records")}
    dl.load_state_dict(old)  # saved before states recorded their order: order 1
    broken = json.loads(json.dumps(state))
    broken["sampler"]["plan"][0][1] = 3
    with pytest.raises(ResumeError, match="corrupted"):
        dl.load_state_dict(broken)


def test_a_refused_state_names_how_the_datasets_differ(packed, png_folder, tmp_path):
    """Not two fingerprint hashes: what differs, in words."""
    import shutil

    from tests.conftest import copy_sample

    ds = packdata.open(packed["lmdb"])
    dl = packdata.loader(ds, 16, seed=0, num_workers=0)
    next(iter(dl))
    state = dl.state_dict()

    def refused(folder, **options):
        other = packdata.convert(packdata.open_source(folder, **options),
                                 tmp_path / f"{len(list(tmp_path.iterdir()))}.lmdb").path
        with pytest.raises(ResumeError) as refusal:
            packdata.loader(packdata.open(other), 16, seed=0).load_state_dict(state)
        return str(refusal.value)

    fewer = refused(copy_sample(tmp_path / "fewer", 110))
    assert fewer == "the state belongs to another dataset: it has 120 samples, this dataset 110"
    assert "its fields are image uint8 3×32×32, label int64 scalar, this dataset's image " \
           "uint8 3×16×16" in refused(png_folder, resize=16)
    renamed = tmp_path / "renamed"
    shutil.copytree(png_folder, renamed)
    last = sorted(renamed.glob("*.png"))[-1]
    last.rename(renamed / "zebra.png")
    labels = json.loads((renamed / "labels.json").read_text())
    labels["labels"]["zebra.png"] = labels["labels"].pop(last.name)
    (renamed / "labels.json").write_text(json.dumps(labels))
    assert refused(renamed).endswith("its samples are other files (keys 'airplane_0000' … "
                                     "'truck_0011'; this dataset 'airplane_0000' … 'zebra')")
    with pytest.raises(ResumeError, match="the same files hold other contents"):
        dl.load_state_dict({**state, "dataset": "00000000"})


def test_same_records_in_another_container_share_the_fingerprint(packed, tmp_path):
    from packdata.loading.resume import fingerprint
    from tests.conftest import copy_sample

    a, b = packdata.open(packed["lmdb"]), packdata.open(packed["hdf5"])
    fewer = packdata.convert(packdata.open_source(copy_sample(tmp_path / "png", 110)),
                             tmp_path / "fewer.lmdb").path
    assert fingerprint(a) == fingerprint(b) != fingerprint(packdata.open(fewer))


def test_rebuilding_a_shuffled_loader_each_epoch_warns_and_epoch_continues(packed):
    ds = packdata.open(packed["lmdb"])
    first = [sample_ids(b) for b in packdata.loader(ds, 32, shuffle=True, seed=0, num_workers=0)]
    with pytest.warns(UserWarning, match="starts again at epoch 0"):
        packdata.loader(ds, 32, shuffle=True, seed=0, num_workers=0)
    again = packdata.loader(ds, 32, shuffle=True, seed=0, num_workers=0, epoch=1)
    second = [sample_ids(b) for b in again]
    assert second != first and Counter(sum(second, [])) == Counter(sum(first, []))


def test_dataset_epoch_follows_the_loader(packed):
    ds = packdata.open(packed["lmdb"])
    dl = packdata.loader(ds, 32, num_workers=0)
    seen = []
    for _ in range(3):
        for _ in dl:
            seen.append(ds.epoch)
            break
    assert seen == [0, 1, 2]


# -- check-resume must catch real faults --------------------------------------------------------

class ForgetsPosition(EpochBatchSampler):
    def load_state_dict(self, state):
        super().load_state_dict({**state, "plan": []})


class UnseededShuffle(EpochBatchSampler):
    def rng(self, epoch):
        return np.random.default_rng()


class UnequalRanks(EpochBatchSampler):
    def indices(self, epoch, plan=()):
        rest = self.rng(epoch).permutation(self.size)
        for world, batches in plan:
            rest = rest[batches * self.batch_size * world:]
        return rest[self.rank :: self.world_size]  # no padding: shares differ by one sample


SETUPS = ((1, 0, None), (2, 0, None))


@pytest.mark.parametrize(("broken", "message"), [
    (ForgetsPosition, "rest of the epoch differs"),
    (UnseededShuffle, "is the order seeded"),
    (UnequalRanks, "unequal batch counts"),
])
def test_check_resume_reports_broken_samplers(packed, broken, message):
    ds = packdata.open(packed["lmdb"])
    size = 97  # of the 120 samples: 49 and 48 per rank make 4 and 3 batches of 16
    results = check_resume(ds, samplers={"broken": lambda d, r, w: broken(
        size, 16, seed=0, rank=r, world_size=w)}, setups=SETUPS, trials=2, batch_size=16)
    assert not all(r.ok for r in results)
    assert any(message in f for r in results for f in r.failures)


def test_check_resume_passes_packdata_samplers(packed):
    results = check_resume(packdata.open(packed["tar"]), setups=SETUPS + ((3, 2, "thread"),),
                           trials=2, batch_size=8)
    assert [r.name for r in results if not r.ok] == []
    assert len(results) == 12 and all(r.name.startswith("streaming") for r in results[-3:])


def test_check_resume_command(packed):
    from typer.testing import CliRunner

    from packdata.cli import app

    result = CliRunner().invoke(app, ["check-resume", str(packed["lmdb"]), "--trials", "1",
                                      "--batch-size", "16",
                                      "--no-processes"])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "8 of 8 scenarios passed" in result.output
    assert "process workers" not in result.output.replace("0 process workers", "")


def test_check_resume_refuses_a_dataset_too_small_for_its_scenarios(packed):
    """120 records at the default batch of 64: no scenario could be interrupted (drop_last
    would drop everything); one line naming --batch-size, exit 2, before any scenario runs."""
    from typer.testing import CliRunner

    from packdata.cli import app

    result = CliRunner().invoke(app, ["check-resume", str(packed["lmdb"])])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert "120 records, too few to interrupt every scenario at --batch-size 64" in result.output
    assert "pass --batch-size 20 or less" in result.output
    # without the process setup (3 ranks) the largest world is 2 ranks: 30 a batch fits
    with pytest.raises(ArgumentError, match="pass --batch-size 30 or less"):
        check_resume(packed["lmdb"], processes=False, batch_size=31)


def test_check_resume_rows_align_whatever_the_names():
    from packdata.resume_check import ScenarioResult, format_row

    rows = [format_row(ScenarioResult(name=n, trials=t, seconds=s)) for n, t, s in (
        ("sequential, 1 rank, 0 workers", 1, 0.04),
        ("shuffled drop_last, 3 ranks, 2 process workers", 12, 123.4))]
    assert len({row.index(" s  ") for row in rows}) == 1
    assert rows[1].endswith("shuffled drop_last, 3 ranks, 2 process workers")


def test_sample_ids_tell_samples_apart(packed):
    ds = packdata.open(packed["lmdb"])
    ids = sample_ids(ds.get_batch(np.arange(len(ds))))
    assert len(set(ids)) == len(ds) and isinstance(ds.get_batch([0])[0], torch.Tensor)


def as_rows(rows):  # module level: spawned workers import it by name
    return rows


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_workers_read_one_shuffled_epoch_like_in_process_under_every_start_method(packed, context):
    from torch.utils.data import ConcatDataset, DataLoader

    parts = [packdata.open(packed[name]) for name in ("lmdb", "hdf5", "tar")]
    for ds in parts:
        ds[0]  # opens the handle a worker must not inherit or receive pickled
    both = ConcatDataset(parts)
    sampler = EpochBatchSampler(len(both), 40, seed=6)
    expected = [[both[i] for i in batch] for batch in sampler]
    sampler.set_epoch(0)
    loader = DataLoader(both, batch_sampler=sampler, num_workers=1,
                        multiprocessing_context=context, collate_fn=as_rows)
    got = list(loader)
    assert len(got) == len(expected)
    for batch, reference in zip(got, expected, strict=True):
        for (x, y), (rx, ry) in zip(batch, reference, strict=True):
            assert torch.equal(x, rx) and int(y) == int(ry)


def test_check_resume_covers_the_bucketed_sampler_on_text(packed_text):
    ds = packdata.open(next(iter(packed_text.values())))
    results = check_resume(ds, setups=SETUPS, trials=2, batch_size=4)
    assert [r.name for r in results if not r.ok] == []
    assert any(r.name.startswith("bucketed") for r in results)


def test_stream_batches_are_identified_like_dataset_batches(packed):
    """check-resume compares a stream's DataLoader batches with the dataset's own batches: the
    same samples must get the same ids, with one field (a lone batched tensor) or several."""
    from packdata.resume_check import collate_parts

    ds = packdata.open(packed["lmdb"])
    samples = [ds[i] for i in range(4)]
    assert sample_ids(collate_parts(samples)) == sample_ids(ds.get_batch(np.arange(4)))
    images = [s[0] for s in samples]
    assert sample_ids(collate_parts(images)) == sample_ids(torch.stack(images))
    assert len(set(sample_ids(collate_parts(images)))) == 4
