"""Object storage against a real S3 server on localhost (moto's standalone server, reached by
s3fs over HTTP as AWS would be): write, read, stream, and bad buckets, shards and credentials."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import packdata
from packdata.errors import ArgumentError, DatasetError, PackdataError
from packdata.loading import ranks

moto_server = pytest.importorskip("moto.server")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")

BUCKET = "packdata-test"
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def s3():
    """The endpoint's storage options, with a bucket made."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    fsspec.filesystem("s3", **options).mkdir(BUCKET)
    yield options
    server.stop()


@pytest.fixture(scope="session")
def remote(s3, png_folder, tmp_path_factory) -> str:
    """The PNG folder converted into tar shards of 20 samples, written to the bucket."""
    url = f"s3://{BUCKET}/cifar"
    packdata.convert(packdata.open_source(png_folder), url, container_options={"shard_size": "20"},
                     workers=1, storage_options=s3)
    return url


@pytest.fixture(scope="session")
def local(png_folder, tmp_path_factory):
    """The same conversion on local disk."""
    return packdata.convert(packdata.open_source(png_folder), tmp_path_factory.mktemp("l") / "ds",
                            container_options={"shard_size": "20"}, workers=1).path


def expected_label(ds, i: int) -> int:
    """Record ``i``'s label as the source's labels.json gives it (keys are file names without
    their suffix)."""
    source = Path(ds.manifest.source["path"])
    labels = json.loads((source / "labels.json").read_text())["labels"]
    return labels[f"{ds.manifest.keys[i]}.png"]


def _open(url, s3, tmp_path, **kw):
    return packdata.open(url, storage_options=s3, cache_dir=tmp_path / "cache", **kw)


def test_written_and_read_equals_local(remote, s3, local, tmp_path):
    fs = fsspec.filesystem("s3", **s3)
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(remote))
    shards = [f"shard-{n:06d}{ext}" for n in range(6) for ext in (".idx", ".tar")]
    assert names == ["index.npz", "manifest.json", *shards, "wids-index.json"]
    ds, local = _open(remote, s3, tmp_path), packdata.open(local)
    assert ds.manifest.keys == local.manifest.keys
    for i in range(len(local)):
        (a, la), (b, lb) = ds[i], local[i]
        assert (a == b).all() and la == lb
    x, _ = ds[[5, 119, 40]]
    assert (x == local[[5, 119, 40]][0]).all()


def test_streaming_from_s3_equals_local(remote, s3, local, tmp_path):
    args = {"shuffle_buffer": 0, "seed": 3, "chunk": 7}
    remote_stream = packdata.StreamingDataset(remote, storage_options=s3,
                                              cache_dir=tmp_path / "c", **args)
    local_stream = packdata.StreamingDataset(local, **args)
    pairs = list(zip(remote_stream, local_stream, strict=True))
    assert len(pairs) == 120
    assert all((a == b).all() and la == lb for (a, la), (b, lb) in pairs)


def test_ddp_ranks_and_workers_see_every_sample_once(remote, s3, packed, tmp_path, monkeypatch):
    local = packdata.open(packed["tar"])
    which = {local[i][0].numpy().tobytes(): i for i in range(len(local))}
    seen: Counter = Counter()
    for rank in range(2):
        monkeypatch.setattr(ranks, "ddp_rank_world", lambda rank=rank: (rank, 2))
        stream = packdata.StreamingDataset(remote, storage_options=s3, shuffle_buffer=16,
                                           cache_dir=tmp_path / "cache")
        stream.set_epoch(1)
        loader = torch.utils.data.DataLoader(stream, batch_size=8, num_workers=2)
        for images, _ in loader:
            seen.update(which[img.numpy().tobytes()] for img in images)
    assert sorted(seen) == list(range(120)) and set(seen.values()) == {1}


def test_cache_is_bounded(remote, s3, tmp_path):
    ds = _open(remote, s3, tmp_path, cache_limit=2 * 62 * 1024)  # about two shards
    for i in range(0, 120, 5):
        ds[i]
    shards = ds.reader.shards
    cached = sorted(p.name for p in shards.root.glob("shard-*.tar"))
    total = sum((shards.root / n).stat().st_size for n in cached)
    assert 1 <= len(cached) <= 2 + shards.storage.prefetch and total <= shards.limit + 3 * 65536
    assert "shard-000005.tar" in cached  # the one read last is kept


