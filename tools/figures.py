"""The figures of README.md, docs/*.md and examples/README.md, written from their results.

    python tools/figures.py            # check: every bound block is its rendering (exit 1 if not)
    python tools/figures.py --write    # rewrite every bound block from its results

A bound block is a table (indented or not) or a paragraph that follows a marker line
``<!-- figures: ID -->``. Its binding is ``bench/figures/ID.md``, found by ID wherever the block
lies, so a table moves between files with its marker and keeps its binding. The binding starts
with definitions, one a line up to the first blank line::

    fe = bench/results/first_epoch.json          # a results file
    fe0 = bench/results/first_epoch-earlier.json
    first = runs(fe, fe0)                        # or an expression over earlier names
    label_columns = 2                            # a table's first 2 columns name what was measured

then holds the block's text, each figure written as ``{EXPRESSION:FORMAT}``: a Python
expression over the names and the helpers below (subscripts, calls, arithmetic; nothing
else), formatted with a Python format spec (``{x:,.0f}`` → 1,234; a negative number printed
with a minus sign, −). ``{{`` and ``}}`` are literal braces. A results file is subscripted by
key or by a path of keys (``fe["rows", "lmdb full reopen", "ratio"]``); a list of records by
position or by ``"FIELD=VALUE"`` (the one record whose FIELD is VALUE).

Helpers:

- ``runs(a, b, …)``: the same path in several results files, printed as the range of their
  values (``0.43–0.47``, or ``0.52`` when both print alike); ``span(x, y, …)``: a range.
- ``each(node, "* full reopen", "ratio")``: one value per container, printed ``a / b / c``.
- ``median``, ``mean``, ``low``, ``high`` of a list; ``total(node, *path)``: the sum of a path
  over a node's records; ``pluck(node, *path)``: that path of every record, as a list;
  ``rates(rounds, 0, 1)``: each row's first value over its second; ``ratios(xs, ys)``: two
  lists divided element by element.
- ``held(target, lmdb=…, …)``: a target met by every run (``yes``), by none (``no``) or by
  some (``hdf5 (lmdb and tar in one run)``); ``met(("≥ 2", x, y), ("≤ 0.5", z))``: ``met`` or
  ``not met``; ``fmt(x, ",.0f", none="not run")``: a figure, or what stands for a missing one.
- ``fact("14", "the cases of tests/test_x.py")``: a figure that is not a measurement, with
  its source.

The test (tests/test_figures.py) compares each bound block with its rendering, so an edited
figure or a changed result fails it; a table's figures outside the first column must all be
expressions (targets such as ``≥ 0.8×`` aside).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BINDINGS = ROOT / "bench" / "figures"
MARKER = re.compile(r"^(\s*)<!--\s*figures:\s*(.+?)\s*-->\s*$")
ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")  # a list item starts a block of its own
MINUS = "\u2212"


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            root / "examples" / "README.md"]


class BindingError(Exception):
    """A binding that cannot be rendered: it names its file and what is wrong."""


# -- values ----------------------------------------------------------------------------------

class Node:
    """A part of a results file, subscripted by key, path of keys, position or FIELD=VALUE."""

    def __init__(self, value: Any, where: str) -> None:
        self.value, self.where = value, where

    def __getitem__(self, key: Any) -> Any:
        keys = key if isinstance(key, tuple) else (key,)
        value, where = self.value, self.where
        for k in keys:
            value, where = _step(value, k, where)
        return wrap(value, where)

    def __iter__(self):
        items = self.value.items() if isinstance(self.value, dict) else enumerate(self.value)
        return (wrap(v, f"{self.where}[{k!r}]") for k, v in items)

    def __len__(self) -> int:
        return len(self.value)

    def __format__(self, spec: str) -> str:
        raise BindingError(f"{self.where} is not a figure ({type(self.value).__name__})")


def _step(value: Any, key: Any, where: str) -> tuple[Any, str]:
    here = f"{where}[{key!r}]"
    if isinstance(value, list) and isinstance(key, str) and "=" in key:
        wanted = [part.split("=", 1) for part in key.split("; ")]
        found = [v for v in value if isinstance(v, dict)
                 and all(str(v.get(field)) == want for field, want in wanted)]
        if len(found) != 1:
            raise BindingError(f"{here}: {len(found)} records match")
        return found[0], here
    try:
        return value[key], here
    except (KeyError, IndexError, TypeError):
        raise BindingError(f"{here}: no such key") from None


def wrap(value: Any, where: str) -> Any:
    return Node(value, where) if isinstance(value, (dict, list)) else value


def plain(value: Any) -> Any:
    return value.value if isinstance(value, Node) else value


def number(x: Any, spec: str) -> str:
    """``x`` formatted with ``spec``, a negative number with a minus sign."""
    if isinstance(x, Span):
        return format(x, spec)
    if isinstance(x, bool) or x is None:
        raise BindingError(f"{x!r} is not a figure")
    text = format(x, spec)
    return MINUS + text[1:] if text.startswith("-") else text


@dataclass(frozen=True)
class Span:
    """Values printed as their range: ``low–high``, or one figure where both print alike."""

    values: tuple

    def __format__(self, spec: str) -> str:
        values = [v for v in self.values if v is not None]
        low, high = number(min(values), spec), number(max(values), spec)
        return low if low == high else f"{low}–{high}"

    def __getitem__(self, key: Any) -> Any:  # runs of records: the same path in each
        return _spread([v[key] for v in self.values])


def _spread(values: list[Any]) -> Any:
    if all(isinstance(v, Node) for v in values):
        return Span(tuple(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return Span(tuple(values))
    raise BindingError(f"runs of unlike values: {values!r}")


@dataclass(frozen=True)
class Per:
    """One figure per container (or other name), printed ``a / b / c``."""

    values: dict

    def __format__(self, spec: str) -> str:
        return " / ".join(number(v, spec) for v in self.values.values())


def each(node: Any, pattern: str, *path: Any, names: tuple = ("lmdb", "hdf5", "tar")) -> Per:
    """``node[pattern with * as name, *path]`` for each name: ``each(first, "* full reopen",
    "ratio")``."""
    return Per({name: node[(pattern.replace("*", name), *path)] for name in names})


def runs(*docs: Any) -> Span:
    return Span(tuple(docs))


def span(*values: Any) -> Span:
    flat = [x for v in values for x in (v.values if isinstance(v, Span) else [v])]
    return Span(tuple(flat))


def _numbers(values: Any) -> list[float]:
    values = plain(values)
    if isinstance(values, Span):
        values = list(values.values)
    return [float(plain(v)) for v in values]


def median(values: Any) -> float:
    return statistics.median(_numbers(values))


def mean(values: Any) -> float:
    return statistics.mean(_numbers(values))


def low(values: Any) -> float:
    return min(_numbers(values))


def high(values: Any) -> float:
    return max(_numbers(values))


def total(node: Node, *path: Any) -> float:
    """The sum of ``path`` over every record of ``node`` (a list, or a dict's values)."""
    return sum(child[path] if path else child for child in node)


def pluck(node: Node, *path: Any) -> list[Any]:
    """``path`` of every record of ``node`` (a list, or a dict's values), as a list."""
    return [child[path] if path else child for child in node]


def rates(rows: Any, num: int, den: int) -> list[float]:
    """``row[num] / row[den]`` of each row of a list of rows (a round's images over its
    seconds, say)."""
    return [float(plain(row)[num]) / float(plain(row)[den]) for row in rows]


def ratios(xs: Any, ys: Any) -> list[float]:
    """Element by element, ``x / y`` of two lists (round by round)."""
    return [x / y for x, y in zip(_numbers(xs), _numbers(ys), strict=True)]


def fact(text: str, source: str) -> str:
    """A figure no results file holds, with where it comes from (a test's cases, say): printed
    as given; the binding says why it is not measured."""
    if not source.strip():
        raise BindingError(f"fact({text!r}): say where it comes from")
    return text


def fmt(value: Any, spec: str, none: str | None = None) -> str:
    """``value`` formatted with ``spec``; ``none`` where the results hold null (not measured)."""
    if value is None and none is not None:
        return none
    return number(value, spec)


def _meets(target: str, value: float) -> bool:
    op, bound = target.split()
    return {"≥": value >= float(bound), "≤": value <= float(bound)}[op]


def met(*checks: tuple) -> str:
    """``met`` when every value of every check ``(target, value, …)`` meets its target
    (``"≥ 2"``, ``"≤ 0.5"``), else ``not met``."""
    ok = all(_meets(target, float(v)) for target, *values in checks for v in values)
    return "met" if ok else "not met"


def held(target: str, per: Per | None = None, **results: Any) -> str:
    """Which of ``results`` (name → a value or the runs' Span; or a Per) meet ``target``
    (``≥ 0.8`` or ``≤ 1.2``) in every run, and which only in some: ``yes``, ``no``, ``hdf5
    (lmdb and tar in one run)``, ``no (lmdb in one run)``."""
    if per is not None:
        results = {**per.values, **results}
    every, some = [], []
    for name, value in results.items():
        values = value.values if isinstance(value, Span) else (value,)
        meeting = [_meets(target, v) for v in values]
        if all(meeting):
            every.append(name)
        elif any(meeting):
            some.append(name)
    if len(every) == len(results):
        return "yes"
    head = ", ".join(every) if every else "no"
    if not some:
        return head
    joined = some[0] if len(some) == 1 else ", ".join(some[:-1]) + " and " + some[-1]
    return f"{head} ({joined} in one run)"


HELPERS = {"runs": runs, "span": span, "each": each, "fmt": fmt, "total": total, "fact": fact, "met": met,
           "rates": rates, "ratios": ratios, "pluck": pluck, "median": median, "mean": mean, "low": low,
           "high": high, "held": held, "len": len, "min": min, "max": max, "abs": abs,
           "round": round, "sum": sum}
ALLOWED = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.Subscript, ast.Tuple,
           ast.Call, ast.keyword, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.Div,
           ast.Pow, ast.USub, ast.List, ast.Slice)


