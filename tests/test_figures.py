"""Every figure in README.md, docs/*.md and examples/README.md is written from its results.

A table of figures (indented or not), or a paragraph, follows a marker ``<!-- figures: ID -->``
and is exactly what its binding ``bench/figures/ID.md`` renders from the results files it names
(tools/figures.py: each figure an expression over the JSON, with its format). So changing one
printed number, or a result behind one, fails :func:`test_each_bound_block_is_its_rendering`;
``python tools/figures.py --write`` rewrites the blocks after a bench is re-run. A table with
numbers and no figures (options, layouts) says so: ``<!-- figures: none: REASON -->``. The
binding is found by its ID, so a table moves between files with its marker.

The mutation test edits one printed figure at a time, in every bound block, and runs the
checker on the edited document: every edit must fail.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import figures  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = figures.doc_files(ROOT)
#: a figure as the docs print it: 1,234.5 or −7.3 (the number itself, for the mutation test)
FIGURE = re.compile(r"(?<![\w.])[−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def all_blocks() -> list[figures.Block]:
    return [block for doc in DOCS for block in figures.blocks(doc)]


def bound_blocks():
    return [pytest.param(b, id=b.where) for b in all_blocks() if figures.bound(b)]


def problem(block: figures.Block, rendered: str | None = None) -> str | None:
    """What the checker says of ``block``: None when it is its rendering."""
    try:
        if rendered is None:
            rendered = figures.load_binding(block.marker).render()
    except figures.BindingError as e:
        return f"{block.where}: {e}"
    return figures.mismatch(block, rendered)


@pytest.mark.parametrize("block", bound_blocks())
def test_each_bound_block_is_its_rendering(block):
    found = problem(block)
    assert found is None, (f"{found}\n(after re-running a bench: python tools/figures.py --write; to "
                           f"change the block's words, edit them in bench/figures/{block.marker}.md)")


@pytest.mark.parametrize("block", bound_blocks())
def test_the_document_shows_the_command_that_writes_each_results_file(block):
    """A bench script that names the file, or the command the file records, is in the same
    document as a table (a table moved to another file takes its command along); a paragraph
    may cite figures whose command another document shows."""
    text = block.doc.read_text() if block.table else "\n".join(d.read_text() for d in DOCS)
    flat = " ".join(text.split())
    scripts = {f"bench/{s}.py" for s in re.findall(r"(?<![\w/])bench/(\w+)\.py", text)}
    scripts |= {f"tools/{s}" for s in re.findall(r"(?<![\w/])tools/([\w-]+\.sh)", text)}
    scripts = {s for s in scripts if (ROOT / s).is_file()}
    for path in figures.load_binding(block.marker).results:
        data = json.loads((ROOT / path).read_text())
        recorded = data.get("command", "") if isinstance(data, dict) else ""
        shows = [s for s in scripts if Path(path).name in (ROOT / s).read_text()]
        shows += [path] if f"--json {path}" in flat else []  # a command that names it
        assert shows or (recorded and all(part.strip() in flat for part in recorded.split("&&"))), (
            f"{block.where}: the document shows no command that writes {path}")


def tables(doc: Path) -> list[tuple[int, list[str]]]:
    """(line number, rows) of every markdown table of ``doc``, indented ones included."""
    lines = doc.read_text().splitlines()
    found, i = [], 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.match(r"^\s*\|\s*:?-", lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            found.append((i + 1, lines[i + 2:j]))
            i = j
        else:
            i += 1
    return found


def test_every_table_of_figures_is_bound():
    """A table with a number outside its first column has a marker on the line above it: a
    binding, or ``none: REASON``."""
    markers = {(b.doc, b.line): b for b in all_blocks()}
    for doc in DOCS:
        for line, rows in tables(doc):
            where = f"{doc.relative_to(ROOT)}:{line}"
            block = markers.get((doc, line - 1))
            cells = [c for row in rows for c in row.strip().strip("|").split("|")[1:]]
            if block is None:
                assert not any(FIGURE.search(c) for c in cells), (
                    f"{where}: a table with numbers needs <!-- figures: ID --> (its binding "
                    "bench/figures/ID.md) or <!-- figures: none: why --> on the line above")
            elif not figures.bound(block):
                assert re.match(r"none: \S", block.marker), f"{where}: say why it holds no figures"


def test_bindings_write_every_figure_of_a_table_from_the_results():
    """Outside a table's label columns every number is an expression over the results
    (targets such as ≥ 0.8× aside, and figures marked fact(…) with their source)."""
    for path in sorted(figures.BINDINGS.glob("*.md")):
        binding = figures.load_binding(path.stem)
        assert binding.literal_figures() == [], f"{path.relative_to(ROOT)}: written as text"


def test_every_binding_is_used_by_one_block():
    used = [b.marker for b in all_blocks() if figures.bound(b)]
    assert sorted(set(used)) == sorted(used), "a binding used twice"
    assert sorted(used) == sorted(p.stem for p in figures.BINDINGS.glob("*.md"))


def edits(number: str) -> list[str]:
    """Single-figure edits of a printed number: its last digit changed, and its value moved by
    one unit of its last place and by 0.10 (formatted as printed)."""
    digits = [i for i, ch in enumerate(number) if ch.isdigit()]
    last = digits[-1]
    out = [number[:last] + str((int(number[last]) + 1) % 10) + number[last + 1:]]
    negative = number[0] in "−-"
    value = float(number.lstrip("−-").replace(",", "")) * (-1 if negative else 1)
    decimals = len(number.split(".")[1]) if "." in number else 0
    for step in (10 ** -decimals, 0.10):
        moved = value + step
        text = f"{abs(moved):,.{decimals}f}" if "," in number else f"{abs(moved):.{decimals}f}"
        out.append(("−" if moved < 0 else "") + text)
    return [e for e in dict.fromkeys(out) if e != number]


def mutants(block: figures.Block):
    """(description, the document with one figure of ``block`` edited) for every figure."""
    text = block.doc.read_text()
    lines = text.splitlines(keepends=True)
    for k in range(block.start, block.end):
        for m in FIGURE.finditer(lines[k]):
            for edit in edits(m.group(0)):
                changed = lines[k][:m.start()] + edit + lines[k][m.end():]
                yield (f"line {k + 1}: {m.group(0)} → {edit}",
                       "".join(lines[:k]) + changed + "".join(lines[k + 1:]))


def mutation_run(blocks: list[figures.Block], every: int = 1) -> tuple[int, list[str]]:
    """Edit each figure of ``blocks`` (every ``every``-th edit), run the checker on the edited
    document; (edits made, edits the checker passed)."""
    made, passed = 0, []
    for block in blocks:
        rendered = figures.load_binding(block.marker).render()
        for n, (what, text) in enumerate(mutants(block)):
            if n % every:
                continue
            made += 1
            [edited] = [b for b in figures.blocks(block.doc, text) if b.line == block.line]
            if problem(edited, rendered) is None:
                passed.append(f"{block.where}: {what}")
    return made, passed


def test_every_single_figure_edit_fails():
    """The mutation run over every bound block (a third of the edits, in turn; ``python
    tests/test_figures.py`` runs them all): none passes the checker."""
    made, passed = mutation_run([b for b in all_blocks() if figures.bound(b)], every=3)
    assert made > 400 and passed == []


def test_a_table_moves_with_its_binding(tmp_path):
    """A block copied with its marker into another document is still its binding's rendering."""
    [block] = [b for b in all_blocks() if b.marker == "kill-workers"]  # an indented table
    moved = tmp_path / "moved.md"
    moved.write_text(f"# Moved\n\n<!-- figures: {block.marker} -->\n{block.text}\n")
    [again] = figures.blocks(moved)
    assert again.marker == block.marker and again.text == block.text
    assert figures.mismatch(again, figures.load_binding(again.marker).render()) is None


