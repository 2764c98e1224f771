"""Outputs of ``packdata bench``: terminal tables, the JSON document and its schema, the plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from packdata.bench.profile import PARTS
from packdata.bench.sweep import describe
from packdata.errors import require

#: the JSON document's keys, level by level (docs/bench.md explains each; tests check both)
SCHEMA: dict[str, tuple[str, ...]] = {
    "": ("schema", "dataset", "settings", "environment", "flops", "runs", "sweep", "profile",
         "seconds"),
    "dataset": ("name", "path", "format", "kind", "count", "num_classes"),
    "settings": ("model", "batch_size", "device", "amp", "steps", "warmup", "max_seconds",
                 "workers", "seed", "warm", "loader", "augment", "target"),
    "loader": ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers",
               "non_blocking"),
    "environment": ("torch", "python", "cpu_count", "torch_threads", "device_name"),
    "run": ("input", "io", "train", "loop", "io_over_train", "verdict", "advice", "target"),
    "flops": ("per_step", "per_sample", "batch_size", "reason", "achieved_per_s"),
    "estimate": ("target", "flops_per_sample", "gpu_samples_per_s", "io_samples_per_s",
                 "wait_share", "text"),
    "rate": ("samples_per_s", "steps", "samples", "seconds"),
    "loop": ("samples_per_s", "steps", "samples", "seconds", "load_ms", "train_ms", "load_share"),
    "sweep": ("rows", "best", "tied", "pick", "repeats", "seconds"),
    "sweep_row": ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers",
                  "non_blocking", "samples_per_s", "rates", "spread", "steps", "samples",
                  "seconds", "load_ms", "train_ms", "load_share"),
    "profile": ("steps", "step_ms", "parts_ms", "data_loading_share", "trace_dir", "trace_files"),
    "parts_ms": PARTS,
}


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """Keys missing from ``doc`` (a bench result, or its JSON read back), as ``where: key``."""
    errors: list[str] = []

    def need(obj: Any, level: str, where: str) -> None:
        if not isinstance(obj, dict):
            errors.append(f"{where}: expected an object, got {type(obj).__name__}")
            return
        errors.extend(f"{where}: {key}" for key in SCHEMA[level] if key not in obj)

    need(doc, "", "top")
    need(doc.get("dataset"), "dataset", "dataset")
    need(doc.get("settings"), "settings", "settings")
    need((doc.get("settings") or {}).get("loader"), "loader", "settings.loader")
    need(doc.get("environment"), "environment", "environment")
    need(doc.get("flops"), "flops", "flops")
    for i, run in enumerate(doc.get("runs") or []):
        need(run, "run", f"runs[{i}]")
        need(run.get("input"), "dataset", f"runs[{i}].input")
        need(run.get("io"), "rate", f"runs[{i}].io")
        need(run.get("train"), "rate", f"runs[{i}].train")
        need(run.get("loop"), "loop", f"runs[{i}].loop")
        estimate = run.get("target")
        if isinstance(estimate, dict) and "reason" not in estimate:
            need(estimate, "estimate", f"runs[{i}].target")
    if not doc.get("runs"):
        errors.append("runs: empty")
    if doc.get("sweep") is not None:
        need(doc["sweep"], "sweep", "sweep")
        for i, row in enumerate(doc["sweep"].get("rows") or []):
            need(row, "sweep_row", f"sweep.rows[{i}]")
    if doc.get("profile") is not None:
        need(doc["profile"], "profile", "profile")
        need(doc["profile"].get("parts_ms"), "parts_ms", "profile.parts_ms")
    return errors


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinity as None (null): JSON has no such numbers, and readers
    other than Python's refuse them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(json_safe(result), indent=2) + "\n")


def _rate(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) else "–"


def _short(x: float) -> str:
    """A rate in at most 5 characters (the sweep's ranges): 987, 12.3k, 1.23M."""
    if not math.isfinite(x):
        return "–"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def _ratio(x: float) -> str:
    return f"{x:,.0f}×" if math.isfinite(x) and x >= 100 else f"{x:.1f}×"


def _table(title: str) -> Table:
    """A table that fits 80 columns (CI logs): light borders, headers on two lines,
    numbers never cut (their columns do not wrap: the first column wraps instead)."""
    return Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True,
                 pad_edge=False)