def evaluate(expression: str, names: dict[str, Any], where: str) -> Any:
    """``expression`` over ``names`` and the helpers; only the node types in ALLOWED."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise BindingError(f"{where}: {expression!r}: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED):
            raise BindingError(f"{where}: {expression!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name)
                                               and node.func.id in HELPERS):
            raise BindingError(f"{where}: {expression!r}: only the helpers can be called")
    try:
        return eval(compile(tree, where, "eval"), {"__builtins__": {}}, {**HELPERS, **names})
    except BindingError as e:
        raise BindingError(f"{where}: {expression!r}: {e}") from None
    except (NameError, TypeError, ValueError, ZeroDivisionError) as e:
        raise BindingError(f"{where}: {expression!r}: {e}") from None


# -- bindings --------------------------------------------------------------------------------

@dataclass
class Binding:
    id: str
    path: Path
    results: list[str]  # the results files it reads, as the repository names them
    names: dict[str, Any]
    body: str  # the template
    body_line: int  # where the body starts in the binding file

    @property
    def label_columns(self) -> int:
        """How many leading columns of the table name what was measured (the first, unless
        the binding sets ``label_columns``): text there may hold numbers (a batch size)."""
        return int(self.names.get("label_columns", 1))

    def render(self) -> str:
        """The block's text, every figure written from the results."""
        out = []
        for n, line in enumerate(self.body.splitlines(), start=self.body_line):
            where = f"{self.path.relative_to(ROOT).as_posix()}:{n}"
            text = ""
            for literal, field, spec, conversion in string.Formatter().parse(line):
                text += literal
                if field is None:
                    continue
                if conversion:
                    raise BindingError(f"{where}: no !{conversion} conversions")
                value = evaluate(field, self.names, where)
                text += value if isinstance(value, str) and not spec else number(value, spec)
            out.append(text)
        return "\n".join(out)

    def literal_figures(self) -> list[str]:
        """Numbers a table's template writes as text outside its first column (targets such
        as ``≥ 0.8×`` aside): figures no results file backs."""
        found = []
        body = False  # a table's rows: the lines after its header's separator
        for line in self.body.splitlines():
            if re.match(r"^\s*\|\s*:?-", line):
                body = True
                continue
            body = body and line.lstrip().startswith("|")
            if not body:
                continue
            cells = line.strip().strip("|").split("|")[self.label_columns:]
            for cell in cells:
                bare = re.sub(r"\{[^{}]*\}", "", cell)
                bare = re.sub(r"[≤≥<>]\s*\d[\d.,]*\s*[×%]?", "", bare)
                found += re.findall(r"(?<![\w.])\d[\d,.]*", bare)
        return found


