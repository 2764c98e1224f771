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
    ["_version", "errors", "urls", "units", "interrupts", "options", "checksum", "atomic",
     "spooling", "kept", "recordmeta", "manifest"],
    # on-disk formats, object storage (tar shards read from a URL are a shard source of the
    # tar reader, chosen by the container table), and work on samples that needs nothing else:
    # conversion-time preparation, the batched image decode stages
    ["containers", "remote", "prep", "imagedecode", "jpegregion"],
    # inputs (local or at a URL)
    ["sources"],
    # the read side: datasets, batches, sampling, workers, the device
    ["loading", "augment", "dali"],
    # the write side and the checks on top of both
    ["conversion", "verification", "describe", "resume_check"],
    ["bench", "demo"],
    # the command line: library calls and rendering
    ["cli", "__main__"],
    # the package face (packdata/__init__.py): it hands the public names on and nothing below
    # imports it (`import packdata`, or `from packdata import NAME` of a name that is no module)
    ["__init__"],
]
FACE = "packdata.__init__"
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
    top = module.split(".")[1]
    return next(i for i, names in enumerate(FLOORS) if top in names)


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The packdata module (a file, or a package's ``__init__``) that ``name`` names, or that
    holds it; None for what no Python file of the package defines (an extension module)."""
    if name == "packdata":
        return FACE
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name if name and name != "packdata" else None


def _is_extension(name: str) -> bool:
    """A C extension module of the package (built from packdata/NAME.c)."""
    return (PACKAGE / f"{name}.c").is_file()


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every packdata module each module imports, at module level, inside functions or for type
    hints only (a circle there is still a circle between the modules' concerns). ``import
    packdata`` and ``from packdata import NAME`` of a name that is no module are imports of the
    face; ``from packdata import containers`` imports the module ``packdata.containers``."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [_module_of(a.name, modules) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module == "packdata":
                    found = [_module_of(f"packdata.{a.name}", modules)
                             if f"packdata.{a.name}" in modules or _is_extension(a.name)
                             else FACE for a in node.names]
                else:
                    # `from package import submodule` runs the package's __init__ and the submodule
                    found = [_module_of(node.module, modules)] + [
                        _module_of(f"{node.module}.{a.name}", modules) for a in node.names]
            else:
                continue
            targets.update(t for t in found if t is not None and t != name)
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


def test_the_face_is_imported_by_nobody_inside():
    """Catches what the floors would: `import packdata` below the top is an arrow back up."""
    modules = _modules()
    assert FACE in modules
    importers = sorted(a for a, targets in _imports(modules).items() if FACE in targets)
    assert importers == []


def test_the_checker_sees_an_import_of_the_face(tmp_path):
    """The import reading itself: each way of naming the face is an arrow to it; a submodule or
    an extension module named through the package is not."""
    modules = {**_modules()}
    probe = tmp_path / "probe.py"
    probe.write_text("import packdata\nfrom packdata import open_source\n"
                     "from packdata import containers\nimport packdata._rowhash\n"
                     "from packdata import _jpeg\n")
    modules["packdata.probe"] = probe
    assert _imports(modules)["packdata.probe"] == {FACE, "packdata.containers"}


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
