"""Extract and run the shell commands and Python snippets of README.md and docs/*.md.

    python tools/doc_snippets.py --list            # every snippet, and why any is skipped
    python tools/doc_snippets.py [FILE.md ...]     # run them (default: README.md, docs/*.md,
                                                   # examples/README.md)

A snippet is a fenced block tagged ``bash``/``sh``/``shell``/``console`` or ``python``. The
blocks of one file run in order in one fresh workspace (a temporary folder), so a later block
uses what an earlier one wrote (``packdata convert … cifar.lmdb`` then ``packdata.open(
"cifar.lmdb")``); Python blocks of one file share one namespace. The workspace starts with
small real inputs under the names the docs use (:data:`WORKSPACE`), built from the repository's
own fixtures. Shell commands run one logical line at a time (``\\`` continues a line, ``#``
starts a comment; in a ``console`` block only lines after a ``$ `` prompt; ``a && b`` runs
``a`` then ``b``): ``packdata …`` in this process through the CLI, anything else with bash.

Markers, HTML comments on the lines just above a block (invisible when rendered):

- ``<!-- skip: REASON -->`` — the block is not run (it needs a GPU, a cluster, the network or
  data that is not in the repository); the reason is reported.
- ``<!-- skip-line PREFIX: REASON -->`` — commands of the block starting with PREFIX are not run
  (e.g. ``pip install`` or a benchmark that measures for minutes); repeat for several prefixes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(.+?)\s*-->\s*$")
SKIP_LINE = re.compile(r"^\s*<!--\s*skip-line\s+(.+?):\s+(.+?)\s*-->\s*$")

#: what a fresh workspace holds, name → what it is (built by :func:`make_workspace`)
WORKSPACE = {
    "cifar-png/": "40 real CIFAR-10 PNGs (4 per class)",
    "labels.json": "their labels, beside the folder (as CIFAR exports keep them): "
                   "{\"classes\": [...], \"labels\": {file name: class index}}",
    "labels.pkl": "the same labels as a pickled dict {file name: class index}",
    "imagenet-style/": "20 of those PNGs in class sub-folders",
    "imagenet/": "train/ and val/ class folders (cat, coffee) of JPEG crops of several sizes "
                 "from two real photographs",
    "photos/": "10 of those PNGs, no labels",
    "scans/": "5 real LAS/LAZ clouds (AHN4 trees, a laspy sample) in class sub-folders",
    "trees/": "the same clouds",
    "peps/": "21 real PEPs (.txt)",
    "lines.txt": "one PEP, for per-line conversion",
    "tokenizer.json": "the GPT-2 tokenizer.json",
    # for examples/README.md
    "cifar10/": "test-png/ (the 40 CIFAR-10 PNGs) and labels.json beside it",
    "pieces/": "labelled LiDAR pieces in class sub-folders (tests/fixtures/lidar-pieces)",
    "gpt2/": "tokenizer.json (GPT-2)",
    "DATA/": "the shared data folder's layout in miniature: cifar10/, lidar/ (trees/ and "
             "laspy-samples/), text/peps/ (one short PEP), tokenizer/gpt2/",
    "examples/": "the repository's examples (linked)",
    "bench/": "copies of the repository's bench scripts (results land in the workspace)",
    "tools/": "the repository's tools (linked)",
}


class SnippetError(AssertionError):
    """A documented command or snippet failed; the message says where and how."""


@dataclass
class Snippet:
    """One fenced block: where it is, its language, its code and any skip markers."""

    file: Path
    line: int  # 1-based line of the opening fence
    lang: str  # "bash" or "python"
    code: str
    prompts: bool = False  # a console block: only lines starting with "$ " are commands
    skip: str | None = None
    skip_lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        try:
            name = self.file.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            name = str(self.file)
        return f"{name}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, docs/*.md and examples/README.md, in that order."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md")),
                        root / "examples" / "README.md"] if p.exists()]


def extract(path: Path) -> list[Snippet]:
    """The shell and Python blocks of one markdown file, with the markers above each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang not in (*SHELL, "python", "py"):
            continue
        skip, skip_lines = None, []
        j = start - 1  # markers: the comment lines just above the fence (blank lines between)
        while j >= 0 and (SKIP.match(lines[j]) or SKIP_LINE.match(lines[j]) or not lines[j].strip()):
            if s := SKIP.match(lines[j]):
                skip = s.group(1)
            elif s := SKIP_LINE.match(lines[j]):
                skip_lines.append((s.group(1), s.group(2)))
            j -= 1
        snippets.append(Snippet(path, start + 1, "python" if lang.startswith("py") else "bash",
                                "\n".join(body) + "\n", lang == "console", skip,
                                skip_lines[::-1]))
    return snippets


