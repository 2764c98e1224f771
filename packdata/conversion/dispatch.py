"""``packdata.convert``: the destination settled once (local, or object storage, staged around
the one write), then the job written here or in parts."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from packdata.conversion.costs import Costs
from packdata.conversion.job import ConvertResult, destination, settle
from packdata.conversion.local import Progress
from packdata.conversion.local import write as write_here
from packdata.conversion.parts import Parts
from packdata.conversion.parts import write as write_parts
from packdata.conversion.upload import staged
from packdata.errors import InputWarning
from packdata.remote.storage import Storage
from packdata.sources.base import Source, shown
from packdata.units import count_argument, plural


def convert(
    source: Source,
    dst: str | Path,
    *,
    container: str | None = None,
    container_options: dict[str, Any] | None = None,
    workers: int | None = None,
    on_error: str = "fail",
    overwrite: bool = False,
    progress: Progress | None = None,
    engine: str | None = None,
    client: Any = None,
    scheduler: str | None = None,
    part_size: int | None = None,
    resume: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> ConvertResult:
    """Convert ``source`` into a packed dataset at ``dst``.

    The container is ``container`` ("lmdb", "hdf5", "tar") or chosen by ``dst``'s suffix. A URL
    ``dst`` (``s3://bucket/ds``) receives tar shards, uploaded with the manifest last, reached
    with ``storage_options`` for fsspec.
    ``on_error="skip"`` skips inputs that fail to load and records them in the manifest;
    ``"fail"`` stops at the first, naming the file. ``workers`` defaults to the cores this
    process may use. What converting inputs changed in their values (16-bit values clipped,
    alpha dropped, EXIF orientation not applied: :mod:`packdata.sources.pixels`) is one
    InputWarning per change, naming the first files, and recorded in the manifest's
    ``source.changed``.

    Given ``engine`` ("local" or "dask"), a Dask ``client`` or ``scheduler`` address,
    ``part_size`` or ``resume``, the output is a sharded dataset converted part by part as
    independent tasks (see :mod:`packdata.conversion.parts`; ``resume`` keeps the parts an
    interrupted run finished).
    """
    if workers is not None:
        count_argument("workers", workers)  # 0: as many as the cores this process may use
    target = destination(dst, container, container_options)
    in_parts = Parts.asked(engine, client, scheduler, part_size, resume)
    if in_parts is not None:
        in_parts.check_destination(target, dst)  # before any input is listed
    costs = Costs()
    with staged(target, Storage(storage_options or {}), overwrite) as (here, on_shard_closed):
        job = settle(source, here, on_error, overwrite, costs, workers)
        if in_parts is not None:
            result = write_parts(job, in_parts, workers=workers, progress=progress)
            result.costs.parent.update(costs.parent)
        else:
            result = write_here(job, workers=workers, progress=progress,
                                on_shard_closed=on_shard_closed, costs=costs)
    if target.url is not None:
        result.path = target.url  # type: ignore[assignment]
    for why, said in result.manifest.source.get("changed", {}).items():
        warnings.warn(f"{result.manifest.source.get('path', source.root)}: "
                      f"{plural(said['count'], 'input')}: {why}: {shown(said['first'], said['count'])}",
                      InputWarning, stacklevel=2)
    return result