def test_the_renderer_evaluates_only_results_and_its_helpers():
    names = {"r": figures.wrap({"rows": [{"name": "a b", "x": 0.4349}, {"name": "c", "x": -2.5}],
                                "runs": [0.43, 0.471]}, "r.json")}
    assert figures.evaluate('r["rows", "name=a b", "x"]', names, "t") == 0.4349
    assert format(figures.evaluate('span(0.434, 0.471)', names, "t"), ".2f") == "0.43–0.47"
    assert format(figures.evaluate('span(0.521, 0.524)', names, "t"), ".2f") == "0.52"
    assert figures.number(-2.5, ".1f") == "−2.5"
    assert figures.held("≥ 0.8", lmdb=figures.span(0.79, 0.82), hdf5=0.8,
                        tar=figures.span(0.7, 0.89)) == "hdf5 (lmdb and tar in one run)"
    assert figures.held("≤ 1.2", a=1.0, b=1.1) == "yes"
    assert figures.held("≥ 0.5", a=0.4, b=figures.span(0.4, 0.6)) == "no (b in one run)"
    for bad, why in (('r.__class__', "Attribute is not allowed"),
                     ('open("x")', "only the helpers can be called"),
                     ('r["rows", "name=z"]', "0 records match"),
                     ('r["nope"]', "no such key")):
        with pytest.raises(figures.BindingError, match=re.escape(why)):
            figures.evaluate(bad, names, "t")


# -- figures in prose ------------------------------------------------------------------------

def results(name: str):
    return json.loads((RESULTS / name).read_text())


