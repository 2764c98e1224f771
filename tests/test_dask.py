"""Conversion on a real Dask LocalCluster (2 worker processes): same records as local processes,
a worker killed mid-task is retried, an unreachable scheduler is a clear error."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import pytest

import packdata
from packdata.conversion import engines
from packdata.errors import PackdataError

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as c:
        yield c


class KillOnce:
    """A source whose worker process dies (like a `kill -9`) the first time it loads ``key``."""

    def __init__(self, inner, key: str, marker: Path) -> None:
        self.inner, self.key, self.marker = inner, key, marker

    def __getattr__(self, name):
        if name in ("inner", "key", "marker"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def load_block(self, items):
        if any(item.key == self.key for item in items) and not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return self.inner.load_block(items)


def _records(path: Path) -> tuple[list, list]:
    m = packdata.open(path).manifest
    return list(m.keys), m.checksums.tolist()


def test_dask_matches_one_and_two_processes(tmp_path, png_folder, packed, client):
    source = packdata.open_source(png_folder)
    on_dask = packdata.convert(source, tmp_path / "dask", container="hdf5", client=client,
                               part_size=30)
    assert on_dask.manifest.container == "sharded" and len(on_dask.manifest.extra["parts"]) == 4
    one = packdata.convert(source, tmp_path / "one.h5", workers=1)
    two = packdata.convert(source, tmp_path / "two.h5", workers=2)
    assert _records(on_dask.path) == _records(one.path) == _records(two.path)
    a, b = packdata.open(on_dask.path), packdata.open(one.path)
    assert (a[list(range(120))][0] == b[list(range(120))][0]).all()


def test_killed_worker_task_is_retried(tmp_path, png_folder, packed, client):
    source = packdata.open_source(png_folder)
    marker = tmp_path / "killed-once"
    dying = KillOnce(source, source.items()[50].key, marker)
    result = packdata.convert(dying, tmp_path / "out", client=client, part_size=30)
    assert marker.exists()  # a worker did die mid-task
    assert _records(result.path) == _records(packed["tar"])
    assert len(packdata.open(result.path)) == 120


def test_bad_input_error_comes_back_from_the_cluster(tmp_path, png_folder, client):
    folder = tmp_path / "png"
    folder.mkdir()
    for p in sorted(png_folder.iterdir())[:20]:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / sorted(png_folder.glob("*.png"))[3].name).write_bytes(b"not a png")
    with pytest.raises(PackdataError, match="png"):
        packdata.convert(packdata.open_source(folder), tmp_path / "out", client=client,
                         part_size=5)


def test_default_part_size_follows_the_cluster_not_this_machine(tmp_path, png_folder):
    def size(threads):  # about two parts per task the cluster runs at once
        return math.ceil(120 / (2 * threads))

    threads = next(t for t in (3, 5) if size(t) != size(os.cpu_count() or 1))
    # worker processes: in-process (thread) workers would leave threads behind that break the
    # fork of later conversions in this test process
    with distributed.LocalCluster(n_workers=1, threads_per_worker=threads, processes=True,
                                  dashboard_address=":0") as cluster:
        result = packdata.convert(packdata.open_source(png_folder), tmp_path / "out",
                                  container="hdf5", scheduler=cluster.scheduler_address)
    assert result.manifest.options["part_size"] == size(threads)
    assert len(result.manifest.extra["parts"]) == math.ceil(120 / size(threads))


def test_unreachable_scheduler_is_a_clear_error_within_seconds(tmp_path, png_folder,
                                                               monkeypatch):
    monkeypatch.setattr(engines, "CONNECT_TIMEOUT_S", 1)
    start = time.perf_counter()
    with pytest.raises(PackdataError, match="cannot reach the Dask scheduler at "
                                            "tcp://127.0.0.1:9"):
        packdata.convert(packdata.open_source(png_folder), tmp_path / "out",
                         scheduler="tcp://127.0.0.1:9")
    assert time.perf_counter() - start < 10


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launch", ["module", "script"])
def test_ctrl_c_during_a_dask_conversion_is_one_line(tmp_path, png_folder, launch):
    """A terminal's Ctrl-C reaches the whole process group, the LocalCluster's workers too:
    the command says one line, not a traceback per worker. The console script's workers
    re-import its main module (multiprocessing's spawn); ``python -m`` workers do not."""
    import signal
    import subprocess
    import sys

    from packdata.conversion.parts import work_dir
    from tests.conftest import fifo_folder

    folder = fifo_folder(tmp_path / "in", png_folder)  # the last input blocks its part forever
    script = tmp_path / "packdata-script"
    script.write_text("import sys\nfrom packdata.__main__ import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main())\n")
    command = [sys.executable, "-m", "packdata"] if launch == "module" else \
        [sys.executable, str(script)]
    out = tmp_path / "out"
    proc = subprocess.Popen([*command, "convert", str(folder), str(out), "--engine", "dask",
                             "--workers", "2", "--part-size", "2"],
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=Path(__file__).parents[1])
    deadline = time.monotonic() + 120
    while len(list(work_dir(out).glob("part-*"))) < 2:  # the cluster runs: parts are finished
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    said = [line for line in proc.stderr if line.strip() and "no labels found" not in line]
    assert proc.wait(timeout=60) == 130, said
    assert said == [f"interrupted: nothing was written to {out} (finished parts are kept: "
                    "rerun with --resume to continue)\n"], said


def test_point_clouds_convert_on_the_cluster(tmp_path, client):
    """Point clouds load in a worker process of their own (their LAZ decoder can abort a
    process) except where the process already is one that can start none: a Dask worker."""
    fixtures = Path(__file__).parent / "fixtures" / "lidar"
    folder = tmp_path / "clouds"
    folder.mkdir()
    shutil.copy(fixtures / "simple.laz", folder / "a.laz")
    shutil.copy(fixtures / "simple.las", folder / "b.las")
    source = packdata.open_source(folder, points=64)
    on_dask = packdata.convert(source, tmp_path / "dask", container="hdf5", client=client)
    one = packdata.convert(source, tmp_path / "one.h5", workers=1)
    assert _records(on_dask.path) == _records(one.path)
