"""What the command line loads: a conversion and the commands that look at a dataset (inspect,
verify, index) never import torch, which takes seconds to load where CUDA is installed. Each
command runs in a fresh process under ``python -X importtime``, whose report covers the worker
processes it forks too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: what none of these commands may load: torch, and the optional heavy dependencies a local
#: conversion of images does not need
HEAVY = {"torch", "torchvision", "tokenizers", "tiktoken", "laspy", "dask", "distributed",
         "fsspec", "s3fs", "pandas", "scipy"}


def imported(*args: object) -> set[str]:
    """The modules ``packdata ARGS`` imported, in its process and its workers."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "packdata",
                           *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


@pytest.fixture(scope="module")
def converted(png_folder, tmp_path_factory) -> dict[str, tuple[Path, set[str]]]:
    """Each container's conversion by the command line: the output, and what the command
    imported."""
    out = tmp_path_factory.mktemp("startup")
    made = {}
    for name, dst in (("h5", out / "cifar.h5"), ("lmdb", out / "cifar.lmdb"),
                      ("tar", out / "shards")):
        made[name] = dst, imported("convert", png_folder, dst, "--workers", "2")
    return made


def test_conversions_import_no_torch(converted):
    for name, (_, modules) in converted.items():
        assert "packdata.conversion.local" in modules  # it converted, in this process
        assert heavy(modules) == set(), name


@pytest.mark.parametrize("command", [["--help"], ["convert", "--help"], ["inspect", "{h5}"],
                                     ["inspect", "{tar}", "--json"], ["verify", "{lmdb}"],
                                     ["index", "{tar}"]])
def test_dataset_commands_import_no_torch(converted, command):
    args = [a.format(**{name: dst for name, (dst, _) in converted.items()}) for a in command]
    assert heavy(imported(*args)) == set()


def test_the_check_can_fail(packed):
    """Reading samples is torch's work: the same report names it there."""
    code = f"import packdata; packdata.open({str(packed['hdf5'])!r})[0]"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert "torch" in heavy({line.rsplit("|", 1)[1].strip()
                             for line in done.stderr.splitlines() if "|" in line})