def load_binding(binding_id: str, root: Path = ROOT) -> Binding:
    path = root / "bench" / "figures" / f"{binding_id}.md"
    if "/" in binding_id:
        raise BindingError(f"the marker names results files ({binding_id}): write their figures' "
                           "binding, bench/figures/ID.md, and mark the block <!-- figures: ID -->")
    if not ID.match(binding_id) or not path.is_file():
        raise BindingError(f"no binding bench/figures/{binding_id}.md")
    lines = path.read_text().splitlines()
    names: dict[str, Any] = {}
    results: list[str] = []
    n = 0
    while n < len(lines) and lines[n].strip():
        where = f"bench/figures/{binding_id}.md:{n + 1}"
        name, sep, value = lines[n].partition("=")
        name, value = name.strip(), value.split("#", 1)[0].strip()
        if not sep or not name.isidentifier() or name in HELPERS:
            raise BindingError(f"{where}: expected NAME = bench/results/FILE.json or "
                               "NAME = expression")
        if value.endswith(".json"):
            file = root / value
            if not value.startswith("bench/results/") or not file.is_file():
                raise BindingError(f"{where}: no results file {value}")
            names[name] = wrap(json.loads(file.read_text()), value)
            results.append(value)
        else:
            names[name] = evaluate(value, names, where)
        n += 1
    return Binding(binding_id, path, results, names, "\n".join(lines[n + 1:]), n + 2)


