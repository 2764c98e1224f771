"""The house: packdata's modules import only downwards (no circles), and none grows too long.

Floors, lowest first; a module may import its own floor and those below. docs/layout.md describes
the same tree, and names every module of the package's top level (checked below)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "packdata"
LAYOUT_DOC = PACKAGE.parent / "docs" / "layout.md"
FLOORS = [
    # what every layer needs: errors, names of things, the checksum, the atomic commit, what is
    # kept per file in the process
    ["_version", "errors", "urls", "units", "interrupts", "options", "checksum", "atomic",
     "spooling", "kept", "blockchecks", "recordmeta", "manifest"],
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


def test_no_module_is_too_long_and_the_command_line_is_short():
    lines = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}
    cli = {name: n for name, n in lines.items() if name.startswith("packdata.cli")}
    assert len(cli) >= 2 and sum(cli.values()) <= MAX_CLI_LINES, cli  # the whole package


def _private_names_owned(tree: ast.Module) -> set[str]:
    """Private names a module defines for itself: its module-level functions, classes and
    assignments, and its classes' methods and attributes (``self._x = …``, class bodies)."""
    owned: set[str] = set()

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            owned.update(t.id for t in targets if isinstance(t, ast.Name))
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owned.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                owned.add(node.attr)
        owned.update(t.id for n in cls.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                     if isinstance(t, ast.Name))
    return {name for name in owned if private(name)}


def _private_reaches(modules: dict[str, Path]) -> list[str]:
    """Where a module uses a private name that another packdata module owns and it does not:
    ``obj._x`` on anything but ``self``/``cls``, or ``from packdata.m import _x``."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    owned = {name: _private_names_owned(tree) for name, tree in trees.items()}
    everyone = set().union(*owned.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in everyone and \
                    node.attr not in owned[name] and not (
                        isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("packdata"):
                found.extend(f"{name}:{node.lineno} import {a.name} from {node.module}"
                             for a in node.names if a.name in everyone)
    return sorted(found)


def test_no_module_reaches_into_another_modules_private_names():
    assert _private_reaches(_modules()) == []


def test_the_private_name_check_sees_a_reach(tmp_path):
    owner, reacher = tmp_path / "owner.py", tmp_path / "reacher.py"
    owner.write_text("class Reader:\n    def __init__(self):\n        self._maps = {}\n\n"
                     "    def _map(self, shard):\n        return self._maps[shard]\n")
    reacher.write_text("def read(reader):\n    reader._maps.clear()\n    return reader._map(0)\n")
    found = _private_reaches({"packdata.owner": owner, "packdata.reacher": reacher})
    assert found == ["packdata.reacher:2 ._maps", "packdata.reacher:3 ._map"]


def _layout_tree() -> dict[str, set[str]]:
    """The names docs/layout.md's tree lists in its left column, by the folder they lie in
    (``packdata``, ``packdata/loading``, ``.`` for the repository's root): ``name.py`` and
    ``name/``, each at the indent of its folder's entries."""
    text = LAYOUT_DOC.read_text()
    tree = re.search(r"```\n(packdata/\n.*?)```", text, re.S)
    assert tree, "docs/layout.md: no tree starting with packdata/"
    listed: dict[str, set[str]] = {}
    folders: list[str] = []  # the folder open at each indent (two spaces a level)
    for line in tree.group(1).splitlines():
        indent = (len(line) - len(line.lstrip())) // 2
        if not line.strip() or len(line) - len(line.lstrip()) >= 20:  # a description's next line
            continue
        left = line.strip().split("  ")[0]  # the name column, before the description
        folders = folders[:indent]
        where = "/".join(folders) or "."
        for name in re.findall(r"[\w.]+/|[\w.]+\.py", left):
            listed.setdefault(where, set()).add(name)
        if left.endswith("/") and " " not in left:
            folders.append(left.rstrip("/"))
    return listed


def test_docs_layout_lists_every_module_of_the_top_level():
    listed = _layout_tree()["packdata"]
    tops = {name.split(".")[1] for name in _modules() if name != "packdata"}
    named = {n.removesuffix(".py").rstrip("/") for n in listed}
    assert sorted(tops - named) == [], "modules docs/layout.md does not list"


def test_everything_docs_layout_lists_exists():
    root = PACKAGE.parent
    missing = [f"{where}/{name}" for where, names in _layout_tree().items() for name in names
               if not (root / where / name.rstrip("/")).exists()]
    assert missing == [], "docs/layout.md lists what the tree does not hold"
    assert {"packdata", ".", "packdata/loading"} <= set(_layout_tree())