def test_gpu_md_kornia_factor_and_rounds_match_augment_json():
    text = (ROOT / "docs" / "gpu.md").read_text()
    data = results("augment.json")
    rate = {(r["group"], r["name"]): r["samples_per_s"] for r in data["rows"]}
    factors = [rate[g, n.replace("kornia", "torch")] / rate[g, n]
               for g, n in rate if n.endswith("backend=kornia")]
    low, high = re.search(r"where it is ([\d.]+)–([\d.]+)× faster than kornia", text).groups()
    assert (float(low), float(high)) == (round(min(factors), 1), round(max(factors), 1))
    assert re.search(rf"\b{data['repeat']} rounds interleaved", text)
    assert f"`--repeat {data['repeat']}`" in text
    rounds = {(r["group"], r["name"]): r["rounds"] for r in data["rows"]}

    def per_round(top, bottom):
        return [x / y for x, y in zip(rounds[top], rounds[bottom])]

    text = " ".join(text.split())
    crop = per_round(("b) batched CPU crop+flip+normalise", "packdata.loader, backend=torch"),
                     ("a) per-sample crop+flip+normalise", "DataLoader, 2 workers"))
    assert f"ratio of this run's rounds ranged {min(crop):.1f}×–{max(crop):.1f}×" in text
    jitter = per_round(("colour jitter only", "batch 256, backend=torch"),
                       ("colour jitter only", "batch 256, backend=kornia"))
    assert (f"colour jitter is {min(jitter):.1f}–{max(jitter):.1f}× kornia's on the CPU in this "
            f"run's rounds (median {statistics.median(jitter):.1f}×;") in text


def test_images_md_cpu_seconds_spread_matches_jpeg_json():
    """The stated spread of CPU-seconds between rounds, and its stated exceptions."""
    text = " ".join((ROOT / "docs" / "images.md").read_text().split())
    stated = int(re.search(r"CPU-seconds per 1,000 images varied within (\d+) %", text).group(1))
    stock, files = (int(x) for x in re.search(
        r"up to (\d+) % for the stock DataLoader and (\d+) % for the per-file", text).groups())
    spreads: dict[str, float] = {}
    firsts = []
    for rows in results("jpeg.json")["paths"].values():
        for name, row in rows.items():
            cpu = [r[2] / r[0] * 1000 for r in row["rounds"]]  # (images, wall s, CPU s)
            if name == "raw256":  # the stated exception: its first round
                firsts.append(f"{cpu[0]:.2f}")
                cpu = cpu[1:]
            spread = 100 * (max(cpu) - min(cpu)) / statistics.median(cpu)
            spreads[name] = max(spreads.get(name, 0.0), spread)
    others = [s for name, s in spreads.items() if name not in ("keep-stock", "pil-files")]
    assert round(max(others)) <= stated
    assert round(spreads["keep-stock"], -1) == stock and round(spreads["pil-files"]) == files
    assert f"(0{firsts[0][1:]} and 0{firsts[1][1:]}:" in text or \
        f"({firsts[0]} and {firsts[1]}:" in text


def test_reliability_md_kill_command_matches_kill_json():
    text = (ROOT / "docs" / "reliability.md").read_text()
    data = results("kill_conversions.json")
    kills = {c["kills"] for c in data["containers"].values()}
    assert len(kills) == 1 and f"--kills {kills.pop()} " in data["command"] + " "
    assert f"`{data['command']}`" in text  # the command shown is the one that wrote the JSON


def test_bench_md_gpu_table_is_the_table_the_code_uses():
    from packdata.bench.flops import GPUS

    doc = ROOT / "docs" / "bench.md"
    [block] = [b for b in figures.blocks(doc) if "flops.GPUS" in b.marker]
    header, _, *rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                        for line in block.text.splitlines()]
    shown = {row[0]: {h: (None if cell == "–" else float(cell))
                      for h, cell in zip(header[1:5], row[1:5])} for row in rows}
    assert set(shown) == set(GPUS)
    for name, peaks in GPUS.items():
        assert shown[name] == {h: peaks.get(h) for h in header[1:5]}, name


def test_results_name_no_machine_paths():
    """Results say how to reproduce them in the repository's terms (paths relative to it or to
    ../shared), never a folder of the machine that ran them."""
    machine = re.compile(r'["= ]/(?:work|tmp|root|home|Users|mnt)/[^" ]*')
    found = {p.name: m.group(0) for p in sorted((ROOT / "bench" / "results").glob("*.json"))
             if (m := machine.search(p.read_text()))}
    assert found == {}


if __name__ == "__main__":  # the full mutation run
    blocks = [b for b in all_blocks() if figures.bound(b)]
    made, passed = mutation_run(blocks)
    print(f"{len(blocks)} bound blocks, {made} single-figure edits, {len(passed)} passed the checker")
    for line in passed:
        print(" ", line)
    sys.exit(1 if passed else 0)