def test_deleted_or_corrupted_shard_is_named(remote, s3, local, tmp_path):
    fs = fsspec.filesystem("s3", **s3)
    fs.copy(remote, f"s3://{BUCKET}/damaged", recursive=True)
    url = f"s3://{BUCKET}/damaged"
    fs.rm_file(f"{url}/shard-000002.tar")
    with pytest.raises(DatasetError, match=f"{url}/shard-000002.tar: shard missing"):
        _open(url, s3, tmp_path)[[0, 45]]
    shard = bytearray(fs.cat_file(f"{url}/shard-000004.tar"))
    shard[2000] ^= 0xFF  # inside the first image's pixels: same size, other bytes
    fs.pipe_file(f"{url}/shard-000004.tar", bytes(shard))
    ds = _open(url, s3, tmp_path)
    with pytest.raises(DatasetError, match=f"{url}/shard-000004.tar: shard corrupted"):
        ds[85]
    image, label = ds[10]  # intact shards still read, the same as on local disk
    here = packdata.open(local)
    assert torch.equal(image, here[10][0]) and int(label) == int(here[10][1]) == expected_label(here, 10)


def test_ranged_access_reads_records_without_fetching_shards(remote, s3, local, tmp_path):
    ds, here = _open(remote, s3, tmp_path, access="ranges"), packdata.open(local)
    picks = [119, 5, 40, 41, 77]
    (x, y), (a, b) = ds[picks], here[picks]
    assert (x == a).all() and (y == b).all()
    assert all((ds[i][0] == here[i][0]).all() for i in (0, 63, 118))
    # into arrays too (a DataLoader worker's shared-memory slot): the reader gathers no rows
    fields = ds.manifest.fields
    out = {name: np.empty((len(picks), *f.shape), f.np_dtype) for name, f in fields.items()}
    batch = ds.reader.read_into(np.array(picks), out)
    assert (batch["image"] == here.reader.read(np.array(picks))["image"]).all()
    assert not list((tmp_path / "cache").rglob("*.tar"))  # only the index was fetched
    with pytest.raises(ArgumentError, match="access 'pages'"):
        _open(remote, s3, tmp_path, access="pages")


def test_ranged_access_names_a_missing_or_corrupted_shard(remote, s3, local, tmp_path):
    fs, url = fsspec.filesystem("s3", **s3), f"s3://{BUCKET}/damaged-ranges"
    fs.copy(remote, url, recursive=True)
    fs.rm_file(f"{url}/shard-000002.tar")
    shard = bytearray(fs.cat_file(f"{url}/shard-000004.tar"))
    shard[2000] ^= 0xFF  # inside the first image's pixels: same size, other bytes
    fs.pipe_file(f"{url}/shard-000004.tar", bytes(shard))
    ds = _open(url, s3, tmp_path, access="ranges")
    with pytest.raises(DatasetError, match=f"{url}/shard-000002.tar: shard missing"):
        ds[[0, 45]]
    with pytest.raises(DatasetError, match=f"{url}/shard-000004.tar: shard corrupted"):
        ds[80]
    images, labels = ds[[10, 81]]  # the other records still read, as on local disk
    here = packdata.open(local)
    assert torch.equal(images, here[[10, 81]][0])
    assert labels.tolist() == [expected_label(here, i) for i in (10, 81)]


def test_parts_written_to_the_bucket_as_one_tar_dataset(s3, local, tmp_path):
    url = f"s3://{BUCKET}/in-parts"
    source = packdata.open_source(packdata.open(local).manifest.source["path"])
    packdata.convert(source, url, part_size=40, workers=1, storage_options=s3,
                     container_options={"shard_size": "20"})
    ds, here = _open(url, s3, tmp_path), packdata.open(local)
    assert [s["count"] for s in ds.manifest.extra["shards"]] == [20] * 6
    assert np.array_equal(ds.manifest.checksums, here.manifest.checksums)
    assert (ds[list(range(120))][0] == here[list(range(120))][0]).all()


def test_source_url_is_read_in_place_like_the_local_folder(s3, png_folder, packed, tmp_path):
    fs = fsspec.filesystem("s3", **s3)
    fs.put(str(png_folder) + "/", f"s3://{BUCKET}/raw/", recursive=True)
    source = packdata.open_source(f"s3://{BUCKET}/raw", storage_options=s3,
                                  cache_dir=tmp_path / "cache")
    result = packdata.convert(source, tmp_path / "out", workers=2)  # each worker reads the URLs
    local = packdata.open(packed["tar"]).manifest
    assert result.manifest.keys == local.keys and np.array_equal(result.manifest.checksums, local.checksums)
    assert result.manifest.source["path"] == f"s3://{BUCKET}/raw"
    assert not (tmp_path / "cache").exists()  # nothing was copied to this machine first