def commands(snippet: Snippet) -> list[tuple[str, str | None]]:
    """A shell block's logical command lines, each with the reason it is skipped (or None)."""
    out: list[tuple[str, str | None]] = []
    pending = ""
    for raw in snippet.code.splitlines():
        if snippet.prompts and not pending and not raw.startswith("$ "):
            continue  # output shown in a console block
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        line = line[2:] if line.startswith("$ ") else line
        reason = next((r for prefix, r in snippet.skip_lines if line.startswith(prefix)), None)
        for part in _and_chain(line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError as exc:
                raise SnippetError(f"{snippet.where}: cannot parse {line!r}: {exc}") from None
            if words:
                out.append((shlex.join(words), reason))
    return out


def _and_chain(line: str) -> list[str]:
    """``a && b`` as the commands ``a`` and ``b`` (run in order, stopping at the first failure,
    as bash does); a quoted ``&&`` or one in a comment is not a separator."""
    parts, start, quote, i = [], 0, None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith("&&", i):
            parts.append(line[start:i])
            start = i = i + 2
            continue
        i += 1
    return [*parts, line[start:i]]


def make_workspace(dst: Path, root: Path = ROOT) -> Path:
    """Fill ``dst`` with the small real inputs the docs name (:data:`WORKSPACE`)."""
    cifar = root / "packdata" / "demo_data" / "cifar10"
    fixtures = root / "tests" / "fixtures"
    meta = json.loads((cifar / "labels.json").read_text())
    names = [n for n in sorted(meta["labels"]) if int(n.rsplit("_", 1)[1][:4]) < 4]
    labels = {n: meta["labels"][n] for n in names}
    (dst / "cifar-png").mkdir(parents=True)
    for n in names:
        shutil.copyfile(cifar / n, dst / "cifar-png" / n)
    (dst / "labels.json").write_text(json.dumps({"classes": meta["classes"], "labels": labels}))
    (dst / "labels.pkl").write_bytes(pickle.dumps(labels))
    for n in names[::2]:
        folder = dst / "imagenet-style" / meta["classes"][labels[n]]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cifar / n, folder / n)
    _imagenet_like(fixtures / "images", dst / "imagenet")
    (dst / "photos").mkdir()
    for n in names[::4]:
        shutil.copyfile(cifar / n, dst / "photos" / n)
    for folder in ("scans", "trees"):
        for cloud in sorted((fixtures / "lidar").glob("*.la[sz]")):
            if cloud.name == "simple.laz":  # the same key as simple.las
                continue
            group = "tree" if cloud.name.startswith("ahn") else "sample"
            (dst / folder / group).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cloud, dst / folder / group / cloud.name)
    shutil.copytree(fixtures / "text" / "peps", dst / "peps")
    shutil.copyfile(fixtures / "text" / "peps" / "pep-0294.txt", dst / "lines.txt")
    (dst / "tokenizer.json").write_bytes(
        gzip.decompress((fixtures / "text" / "gpt2" / "tokenizer.json.gz").read_bytes()))
    _examples_inputs(dst, root)
    return dst


def _examples_inputs(dst: Path, root: Path) -> None:
    """What examples/README.md names: its scripts and bench/bench_parity.py, and small real
    inputs under its names. The bench scripts are copied, not linked, so that a script that
    writes next to itself (bench/results/) writes into the workspace."""
    fixtures = root / "tests" / "fixtures"
    shutil.copytree(dst / "cifar-png", dst / "cifar10" / "test-png")
    shutil.copyfile(dst / "labels.json", dst / "cifar10" / "labels.json")  # beside, as in DATA
    shutil.copytree(fixtures / "lidar-pieces", dst / "pieces")
    (dst / "gpt2").mkdir()
    shutil.copyfile(dst / "tokenizer.json", dst / "gpt2" / "tokenizer.json")
    data = dst / "DATA"
    shutil.copytree(dst / "cifar10", data / "cifar10")
    for cloud in sorted((fixtures / "lidar").glob("*.la[sz]")):
        sub = "trees" if cloud.name.startswith("ahn") else "laspy-samples"
        if cloud.name != "simple.laz":  # the same cloud as simple.las
            (data / "lidar" / sub).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cloud, data / "lidar" / sub / cloud.name)
    (data / "text" / "peps").mkdir(parents=True)  # one short PEP: the text LM trains in seconds
    shutil.copyfile(dst / "peps" / "pep-0294.txt", data / "text" / "peps" / "pep-0294.txt")
    (data / "tokenizer" / "gpt2").mkdir(parents=True)
    shutil.copyfile(dst / "tokenizer.json", data / "tokenizer" / "gpt2" / "tokenizer.json")
    (dst / "bench").mkdir()
    for script in (root / "bench").glob("*.py"):
        shutil.copyfile(script, dst / "bench" / script.name)
    for folder in ("examples", "tools"):
        (dst / folder).symlink_to(root / folder, target_is_directory=True)