def print_report(result: dict[str, Any], console: Console) -> None:
    """The measurements, the verdict and advice, and the sweep and profile when present."""
    s = result["settings"]
    table = _table(f"{result['dataset']['path']}: {s['model']} on {s['device']}, batch "
                   f"{s['batch_size']}{', amp' if s['amp'] else ''}, "
                   f"{s['loader']['num_workers']} workers (samples/s)")
    table.add_column("\ninput")
    for col in ("I/O\nalone", "train\nalone", "real\nloop", "load\nms", "train\nms",
                "\nwaiting", "I/O ÷\ntrain"):
        table.add_column(col, justify="right", no_wrap=True)
    for run in result["runs"]:
        loop = run["loop"]
        table.add_row(run["input"]["name"], _rate(run["io"]["samples_per_s"]),
                      _rate(run["train"]["samples_per_s"]), _rate(loop["samples_per_s"]),
                      f"{loop['load_ms']:.1f}", f"{loop['train_ms']:.1f}",
                      f"{loop['load_share']:.0%}", _ratio(run["io_over_train"]))
    console.print(table)
    console.print(warmth_line(s), highlight=False)
    console.print(flops_line(result), highlight=False)
    for run in result["runs"]:
        prefix = f"[bold]{run['input']['name']}[/bold]: " if len(result["runs"]) > 1 else ""
        console.print(prefix + run["verdict"], highlight=False)
        for tip in run["advice"]:
            console.print(f"  • {tip}", highlight=False)
    if result.get("sweep"):
        print_sweep(result["sweep"], console)
    if result.get("profile"):
        print_profile(result["profile"], console)


def warmth_line(settings: dict[str, Any]) -> str:
    """Whether I/O was timed warm or cold: first reads after opening a dataset are slower."""
    if settings.get("warm", True):
        return ("I/O timed warm: each measurement first read, untimed, the batches it timed "
                "(first reads after opening a dataset are slower; --cold times them)")
    return ("I/O timed cold: first reads after opening (the page cache and LMDB's record "
            "lookups are cold), so this depends on what was read before")


def flops_line(result: dict[str, Any]) -> str:
    """The model's FLOPs per sample and the FLOP/s training alone achieved, or why not."""
    f = result["flops"]
    if f["per_sample"] is None:
        return f"FLOPs: not counted: {f['reason']}"
    rate = f["achieved_per_s"]
    achieved = f"{rate / 1e12:,.3g} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:,.3g} GFLOP/s"
    return (f"FLOPs: {f['per_sample'] / 1e9:,.3g} GFLOP per sample per training step (forward "
            f"+ backward); training alone achieved {achieved}")


def loader_label(r: dict[str, Any]) -> str:
    """A configuration in a few characters: ``w2 pf2 P pin nb`` (see :data:`LOADER_LEGEND`)."""
    return (f"w{r['num_workers']}" + (f" pf{r['prefetch_factor']}" if r["num_workers"] else "")
            + (" P" if r["persistent_workers"] else "") + (" pin" if r["pin_memory"] else "")
            + (" nb" if r["non_blocking"] else ""))


LOADER_LEGEND = ("loader: wN num_workers, pfN prefetch_factor, P persistent_workers, pin "
                 "pin_memory, nb non_blocking copies")


