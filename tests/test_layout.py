"""The house: packdata's modules import only downwards (no circles), and none grows too long.

Floors, lowest first; a module may import its own floor and those below. The README's Layout
describes the same tree."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "packdata"
FLOORS = [
    # what every layer needs: errors, names of things, the checksum, the atomic commit, what is
    # kept per file in the process
    ["errors", "urls", "units", "interrupts", "options", "checksum", "atomic", "spooling",
     "kept", "recordmeta", "manifest"],
    # on-disk formats, and work on samples that needs nothing else: conversion-time preparation,
    # the batched image decode stages
    ["containers", "prep", "imagedecode", "jpegregion"],
    # inputs (local or at a URL) and datasets read from object storage
    ["remote", "sources"],
    # the read side: datasets, batches, sampling, workers, the device
    ["rows", "transfer", "sampling", "collate", "dataset", "streaming", "streamloader",
     "batch_order", "loading",
     "resume", "device", "resident", "augment", "dali"],
    # the write side and the checks on top of both
    ["conversion", "verify", "describe", "resume_check"],
    ["bench", "demo"],
    ["cli", "__main__", "__init__"],
]
MAX_LINES = 400
MAX_CLI_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _floor(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, names in enumerate(FLOORS) if top in names)


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every packdata module each module imports, at module level, inside functions or for type
    hints only (a circle there is still a circle between the modules' concerns)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package import submodule` runs the package's __init__ and the submodule
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "packdata.__init__":
                    targets.add(target)
        edges[name] = targets
    return edges


def test_every_module_has_a_floor():
    for name in _modules():
        _floor(name)  # StopIteration names a module no floor lists


def test_imports_go_down_only():
    modules = _modules()
    upward = [f"{a} -> {b}" for a, targets in _imports(modules).items() for b in targets
              if _floor(b) > _floor(a)]
    assert upward == []


def test_no_import_circles():
    edges = _imports(_modules())
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(
                    [*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_no_module_is_too_long():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > (
                MAX_CLI_LINES if name.startswith("packdata.cli") else MAX_LINES)}
    assert long == {}
