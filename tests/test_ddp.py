"""A real two-process torch.distributed group (gloo, CPU, a file store): each rank reads its share
through `packdata.loader` (thread and process workers) and through `StreamingDataset` in a
DataLoader with worker processes. Shares are checked by iterating, from the samples themselves,
against what the README and the docstrings promise: equal counts per rank, disjoint shares that
cover the dataset (the last few wrapped round to make them equal, or left out with drop_last),
a new order each epoch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import packdata
from tests.conftest import copy_sample

pytestmark = pytest.mark.skipif(not dist.is_available() or sys.platform == "win32",
                                reason="needs torch.distributed with gloo")

COUNT = 117  # not a multiple of the world size: the wrap and drop_last both show
WORLD = 2


def _sample_ids(ds, batches) -> list[int]:
    """Each delivered sample's index, recovered from its pixels (unique per real image)."""
    lookup = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    return [lookup[img.contiguous().numpy().tobytes()] for images, _ in batches for img in images]


def _rank_main(rank: int, store: str, path: str, out: str) -> None:
    """One rank: join the group, read two epochs through each path, write what it saw."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        ds = packdata.open(path)
        seen: dict[str, list[list[int]]] = {}
        for name, options in (("loader thread workers", {"num_workers": 2, "workers": "thread"}),
                              ("loader process workers", {"num_workers": 2, "workers": "process"}),
                              ("loader drop_last", {"drop_last": True})):
            # one loader per dataset, iterated once per epoch, as the README says
            loader = packdata.loader(packdata.open(path), batch_size=8, shuffle=True, seed=0,
                                     **options)
            seen[name] = [_sample_ids(ds, loader) for _ in range(2)]
        for drop_last in (False, True):
            stream = packdata.StreamingDataset(path, shuffle_buffer=16, seed=0, drop_last=drop_last)
            batches = DataLoader(stream, batch_size=8, num_workers=2)
            seen[f"stream drop_last={drop_last}"] = [_sample_ids(ds, batches) for _ in range(2)]
        # the group is real: the ranks' counts meet in a collective
        total = torch.tensor([len(seen["loader thread workers"][0])])
        dist.all_reduce(total)
        seen["all_reduce"] = [[int(total)]]
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def odd_tar(tmp_path_factory) -> Path:
    """117 real CIFAR PNGs (3 of the 120 removed) in tar shards of 20."""
    folder = copy_sample(tmp_path_factory.mktemp("ddp") / "png")
    meta = json.loads((folder / "labels.json").read_text())
    for name in sorted(meta["labels"])[-3:]:
        (folder / name).unlink()
        del meta["labels"][name]
    (folder / "labels.json").write_text(json.dumps(meta))
    out = tmp_path_factory.mktemp("ddp-tar") / "ds"
    return packdata.convert(packdata.open_source(folder), out, workers=1,
                            container_options={"shard_size": "20"}).path


def test_two_ranks_of_a_gloo_group_get_equal_disjoint_shares(odd_tar, tmp_path):
    assert len(packdata.open(odd_tar)) == COUNT
    mp.spawn(_rank_main, args=(str(tmp_path / "store"), str(odd_tar), str(tmp_path)),
             nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["all_reduce"] == ranks[1]["all_reduce"] == [[2 * 59]]
    for path, epochs in ranks[0].items():
        if path == "all_reduce":
            continue
        drop_last = "drop_last" in path and "drop_last=False" not in path
        share = COUNT // WORLD if drop_last else -(-COUNT // WORLD)  # 58 or 59
        if path == "loader drop_last":  # the loader also drops each rank's incomplete batch
            share = share // 8 * 8
        for epoch in range(2):
            a, b = ranks[0][path][epoch], ranks[1][path][epoch]
            context = f"{path}, epoch {epoch}"
            assert len(a) == len(b) == share, context
            assert len(set(a)) == len(a) and len(set(b)) == len(b), context  # once per rank
            if drop_last:  # the rest left out, no sample on both ranks
                assert not set(a) & set(b) and len(set(a) | set(b)) == WORLD * share, context
            else:  # every sample, one of them wrapped round to the second rank as well
                assert set(a) | set(b) == set(range(COUNT)), context
                assert len(set(a) & set(b)) == WORLD * share - COUNT, context
        assert epochs[0] != epochs[1], f"{path}: the second epoch repeats the first order"


def test_no_process_group_reads_everything(odd_tar):
    """The same loader outside DDP: one rank, the whole dataset (the baseline of the above)."""
    assert not dist.is_initialized() and "RANK" not in os.environ
    ds = packdata.open(odd_tar)
    assert sorted(_sample_ids(ds, packdata.loader(ds, batch_size=8, seed=0))) == list(range(COUNT))