def _imagenet_like(photos: Path, dst: Path) -> None:
    """ImageNet's layout in miniature: split/class/file.jpg, crops of different sizes and
    aspects (landscape and portrait) of the fixture photographs, re-encoded as JPEG."""
    from PIL import Image

    boxes = [(0, 0, 300, 260), (40, 20, 300, 300), (100, 0, 380, 210), (0, 50, 240, 300)]
    for photo, label in (("chelsea.jpg", "cat"), ("coffee.jpg", "coffee")):
        with Image.open(photos / photo) as im:
            im = im.convert("RGB")
            for i, box in enumerate(boxes):
                split = "val" if i == len(boxes) - 1 else "train"
                (dst / split / label).mkdir(parents=True, exist_ok=True)
                im.crop(box).save(dst / split / label / f"{label}_{i}.jpg", quality=90)


def _run_command(snippet: Snippet, command: str, workdir: Path) -> None:
    words = shlex.split(command)
    if words[0] == "packdata":
        from typer.testing import CliRunner

        from packdata.cli import app

        result = CliRunner().invoke(app, words[1:])
        code, output = result.exit_code, result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            output += "".join(traceback.format_exception(result.exception))
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, text=True,
                              capture_output=True, timeout=300)
        code, output = proc.returncode, proc.stdout + proc.stderr
    if code != 0:
        raise SnippetError(f"{snippet.where}: `{command}` exited with {code}:\n"
                           f"{output[-3000:]}\n{_workspace_note(workdir)}")


def _workspace_note(workdir: Path) -> str:
    given = ", ".join(WORKSPACE)
    return (f"(the workspace starts with {given}; it now holds "
            f"{', '.join(sorted(p.name for p in workdir.iterdir()))})")


def _run_python(snippet: Snippet, namespace: dict, workdir: Path) -> None:
    try:
        code = compile(snippet.code, snippet.where, "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, namespace)  # noqa: S102 - running the documentation is the point
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc)[-6:])
        raise SnippetError(f"{snippet.where}: the Python snippet failed:\n{tb}\n"
                           f"{_workspace_note(workdir)}") from exc


def run_file(path: Path, workdir: Path | None = None) -> list[tuple[Snippet, str, str]]:
    """Run every snippet of ``path`` in order in a fresh workspace (``workdir`` or a temporary
    folder). Returns what was skipped: (snippet, command or "", reason). Raises SnippetError."""
    skipped: list[tuple[Snippet, str, str]] = []
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="docs-")))
        make_workspace(workdir)
        before = Path.cwd()
        os.chdir(workdir)
        stack.callback(os.chdir, before)
        namespace: dict = {"__name__": "__docs__"}
        for snippet in extract(path):
            if snippet.skip:
                skipped.append((snippet, "", snippet.skip))
                continue
            if snippet.lang == "python":
                _run_python(snippet, namespace, workdir)
                continue
            for command, reason in commands(snippet):
                if reason:
                    skipped.append((snippet, command, reason))
                else:
                    _run_command(snippet, command, workdir)
    return skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--list", action="store_true", help="list the snippets, run nothing")
    args = p.parse_args(argv)
    files = args.files or doc_files()
    if args.list:
        for path in files:
            for s in extract(path):
                status = f"skip: {s.skip}" if s.skip else f"{s.lang}, {len(s.code.splitlines())} lines"
                print(f"{s.where}  {status}")
                for prefix, reason in s.skip_lines:
                    print(f"    skip-line {prefix}: {reason}")
        return 0
    failed = 0
    for path in files:
        try:
            for snippet, command, reason in run_file(path):
                print(f"{snippet.where}  skipped {command or 'block'}: {reason}")
            print(f"{path}: ok")
        except SnippetError as exc:
            failed += 1
            print(exc, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
