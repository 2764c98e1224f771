"""What :func:`packdata.convert` takes besides its source and the writer's options:
:data:`OPTIONS`, one ``packdata convert`` flag each (generated, as the sample kinds' and the
writers' are), each named as the keyword it sets; tests/test_cli.py holds them to the
function's signature."""

from __future__ import annotations

from packdata import containers
from packdata.conversion.engines import ENGINES
from packdata.conversion.job import ON_ERROR
from packdata.options import Option

OPTIONS = (
    Option("container", str, None, "Container, when DST's suffix does not say.",
           tuple(containers.CONTAINERS), flags=("--format", "-f")),
    Option("workers", int, None, "Parallel decode processes (default: the cores this process "
           "may use)."),
    Option("on_error", str, "fail", "'fail' stops at the first bad input, naming it; 'skip' "
           "skips, counts and records bad inputs in the manifest.", ON_ERROR),
    Option("overwrite", bool, False, "Replace DST if it is an existing packdata dataset."),
    Option("engine", str, None, "Convert in parts, as independent tasks, into a sharded "
           "dataset (a folder: with HDF5 or LMDB parts, name DST as a folder and give "
           "--format): 'local' runs them in --workers processes, 'dask' on a Dask cluster (a "
           "LocalCluster of --workers processes, or --scheduler's).", ENGINES),
    Option("scheduler", str, None, "Dask: the scheduler of an existing cluster, "
           "tcp://HOST:PORT (implies --engine dask)."),
    Option("part_size", int, None, "Records per part (task) of a conversion in parts (default: "
           "about 2 parts per --workers, at most 100000)."),
    Option("resume", bool, False, "Continue an interrupted sharded conversion into DST: keep "
           "its finished parts, redo the rest (refused if any option differs)."),
)