@pytest.mark.parametrize(("kind", "folder", "options"), [
    ("pointcloud", FIXTURES / "lidar-pieces", {"points": 64, "normalize": "center"}),
    ("text", FIXTURES / "text" / "peps", {"per_line": True}),
])
def test_point_clouds_and_text_lines_read_in_place(s3, kind, folder, options, tmp_path):
    url = f"s3://{BUCKET}/raw-{kind}"
    fsspec.filesystem("s3", **s3).put(str(folder) + "/", url + "/", recursive=True)
    here = packdata.convert(packdata.open_source(folder, kind, **options), tmp_path / "a",
                            workers=1).manifest
    there = packdata.convert(packdata.open_source(url, kind, storage_options=s3, **options),
                             tmp_path / "b", workers=1).manifest
    assert there.keys == here.keys and np.array_equal(there.checksums, here.checksums) and len(here.keys) > 3


def test_ranged_reads_of_variants_serve_and_check_entries_as_local_reads(s3, tmp_path):
    """Presampled clouds read by ranges: a select serves the local reader's entries, and an
    entry outside the variants (-1 too, which numpy would take as the last) is refused."""
    url = f"s3://{BUCKET}/variants"
    source = packdata.open_source(FIXTURES / "lidar-pieces", "pointcloud", points=64, variants=3)
    local = packdata.convert(source, tmp_path / "here", container="tar", workers=1).path
    packdata.convert(source, url, workers=1, storage_options=s3)
    here = packdata.open(local, verify="off").reader
    there = _open(url, s3, tmp_path, access="ranges", verify="off").reader
    idx = np.arange(here.manifest.count)[::-1]
    entries = idx % 3
    assert np.array_equal(there.read(idx, {"points": entries})["points"],
                          here.read(idx, {"points": entries})["points"])
    for bad in (-1, 3):
        for reader in (here, there):
            with pytest.raises(IndexError, match="select\\['points'\\] must hold one entry of 3"):
                reader.read(idx[:2], {"points": [0, bad]})


def _watched(source, at_block, look):
    """``source`` loading blocks of 10 items, calling ``look()`` before loading block
    ``at_block`` (by then the records of the blocks before it have been written)."""
    load = source.load_block
    seen = []

    def load_block(items):
        if len(seen) == at_block:
            look()
        seen.append(items)
        return load(items)

    source.blocks = lambda items: [items[i : i + 10] for i in range(0, len(items), 10)]
    source.load_block = load_block
    return source


def _names(fs, url):
    fs.invalidate_cache()  # another client (packdata's) wrote there meanwhile
    return sorted(p.rsplit("/", 1)[1] for p in fs.find(url))


def test_shards_are_uploaded_while_converting_the_manifest_last(s3, png_folder, local, tmp_path):
    url, fs = f"s3://{BUCKET}/streamed", fsspec.filesystem("s3", **s3)
    during = []

    def look():  # shards 0-3 (records 0-79) are closed: they reach the bucket, no manifest does
        deadline = time.monotonic() + 10
        while "shard-000003.tar" not in _names(fs, url) and time.monotonic() < deadline:
            time.sleep(0.05)
        during.extend(_names(fs, url))

    source = _watched(packdata.open_source(png_folder), 10, look)
    packdata.convert(source, url, container_options={"shard_size": "20"}, workers=1,
                     storage_options=s3)
    assert {f"shard-00000{n}.tar" for n in range(4)} <= set(during)
    assert "manifest.json" not in during and "index.npz" not in during
    assert {f"shard-00000{n}.idx" for n in range(6)} <= set(_names(fs, url))
    ds = _open(url, s3, tmp_path)
    assert np.array_equal(ds.manifest.checksums, packdata.open(local).manifest.checksums)


