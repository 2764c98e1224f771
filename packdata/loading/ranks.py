"""DDP ranks: which rank this process is, of how many, and how an epoch's samples split into
equal shares (every rank runs the same number of steps)."""

from __future__ import annotations

import torch.distributed as dist

from packdata.errors import ArgumentError


def ddp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) outside DDP."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank`` and ``world_size`` as given, each defaulting to the process group's (see
    :func:`ddp_rank_world`); ArgumentError when the rank is outside the world."""
    default_rank, default_world = ddp_rank_world()
    rank = default_rank if rank is None else rank
    world_size = default_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ArgumentError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


def per_rank(count: int, world_size: int, drop_last: bool) -> int:
    """Samples each of ``world_size`` ranks gets of ``count``: all of them, the last few wrapped
    round to make equal shares, or with ``drop_last`` the remainder left out."""
    return count // world_size if drop_last else -(-count // world_size)
