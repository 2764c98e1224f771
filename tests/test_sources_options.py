"""Conversion options: one table per sample kind, checked in one place."""

from __future__ import annotations

import numpy as np
import pytest

import packdata
from packdata import sources
from packdata.errors import OptionError
from packdata.options import Option, resolve

TABLE = (Option("points", int, 4096, "N."), Option("sampling", str, "fps", "How.", ("fps", "random")),
         Option("voxel", float, None, "Edge."), Option("split", bool, False, "Cut."))


def test_resolve_fills_defaults_and_checks_values():
    assert resolve("k", TABLE, {"points": np.int64(8), "voxel": 1}) == {
        "points": 8, "sampling": "fps", "voxel": 1, "split": False}
    for given, message in (({"points": "8"}, "--points '8': expected int"),
                           ({"points": True}, "--points True: expected int"),
                           ({"split": 1}, "--split 1: expected bool"),
                           ({"sampling": "best"}, "--sampling 'best': expected one of fps, random"),
                           ({"resize": 32}, "option --resize does not apply to k sources")):
        with pytest.raises(OptionError, match=message):
            resolve("k", TABLE, given)
    with pytest.raises(ValueError):  # OptionError is also the builtin
        resolve("k", TABLE, {"points": 1.5})


def test_every_kind_declares_its_options_once(png_folder):
    for kind in sources.KINDS:
        names = [o.name for o in sources.get(kind).OPTIONS]
        assert len(names) == len(set(names)), kind
    with pytest.raises(OptionError, match="option --tokenizer does not apply to image sources"):
        packdata.open_source(png_folder, tokenizer="bytes")
    assert packdata.open_source(png_folder, mode="L").mode == "L"
