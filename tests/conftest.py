"""Shared fixtures: real CIFAR-10 PNGs (the sample shipped in packdata/demo_data) and their
conversions into every container."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import packdata

SAMPLE = Path(packdata.__file__).parent / "demo_data" / "cifar10"
CONTAINERS = {"lmdb": "data.lmdb", "hdf5": "data.h5", "tar": "data-tar"}


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it has waited for (subprocesses, pool
    workers): what a test costs whatever else the machine runs."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    item.stash[_CPU_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Each test's CPU seconds (setup to teardown) as a property of its junit report, which
    tools/test_durations.py reads: on a shared machine the wall time stretches with the load."""
    yield
    if _CPU_START in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_CPU_START], 3)))


_CPU_START = pytest.StashKey[float]()


def pillow_pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def copy_sample(dst: Path, count: int = 120) -> Path:
    """A flat folder of ``count`` real PNGs (12 per class) plus labels.json."""
    meta = json.loads((SAMPLE / "labels.json").read_text())
    per_class = count // len(meta["classes"])
    names = [n for n in sorted(meta["labels"]) if int(n.rsplit("_", 1)[1][:4]) < per_class]
    dst.mkdir(parents=True)
    for n in names:
        shutil.copy(SAMPLE / n, dst / n)
    labels = {n: meta["labels"][n] for n in names}
    (dst / "labels.json").write_text(json.dumps({"classes": meta["classes"], "labels": labels}))
    return dst


def fifo_folder(folder: Path, png_folder: Path, count: int = 4) -> Path:
    """``count`` real PNGs (links) and, sorted last, a named pipe with an image's name: opening
    it blocks until someone opens it for writing, so converting this folder cannot end before
    it is stopped. Past 256 images (one worker task) the first records are written meanwhile."""
    folder.mkdir()
    pngs = sorted(png_folder.glob("*.png"))
    for i in range(count):
        (folder / f"img_{i:04d}.png").symlink_to(pngs[i % len(pngs)])
    os.mkfifo(folder / "zz_blocks.png")
    return folder


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` (bench/, examples/) imported as module ``name``, registered in
    sys.modules so that what it defines pickles into child processes."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/``name``.py imported, after the bench modules it imports by name (bench/ is on a
    script's import path, not the tests')."""
    for needed in ("_shared", "bench_containers"):
        if needed != name and needed not in sys.modules:
            load_script(BENCH / f"{needed}.py", needed)
    return load_script(BENCH / f"{name}.py", name)


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test: on 2 shared cores torch's second mostly spins."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def needs_native_rows() -> None:
    """Skip where packdata._rowhash was not built (a user's install without a C compiler).
    CI builds it, and tools/check_skips.py fails the run on this skip there."""
    from packdata import checksum

    if not checksum.NATIVE_ROWS:
        pytest.skip("packdata._rowhash was not built (an install without a C compiler)")


class FakeClock:
    """``time.perf_counter`` that moves only when a test says time was spent: known costs, so
    that timings are exact hand counts on any machine, however busy."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


#: the modules that time the bench's measurements
TIMED = ("packdata.bench.runner", "packdata.bench.timer", "packdata.bench.sweep",
         "packdata.bench.suite")


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    """The fake clock as the bench's timing modules' ``time.perf_counter`` (nothing else's:
    conversions, pools and pytest keep the real one)."""
    clock = FakeClock()
    fake_time = SimpleNamespace(**{**vars(time), "perf_counter": clock})
    for name in TIMED:
        monkeypatch.setattr(importlib.import_module(name), "time", fake_time)
    return clock


class ClockedTrainer:
    """A bench trainer's real step that also spends ``seconds`` on a fake clock (set between
    runs to give each its own known cost)."""

    def __init__(self, trainer, clock: FakeClock, seconds: float) -> None:
        self.trainer, self.clock, self.seconds = trainer, clock, seconds
        self.device = trainer.device

    def __call__(self, batch) -> None:
        self.trainer(batch)
        self.clock.now += self.seconds

    def state(self) -> dict:
        return self.trainer.state()

    def restore(self, state: dict) -> None:
        self.trainer.restore(state)


@pytest.fixture(scope="session")
def png_folder(tmp_path_factory) -> Path:
    return copy_sample(tmp_path_factory.mktemp("cifar") / "png")


IMAGE_FIXTURES = Path(__file__).parent / "fixtures" / "images"


@pytest.fixture(scope="session")
def photo_folder(tmp_path_factory) -> Path:
    """Two class folders of 7 crops each of real photographs (tests/fixtures/images), 50–450
    pixels a side, alternating JPEG and PNG: a folder of photos of mixed sizes."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for name in ("chelsea", "coffee"):
        photo = Image.open(IMAGE_FIXTURES / f"{name}.jpg").convert("RGB")
        (root / name).mkdir()
        for k in range(7):
            w, h = int(rng.integers(50, photo.width)), int(rng.integers(50, photo.height))
            x, y = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
            photo.crop((x, y, x + w, y + h)).save(root / name / f"{k}.{('jpg', 'png')[k % 2]}",
                                                  quality=90)
    return root


@pytest.fixture(scope="session")
def packed(tmp_path_factory, png_folder) -> dict[str, Path]:
    """The PNG folder converted into every container (raw pixels)."""
    out = tmp_path_factory.mktemp("packed")
    source = packdata.open_source(png_folder)
    return {
        name: packdata.convert(source, out / target, workers=2, container_options=(
            {"shard_size": "50"} if name == "tar" else None)).path
        for name, target in CONTAINERS.items()
    }


@pytest.fixture(params=list(CONTAINERS))
def container(request) -> str:
    return request.param


# -- text: real PEPs and the GPT-2 tokenizer, from tests/fixtures/text (see SOURCE.md there) ----

TEXT_FIXTURES = Path(__file__).parent / "fixtures" / "text"


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed (character → byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@pytest.fixture(scope="session")
def peps_dir() -> Path:
    return TEXT_FIXTURES / "peps"


@pytest.fixture(scope="session")
def gpt2_json(tmp_path_factory) -> Path:
    import gzip

    path = tmp_path_factory.mktemp("gpt2") / "tokenizer.json"
    path.write_bytes(gzip.decompress((TEXT_FIXTURES / "gpt2" / "tokenizer.json.gz").read_bytes()))
    return path


@pytest.fixture(scope="session")
def gpt2_tiktoken(gpt2_json) -> Path:
    """The GPT-2 ranks as a tiktoken BPE file, built offline from tokenizer.json's vocabulary."""
    import base64

    saved = json.loads(gpt2_json.read_text())
    specials = {t["content"] for t in saved["added_tokens"]}  # not BPE ranks (as tiktoken's gpt2)
    decoder = gpt2_byte_decoder()
    lines = [base64.b64encode(bytes(decoder[c] for c in token)).decode() + f" {rank}"
             for token, rank in sorted(saved["model"]["vocab"].items(), key=lambda kv: kv[1])
             if token not in specials]
    path = gpt2_json.with_name("gpt2.tiktoken")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def packed_text(tmp_path_factory, peps_dir, gpt2_json) -> dict[str, Path]:
    """The PEP slice tokenised with GPT-2 into every container."""
    out = tmp_path_factory.mktemp("packed-text")
    source = packdata.open_source(peps_dir, tokenizer=gpt2_json)
    return {name: packdata.convert(source, out / target, workers=1, container_options=(
        {"shard_size": "8"} if name == "tar" else None)).path
        for name, target in CONTAINERS.items()}
