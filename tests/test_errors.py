"""packdata's errors: one module, each error also the builtin a caller would catch."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import packdata
from packdata import errors

PACKAGE = Path(packdata.__file__).parent
#: raises of a bare builtin that never reach the user as such (caught and named by the caller)
INTERNAL = {("sources/pointfiles.py", "_named")}


def test_every_error_class_lives_in_errors_py():
    defined = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", "").endswith(("Error", "Exception")) for b in node.bases):
                defined.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert defined and all(d.startswith("errors.py:") for d in defined), defined


def test_user_facing_raises_are_packdata_errors():
    """No bare ValueError/TypeError: packdata's own, which also are those builtins."""
    bare = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                        and getattr(node.exc.func, "id", None) in ("ValueError", "TypeError")
                        and (rel, func.name) not in INTERNAL):
                    bare.append(f"{rel}:{node.lineno}")
    assert not bare, bare


@pytest.mark.parametrize("cls", [c for _, c in inspect.getmembers(errors, inspect.isclass)
                                 if issubclass(c, errors.PackdataError)])
def test_each_error_is_also_a_builtin(cls):
    assert any(b.__module__ == "builtins" and b is not Exception for b in cls.__mro__[1:]) \
        or cls is errors.PackdataError


def test_old_homes_still_export_the_moved_classes():
    from packdata.augment import AugmentInputError
    from packdata.loading.device import DeviceError
    from packdata.loading.resident import ResidentMemoryError

    assert (AugmentInputError, DeviceError, ResidentMemoryError) == (
        errors.AugmentInputError, errors.DeviceError, errors.ResidentMemoryError)
    with pytest.raises(ValueError, match="batch_size must be an integer ≥ 1"):  # except ValueError works
        packdata.EpochBatchSampler(10, batch_size=0)


#: the optional dependencies (top-level names) that only the features needing them import
#: (simplejpeg is not one: a small JPEG fast path imagedecode takes where present, Pillow else)
OPTIONAL = ("nvidia", "kornia", "laspy", "lazrs", "dask", "distributed", "fsspec", "s3fs",
            "tokenizers", "tiktoken", "matplotlib", "wids")


def test_importing_every_module_loads_no_optional_dependency():
    """``import packdata`` and the command line stay light: each optional dependency loads
    where a feature needs it (errors.require), so a missing one fails only that feature."""
    script = (
        "import importlib, pkgutil, sys, packdata\n"
        "names = [m.name for m in pkgutil.walk_packages(packdata.__path__, 'packdata.')\n"
        "         if m.name != 'packdata.__main__']\n"
        "for name in names: importlib.import_module(name)\n"
        f"print(len(names), sorted({{m.split('.')[0] for m in sys.modules}} & set({OPTIONAL!r})))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    count, loaded = done.stdout.split(" ", 1)
    assert int(count) > 50 and loaded.strip() == "[]", done.stdout


def _requires() -> list[tuple[str, str, str]]:
    """(file:line, module, extra) of every ``require(module, extra, ...)`` call in packdata."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                module, extra = (a.value if isinstance(a, ast.Constant) else None
                                 for a in node.args[:2])
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", module, extra))
    return found


def test_every_optional_import_names_an_extra_that_exists():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    found = _requires()
    assert len(found) > 10
    wrong = [f for f in found if f[2] not in extras or not f[1]]
    assert not wrong, wrong


@pytest.mark.parametrize(("blocked", "extra", "call"), [
    (("fsspec",), "cloud", lambda fx: packdata.open("s3://bucket/ds")),
    (("s3fs",), "cloud", lambda fx: packdata.open("s3://bucket/ds")),
    (("tokenizers",), "text", lambda fx: packdata.open_source(
        fx("peps_dir"), kind="text", tokenizer=str(fx("gpt2_json")))),
    (("tiktoken",), "text", lambda fx: packdata.open_source(
        fx("peps_dir"), kind="text", tokenizer=str(fx("gpt2_tiktoken")))),
    (("dask", "distributed"), "dask", lambda fx: packdata.convert(
        packdata.open_source(fx("png_folder")), fx("tmp_path") / "out", container="hdf5",
        engine="dask", workers=1)),
    (("matplotlib",), "plot", lambda fx: __import__("packdata.bench.report").bench.report.plot(
        {}, fx("tmp_path") / "plot.png")),
], ids=["fsspec", "s3fs", "tokenizers", "tiktoken", "dask", "matplotlib"])
def test_a_missing_optional_dependency_names_the_extra(request, monkeypatch, blocked, extra,
                                                       call):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    with pytest.raises(errors.MissingExtraError, match=rf'pip install "packdata\[{extra}\]"'):
        call(request.getfixturevalue)