# -- bound blocks in the docs ----------------------------------------------------------------

@dataclass
class Block:
    doc: Path
    line: int  # the marker's line (1-based)
    marker: str  # what follows "figures:"
    indent: str
    start: int  # index of the block's first line
    end: int  # index after its last line
    text: str  # the block, its indentation removed

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def table(self) -> bool:
        return self.text.startswith("|")


def blocks(doc: Path, text: str | None = None) -> list[Block]:
    """Every ``<!-- figures: … -->`` marker of ``doc`` and the block after it: the table, or
    the paragraph (up to a blank line, or the next list item: a bound list item is one item)."""
    lines = (doc.read_text() if text is None else text).splitlines()
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        indent = m.group(1)
        j = i + 1
        table = lines[j].strip().startswith("|") if j < len(lines) else False
        while j < len(lines) and lines[j].strip() and not MARKER.match(lines[j]) and (
                not table or lines[j].strip().startswith("|")) and (
                table or j == i + 1 or not ITEM.match(lines[j])):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:j]]
        found.append(Block(doc, i + 1, m.group(2), indent, i + 1, j, "\n".join(body)))
    return found


def bound(block: Block) -> bool:
    return not block.marker.startswith("none")


def mismatch(block: Block, rendered: str) -> str | None:
    """The first line where ``block`` differs from its rendering, or None."""
    have, want = block.text.splitlines(), rendered.splitlines()
    for k in range(max(len(have), len(want))):
        a = have[k] if k < len(have) else "(nothing)"
        b = want[k] if k < len(want) else "(nothing)"
        if a != b:
            return (f"{block.doc.relative_to(ROOT).as_posix()}:{block.start + k + 1}: the "
                    f"document has\n  {a}\nits results (bench/figures/{block.marker}.md) give\n"
                    f"  {b}")
    return None


def write(doc: Path) -> int:
    """Rewrite ``doc``'s bound blocks from their results; the number of blocks changed."""
    lines = doc.read_text().splitlines()
    changed = 0
    for block in reversed(blocks(doc)):
        if not bound(block):
            continue
        rendered = load_binding(block.marker).render()
        if rendered != block.text:
            lines[block.start:block.end] = [block.indent + ln if ln else ln
                                            for ln in rendered.splitlines()]
            changed += 1
    if changed:
        doc.write_text("\n".join(lines) + "\n")
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite the bound blocks")
    args = p.parse_args(argv)
    bad = 0
    for doc in doc_files():
        if args.write:
            n = write(doc)
            if n:
                print(f"{doc.relative_to(ROOT)}: {n} block(s) rewritten")
            continue
        for block in blocks(doc):
            if bound(block):
                try:
                    problem = mismatch(block, load_binding(block.marker).render())
                except BindingError as e:
                    problem = f"{block.where}: {e}"
                if problem:
                    print(problem)
                    bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