def test_failed_conversion_leaves_nothing_in_the_bucket(s3, png_folder, tmp_path):
    url, fs = f"s3://{BUCKET}/failed", fsspec.filesystem("s3", **s3)

    def fail():
        deadline = time.monotonic() + 10
        while "shard-000003.tar" not in _names(fs, url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "shard-000003.tar" in _names(fs, url)  # sent before the failure
        raise PackdataError("the disk is full")

    source = _watched(packdata.open_source(png_folder), 10, fail)
    with pytest.raises(PackdataError, match="the disk is full"):
        packdata.convert(source, url, container_options={"shard_size": "20"}, workers=1,
                         storage_options=s3)
    assert _names(fs, url) == []  # no manifest, and the shards sent were removed
    with pytest.raises(DatasetError, match="no manifest.json"):
        _open(url, s3, tmp_path)


def test_unreachable_endpoint_is_a_clear_error_within_seconds(tmp_path):
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    start = time.perf_counter()
    with pytest.raises(PackdataError, match="cannot reach s3://nowhere/ds"):
        packdata.open("s3://nowhere/ds", storage_options=options, cache_dir=tmp_path)
    assert time.perf_counter() - start < 15


def test_missing_bucket_and_missing_dataset(s3, tmp_path):
    with pytest.raises(DatasetError, match="s3://no-such-bucket/ds: no such bucket"):
        packdata.open("s3://no-such-bucket/ds", storage_options=s3, cache_dir=tmp_path)
    with pytest.raises(DatasetError, match="no manifest.json"):
        packdata.open(f"s3://{BUCKET}/nothing-here", storage_options=s3, cache_dir=tmp_path)


def test_missing_credentials_say_where_packdata_looked(s3, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {"client_kwargs": s3["client_kwargs"]}
    with pytest.raises(PackdataError, match="no credentials found; looked in storage_options"):
        packdata.open(f"s3://{BUCKET}/cifar", storage_options=options, cache_dir=tmp_path)


def test_lmdb_to_a_bucket_is_refused_before_converting(s3, png_folder):
    with pytest.raises(PackdataError, match="object storage takes tar shards \\(asked: lmdb\\)"):
        packdata.convert(packdata.open_source(png_folder), f"s3://{BUCKET}/x.lmdb",
                         storage_options=s3)


def test_cli_converts_to_a_bucket_with_credentials_from_the_environment(s3, png_folder, local,
                                                                         tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from packdata.cli import app

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["client_kwargs"]["endpoint_url"])
    url = f"s3://{BUCKET}/from-cli"
    result = CliRunner().invoke(app, ["convert", str(png_folder), url, "--shard-size", "20",
                                      "--workers", "1"])
    assert result.exit_code == 0, result.output
    ds = packdata.open(url, cache_dir=tmp_path)  # found through the environment alone
    assert np.array_equal(ds.manifest.checksums, packdata.open(local).manifest.checksums)


def test_mixed_size_images_at_a_url_convert_as_the_local_folder(s3, tmp_path):
    """Image headers are read at the URL (concurrently) to choose the layout before converting."""
    from PIL import Image

    folder = tmp_path / "mixed"
    folder.mkdir()
    with Image.open(FIXTURES / "images" / "coffee.jpg") as im:
        for k in range(5):
            im.crop((0, 0, 40 + 7 * k, 30 + 3 * k)).save(folder / f"{k}.png")
    url = f"s3://{BUCKET}/raw-mixed"
    fsspec.filesystem("s3", **s3).put(str(folder) + "/", url + "/", recursive=True)
    here = packdata.convert(packdata.open_source(folder), tmp_path / "a.h5", workers=1).manifest
    there = packdata.convert(packdata.open_source(url, storage_options=s3), tmp_path / "b.h5",
                             workers=1).manifest
    assert there.source["mixed_sizes"] and there.fields["image"].shape == (None, 3)
    assert there.keys == here.keys and np.array_equal(there.checksums, here.checksums)


def test_the_default_shard_cache_is_in_the_platform_cache_folder_and_cannot_shadow_packdata(
        tmp_path, monkeypatch):
    from packdata.remote.storage import Storage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    local = Storage().local_dir(f"s3://{BUCKET}/cifar")
    assert local.parent == tmp_path / "xdg" / "packdata-cache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    local = Storage().local_dir(f"s3://{BUCKET}/cifar")
    assert local.parent == tmp_path / ".cache" / "packdata-cache"
    assert "packdata" not in [p.name for p in local.parents]  # never an importable `packdata`


@pytest.fixture
def cli_env(s3, monkeypatch):
    """The command line reaches the bucket through the environment, as a user's would."""
    from typer.testing import CliRunner

    from packdata.cli import app

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["client_kwargs"]["endpoint_url"])
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_cli_dataset_commands_take_a_url(remote, cli_env, tmp_path):
    """Every command that takes a dataset takes what packdata.open takes (a Path argument
    would have made s3://b/ds "s3:/b/ds")."""
    shown = cli_env("inspect", remote, "--json")
    assert shown.exit_code == 0, shown.output
    info = json.loads(shown.stdout)
    assert info["path"] == remote and info["count"] == 120 and info["container"] == "tar"
    assert info["bytes_on_disk"] > 120 * 32 * 32 * 3
    checked = cli_env("verify", remote)
    assert checked.exit_code == 0, checked.output
    assert "120 of 120 records checked" in checked.stdout and "OK" in checked.stdout
    benched = cli_env("bench", remote, "--model", "small-cnn", "--device", "cpu", "--batch-size",
                      "20", "--steps", "1", "--warmup", "0", "--max-seconds", "1",
                      "--json", tmp_path / "b.json")
    assert benched.exit_code == 0, benched.output
    assert json.loads((tmp_path / "b.json").read_text())["dataset"]["path"] == remote
    resumed = cli_env("check-resume", remote, "--trials", "1", "--no-processes",
                      "--batch-size", "16")
    assert resumed.exit_code == 0, resumed.output
    assert "scenarios passed" in resumed.stdout


def test_cli_index_writes_the_reader_indexes_at_a_url(remote, s3, cli_env):
    fs = fsspec.filesystem("s3", **s3)
    url = f"s3://{BUCKET}/old-cifar"
    fs.copy(remote, url, recursive=True)
    made = sorted(p.rsplit("/", 1)[1] for p in fs.ls(url) if p.endswith((".idx", ".json")))
    wanted = {name: fs.cat_file(f"{url}/{name}") for name in made if name != "manifest.json"}
    for name in wanted:  # as an older packdata left it: no reader indexes
        fs.rm_file(f"{url}/{name}")
    fs.invalidate_cache()
    result = cli_env("index", url)
    assert result.exit_code == 0, result.output
    assert f"wrote {len(wanted)} index files in {url}" in result.stdout
    fs.invalidate_cache()
    assert {name: fs.cat_file(f"{url}/{name}") for name in wanted} == wanted


def test_a_missing_bucket_is_refused_before_converting(s3, png_folder, monkeypatch, cli_env):
    from packdata.sources import images

    def never(*args):
        raise AssertionError("an input was loaded")

    monkeypatch.setattr(images.ImageSource, "load", never)
    monkeypatch.setattr(images.ImageSource, "load_block", never)
    with pytest.raises(DatasetError, match="s3://no-such-bucket/ds: no such bucket "
                                           "'no-such-bucket'; create it first"):
        packdata.convert(packdata.open_source(png_folder), "s3://no-such-bucket/ds",
                         storage_options=s3, workers=1)
    result = cli_env("convert", png_folder, "s3://no-such-bucket/ds", "--workers", "1")
    assert result.exit_code == 2
    assert result.output.strip() == "error: s3://no-such-bucket/ds: no such bucket " \
        "'no-such-bucket'; create it first, or check the name"
    unreachable = {"key": "k", "secret": "s",
                   "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    with pytest.raises(PackdataError, match="cannot reach s3://nowhere/ds"):
        packdata.convert(packdata.open_source(png_folder), "s3://nowhere/ds",
                         storage_options=unreachable, workers=1)


def test_a_url_destination_is_settled_as_a_local_one():
    from packdata.conversion.job import destination

    here, there = destination("out/cifar-%04d.tar", None, {}), \
        destination("s3://bucket/out/cifar-%04d.tar", None, {})
    assert (here.container, here.options) == (there.container, there.options) == \
        ("tar", {"pattern": "cifar-%04d.tar"})
    assert (here.url, there.url) == (None, "s3://bucket/out")
    assert destination("s3://bucket/ds", None, {"shard_size": "20"}).url == "s3://bucket/ds"


def test_resume_into_a_bucket_is_refused_before_anything_is_listed(s3, png_folder, monkeypatch):
    from packdata.sources import images

    def never(*args):
        raise AssertionError("inputs were listed")

    monkeypatch.setattr(images.ImageSource, "items", never)
    with pytest.raises(PackdataError, match="--resume needs a local destination"):
        packdata.convert(packdata.open_source(png_folder), f"s3://{BUCKET}/resumed",
                         resume=True, storage_options=s3)
    assert _names(fsspec.filesystem("s3", **s3), f"s3://{BUCKET}/resumed") == []
