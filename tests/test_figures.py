"""Every table of figures in README.md, docs/*.md and examples/README.md says where its figures
come from, and they are there.

A table with numbers carries an HTML comment just above it: ``<!-- figures: bench/results/X.json
… -->`` names the results files it was written from (a command shown within the 40 lines above
it writes each of them), ``<!-- figures: none: REASON -->`` says it holds no measurement
(options, layouts, arithmetic). Each number of a table of figures, first column aside, must be a
figure of its files as shown (rounded as printed; a share may be printed as a percentage, bytes
as MiB, rates in M): a value, a key, a number inside a string, or the mean, median, minimum or
maximum of a list; a ratio (``N×``) may also be the quotient of two figures of its row or
column, and a totals row (first cell ``**all**``) the sum of its column over the rows above
that share its other labels. Targets (``≤ 5 %``) are not figures.

A few figures in prose, which the issue tracker found contradicting their JSON, are checked
one by one at the end.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]
MARKER = re.compile(r"^<!--\s*figures:\s*(.+?)\s*-->$")
#: a number as the docs print it: 1,234.5 with an optional unit that scales it
NUMBER = re.compile(r"(?<![\w.\-])([≤≥<>]\s*)?([−-])?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?"
                    r"(\s*%|×| M\b| MiB\b| ms\b)?")


def tables(doc: Path) -> list[tuple[int, str | None, list[list[str]]]]:
    """(line number, marker text or None, body rows as cells) of each markdown table."""
    lines = doc.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|\s*:?-", lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            marker = MARKER.match(lines[i - 1].strip()) if i else None
            rows = [[c.strip() for c in row.strip().strip("|").split("|")] for row in lines[i + 2:j]]
            found.append((i + 1, marker.group(1) if marker else None, rows))
            i = j
        else:
            i += 1
    return found


def figures_of(value) -> list[float]:
    """Every figure a results file offers (see the module docstring)."""
    out: list[float] = []
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, str):
        out += [float(n) for n in re.findall(r"\d+(?:\.\d+)?", value)]
    elif isinstance(value, dict):
        for k, v in value.items():
            out += figures_of(k) + figures_of(v)
        out += sibling_sums(list(value.values()))
    elif isinstance(value, list):
        out += sibling_sums(value)
        numbers = [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers:
            out += [statistics.mean(numbers), statistics.median(numbers), min(numbers), max(numbers)]
        for v in value:
            out += figures_of(v)
    return out


def _flat(value, prefix: tuple = ()) -> dict[tuple, float]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, (*prefix, key)).items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {prefix: float(value)}
    return {}


def sibling_sums(items: list) -> list[float]:
    """Totals over records of one kind (datasets, containers): for each numeric path the
    records share, its sum over them."""
    flats = [_flat(item) for item in items if isinstance(item, dict)]
    if len(flats) < 2:
        return []
    paths = set().union(*flats)
    return [sum(f.get(path, 0.0) for f in flats) for path in paths]


def numbers_in(cell: str) -> list[tuple[float, int, str]]:
    """(value, decimals shown, unit) of each figure printed in ``cell`` (targets left out)."""
    out = []
    for target, sign, whole, frac, unit in NUMBER.findall(cell):
        if not target:
            value = float(whole.replace(",", "") + ("." + frac if frac else ""))
            out.append((-value if sign else value, len(frac), unit.strip()))
    return out


def shown(value: float, unit: str) -> list[float]:
    """What a figure of the JSON may be printed as, with ``unit``."""
    if unit == "%":
        return [value, 100 * value]
    if unit == "M":
        return [value / 1e6]
    if unit == "MiB":
        return [value, value / 2**20]
    if unit == "ms":
        return [value, 1000 * value]
    return [value]


def agrees(number: tuple[float, int, str], candidates: list[float]) -> bool:
    x, decimals, unit = number
    half = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(c - x) <= half for v in candidates for c in shown(v, unit))


def marked_tables():
    for doc in DOCS:
        for line, marker, rows in tables(doc):
            yield pytest.param(doc, line, marker, rows,
                               id=f"{doc.relative_to(ROOT).as_posix()}:{line}")


@pytest.mark.parametrize("doc,line,marker,rows", list(marked_tables()))
def test_each_table_of_figures_matches_its_results(doc, line, marker, rows):
    where = f"{doc.relative_to(ROOT)}:{line}"
    has_numbers = any(numbers_in(cell) for row in rows for cell in row[1:])
    if marker is None:
        assert not has_numbers, (f"{where}: a table with numbers needs <!-- figures: "
                                 "bench/results/X.json --> or <!-- figures: none: why --> above it")
        return
    if marker.startswith("none"):
        assert re.match(r"none: \S", marker), f"{where}: say why the table holds no figures"
        return
    paths = marker.split()
    text = doc.read_text()
    scripts = {f"bench/{s}.py" for s in re.findall(r"(?<![\w/])bench/(\w+)\.py", text)}
    scripts |= {f"tools/{s}" for s in re.findall(r"(?<![\w/])tools/([\w-]+\.sh)", text)}
    scripts = {s for s in scripts if (ROOT / s).is_file()}
    candidates: list[float] = []
    for path in paths:
        assert path.startswith("bench/results/") and (ROOT / path).is_file(), f"{where}: {path}"
        data = json.loads((ROOT / path).read_text())
        candidates += figures_of(data)
        # the document shows the command that writes it: a bench script that names the file,
        # or the command recorded in it
        recorded = data.get("command", "") if isinstance(data, dict) else ""
        shows = [s for s in scripts if Path(path).name in (ROOT / s).read_text()]
        assert shows or (recorded and all(part.strip() in " ".join(text.split())
                                          for part in recorded.split("&&"))), (
            f"{where}: the document shows no command that writes {path}")
    header = rows_header(doc, line)
    for r, row in enumerate(rows):
        for c, cell in enumerate(row[1:], start=1):
            for number in with_units(numbers_in(cell), header[c] if c < len(header) else ""):
                if agrees(number, candidates):
                    continue
                if number[2] == "×" and agrees(number, ratios(rows, r, c)):
                    continue
                if "**all**" in row[0] and agrees(number, [column_sum(rows, r, c, number)]):
                    continue
                pytest.fail(f"{where}: {number[0]:g} in row {row[0]!r} is not a figure of "
                            f"{' '.join(paths)}")


def rows_header(doc: Path, line: int) -> list[str]:
    return [c.strip() for c in doc.read_text().splitlines()[line - 1].strip().strip("|").split("|")]


def with_units(numbers, header: str):
    """A cell's numbers with the unit any of them (or else the column's header) shows."""
    units = {u for _, _, u in numbers if u and u != "×"}
    unit = units.pop() if len(units) == 1 else next(
        (u for u in ("MiB", "%") if u in header), "")
    return [(x, d, u or unit) for x, d, u in numbers]


def _first(cell: str) -> float | None:
    n = numbers_in(cell)
    return n[0][0] if n else None


def ratios(rows: list[list[str]], r: int, c: int) -> list[float]:
    """Quotients of two figures of row ``r`` or of column ``c``."""
    row = [_first(cell) for cell in rows[r][1:]]
    column = [_first(other[c]) for other in rows if c < len(other)]
    out = []
    for group in (row, column):
        values = [v for v in group if v]
        out += [a / b for a in values for b in values if a is not b]
    return out


def column_sum(rows: list[list[str]], r: int, c: int, number) -> float:
    labels = [cell for cell in rows[r][1:] if not numbers_in(cell)]
    same = [row for row in rows[:r] if [cell for cell in row[1:] if not numbers_in(cell)] == labels]
    return sum(sum(n[0] for n in numbers_in(row[c])) for row in same)


def test_the_checker_refuses_a_figure_its_json_lacks(tmp_path):
    """The matcher itself: a changed digit is caught; rounding, units and ratios are not."""
    data = {"rows": [{"rate": 75135.25, "share": 0.0561}, {"rate": 20794.4, "share": 0.2}],
            "rounds": [1.0, 3.0, 8.0]}
    candidates = figures_of(data)
    assert agrees((75135, 0, ""), candidates) and agrees((5.6, 1, "%"), candidates)
    assert agrees((3.0, 1, ""), candidates)  # median of a list
    assert not agrees((75136, 0, ""), candidates) and not agrees((5.7, 1, "%"), candidates)
    rows = [["a", "75,135", ""], ["b", "20,794", "3.61×"]]
    assert agrees(numbers_in("3.61×")[0], ratios(rows, 1, 2) + ratios(rows, 0, 1))
    assert numbers_in("≤ 5 % and 2.8 %") == [(2.8, 1, "%")]
    assert numbers_in("40.8 / −11.2 / -7.3 µs, 0.57–0.64") == [
        (40.8, 1, ""), (-11.2, 1, ""), (-7.3, 1, ""), (0.57, 2, ""), (0.64, 2, "")]
    assert not agrees(numbers_in("−11.2")[0], [11.2]) and agrees(numbers_in("−11.2")[0], [-11.2])


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
    [(line, _, rows)] = [t for t in tables(doc) if t[1] and "flops.GPUS" in t[1]]
    header = rows_header(doc, line)
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
