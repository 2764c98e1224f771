"""packdata's errors: one module, each error also the builtin a caller would catch."""

from __future__ import annotations

import ast
import inspect
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
    from packdata.device import DeviceError
    from packdata.resident import ResidentMemoryError

    assert (AugmentInputError, DeviceError, ResidentMemoryError) == (
        errors.AugmentInputError, errors.DeviceError, errors.ResidentMemoryError)
    with pytest.raises(ValueError, match="batch_size must be ≥ 1"):  # except ValueError works
        packdata.EpochBatchSampler(10, batch_size=0)