def print_sweep(sweep: dict[str, Any], console: Console) -> None:
    table = _table(f"loader sweep: {len(sweep['rows'])} configurations × {sweep['repeats']} "
                   f"runs in {sweep['seconds']:.0f} s (median samples/s)")
    table.add_column("", no_wrap=True)
    table.add_column("\nloader")
    for col in ("load\nms", "train\nms", "\nwaiting", "\nsamples/s", "\nrange", "\nspread"):
        table.add_column(col, justify="right", no_wrap=True)
    for i, r in enumerate(sweep["rows"]):
        mark = "★" if i == sweep["best"] else "≈" if i in sweep["tied"] else ""
        table.add_row(mark, loader_label(r), f"{r['load_ms']:.1f}", f"{r['train_ms']:.1f}",
                      f"{r['load_share']:.0%}", _rate(r["samples_per_s"]),
                      f"{_short(min(r['rates']))}–{_short(max(r['rates']))}",
                      f"±{r['spread'] / 2:.0%}")
    console.print(table)
    console.print(LOADER_LEGEND, highlight=False, style="dim")
    console.print(sweep_summary(sweep), highlight=False)


def sweep_summary(sweep: dict[str, Any]) -> str:
    """The sweep's conclusion in one sentence: a clear winner, or a tie and what to use."""
    rows, n = sweep["rows"], sweep["repeats"]
    if sweep["best"] is not None:
        best = rows[sweep["best"]]
        return (f"best: {describe(best)} ({_rate(best['samples_per_s'])} samples/s; its slowest "
                f"of {n} runs beats every other configuration's fastest)")
    pick = rows[sweep["pick"]]
    return (f"no clear winner: {len(sweep['tied'])} configurations (≈) are within noise of the "
            f"fastest (their ranges over {n} runs overlap); the cheapest of them: "
            f"{describe(pick)} ({_rate(pick['samples_per_s'])} samples/s)")


def print_profile(prof: dict[str, Any], console: Console) -> None:
    table = Table(title=f"step-time breakdown over {prof['steps']} profiled steps")
    table.add_column("part")
    table.add_column("ms/step", justify="right")
    table.add_column("share", justify="right")
    for part, ms in prof["parts_ms"].items():
        table.add_row(part.replace("_", " "), f"{ms:.2f}", f"{ms / prof['step_ms']:.0%}")
    table.add_row("step", f"{prof['step_ms']:.2f}", "")
    if "gpu_kernels_ms" in prof:
        table.add_row("(GPU kernels)", f"{prof['gpu_kernels_ms']:.2f}",
                      f"{prof['gpu_kernels_ms'] / prof['step_ms']:.0%}")
    console.print(table)
    console.print(f"data loading is {prof['data_loading_share']:.0%} of the step; trace in "
                  f"{prof['trace_dir']} (tensorboard --logdir, or chrome://tracing / "
                  "ui.perfetto.dev)", highlight=False)


def plot(result: dict[str, Any], path: str | Path) -> None:
    """A PNG: I/O alone vs training alone vs the real loop per input; with a sweep, each
    configuration's step split into loading and training time."""
    matplotlib = require("matplotlib", "plot", "--plot")
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    sweep = result.get("sweep")
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(13 if sweep else 7, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    runs = result["runs"]
    width = 0.27
    for k, (key, label) in enumerate((("io", "I/O alone"), ("train", "training alone"),
                                      ("loop", "real loop"))):
        xs = [i + (k - 1) * width for i in range(len(runs))]
        ax.bar(xs, [r[key]["samples_per_s"] for r in runs], width, label=label)
    ax.set_xticks(range(len(runs)), [r["input"]["name"] for r in runs])
    ax.set_yscale("log")  # I/O can outrun training a hundredfold
    ax.set_ylabel("samples/s")
    ax.set_title(f"{result['settings']['model']} on {result['settings']['device']}")
    ax.legend()
    if sweep:
        ax = axes[0][1]
        rows = sweep["rows"]
        names = [loader_label(r) for r in rows]
        ys = range(len(rows))
        ax.barh(ys, [r["load_ms"] for r in rows], label="loading")
        ax.barh(ys, [r["train_ms"] for r in rows], left=[r["load_ms"] for r in rows],
                label="training")
        marks = ["★ " if i == sweep["best"] else "≈ " if i in sweep["tied"] else ""
                 for i in range(len(rows))]
        ax.set_yticks(ys, [m + n for m, n in zip(marks, names)])
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (median)")
        ax.set_title("loader sweep (★ clear winner, ≈ within noise of the fastest)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
