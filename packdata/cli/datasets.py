"""The commands that take a dataset: ``inspect``, ``verify``, ``check-resume``, ``index``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from packdata.cli.app import Command, JsonPrint, app, console, fail
from packdata.errors import PackdataError

# a str, not a Path: Path("s3://bucket/ds") is "s3:/bucket/ds"
DATASET_HELP = "A packdata dataset: a path, or a URL (s3://bucket/ds) as packdata.open takes."


@app.command(cls=Command)
def inspect(
    dataset: Annotated[str, typer.Argument(help=DATASET_HELP)],
    preview: Annotated[Path | None, typer.Option(
        help="Write a PNG grid of the first samples (image datasets).")] = None,
    as_json: JsonPrint = False,
) -> None:
    """Show what a dataset holds: count, fields, classes, size on disk, how it was made."""
    from packdata.describe import describe
    from packdata.describe import preview as write_preview

    try:
        info = describe(dataset)
        if preview:
            write_preview(dataset, preview)
    except (PackdataError, OSError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    table = Table(title=escape(str(dataset)), show_header=False)

    def add_row(key: str, value: str) -> None:  # values hold paths and lists: no markup
        table.add_row(escape(key), escape(value))

    add_row("container", info["container"])
    add_row("kind", info["kind"])
    add_row("samples", f"{info['count']:,}")
    for name, f in info["fields"].items():
        shape = "×".join("N" if s is None else str(s) for s in f["shape"]) or "scalar"
        codec = f" ({f['codec']})" if f.get("codec") else ""
        checks = (f", a checksum per entry of {', '.join(f['checks_entries_of'])}"
                  if f.get("checks_entries_of") else "")
        add_row(f"field {name}", f"{f['dtype']} {shape}{codec}{checks}")
    for name, stats in info.get("lengths", {}).items():
        add_row(f"{name} lengths", ", ".join(f"{k} {_number(v)}" for k, v in stats.items()))
    if "padding" in info:
        p = info["padding"]
        add_row(f"padding (batches of {p['batch_size']})",
                      f"random {p['random']:.1%}, length-bucketed {p['bucketed']:.1%}")
    if info["classes"]:
        add_row("classes", f"{len(info['classes'])}: " + ", ".join(info["classes"][:10]))
    add_row("size on disk", f"{info['bytes_on_disk'] / 2**20:,.1f} MiB")
    add_row("source", json.dumps(info["source"]))
    add_row("options", json.dumps(info["options"]))
    if info["skipped"]:
        add_row("skipped inputs", str(info["skipped"]))
    for k, v in info["extra"].items():
        add_row(k, json.dumps(v)[:200])
    Console().print(table)
    if preview:
        console.print(f"preview written to {preview}", markup=False)


def _number(value: float) -> str:
    """1,024 for an integral value (a median of whole lengths is often one), else 1,024.5."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


@app.command(cls=Command)
def verify(
    dataset: Annotated[str, typer.Argument(help=DATASET_HELP)],
    source: Annotated[Path | None, typer.Option(
        help="Also compare every record with a fresh conversion of this input folder (with the "
        "options the manifest recorded).")] = None,
    deep: Annotated[bool, typer.Option(
        help="Also read each record alone and decode stored images.")] = False,
    as_json: JsonPrint = False,
) -> None:
    """Check a dataset: manifest, record count, every record's shape and checksum; exits 1 when
    anything is wrong, listing the bad records by key."""
    from packdata.verification import source_for
    from packdata.verification import verify as run_verify

    try:
        src = None
        if source is not None:
            from packdata.remote.tar_reader import open_reader

            src = source_for(open_reader(dataset).manifest, source)
        report = run_verify(dataset, source=src, deep=deep)
    except (PackdataError, OSError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps(report.__dict__ | {"ok": report.ok}, indent=2))
    else:
        out = Console(soft_wrap=True)
        checked = f"{report.checked} of {report.count} records checked"
        if source is not None:
            checked += f", {report.compared} compared with {source}"
        version = f" (format version {report.version})" if report.version else ""
        out.print(f"{dataset}: {report.container or 'unreadable'}{version}, {checked}", markup=False,
                  highlight=False)
        for problem in report.problems:
            out.print(f"  problem: {problem}", markup=False, highlight=False)
        for bad in report.bad[:50]:
            at = "" if bad["index"] is None else f" (record {bad['index']})"
            out.print(f"  bad: {bad['key']}{at}: {bad['problem']}", markup=False, highlight=False)
        if len(report.bad) > 50:
            out.print(f"  ... and {len(report.bad) - 50} more bad records", markup=False)
        out.print("OK" if report.ok else f"FAILED: {len(report.bad)} bad records, "
                  f"{len(report.problems)} problems", markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)



@app.command("check-resume", cls=Command)
def check_resume(
    dataset: Annotated[str, typer.Argument(help=DATASET_HELP)],
    trials: Annotated[int, typer.Option(help="Random interruptions per scenario.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the samplers and of the interruptions.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Batch size of every scenario.")] = 64,
    processes: Annotated[bool, typer.Option(
        help="Include the scenario with DataLoader worker processes (slowest to start).")] = True,
) -> None:
    """Prove mid-epoch resume: interrupt the real loaders at random steps on simulated ranks,
    save, rebuild (other num_workers, other world size), resume, and check from sample checksums
    that each epoch serves every sample once and the order continues unchanged. Exits 1 on any
    failure.

    Example: packdata check-resume cifar.lmdb --trials 3
    """
    from packdata.loading.dataset import open_dataset
    from packdata.resume_check import SETUPS
    from packdata.resume_check import check_resume as run_checks

    setups = SETUPS if processes else tuple(s for s in SETUPS if s[2] != "process")
    try:
        results = run_checks(open_dataset(dataset), setups=setups, trials=trials, seed=seed,
                             batch_size=batch_size, log=lambda row: print(row, flush=True))
    except (PackdataError, OSError) as exc:
        fail(exc)
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} scenarios passed")
    if failed:
        raise typer.Exit(1)


@app.command("index", cls=Command)
def index(
    dataset: Annotated[str, typer.Argument(
        help="A packdata tar dataset (a folder, or a URL: s3://bucket/ds).")],
) -> None:
    """Write the indexes other readers use into a tar dataset made by an older packdata: a DALI
    .idx per shard (wds2idx layout) and a wids index JSON."""
    from packdata.urls import is_url

    try:
        if is_url(dataset):
            from packdata.remote.tar_reader import write_reader_indexes_at

            written: list = write_reader_indexes_at(dataset)
        else:
            from packdata.containers.tar.reindex import write_reader_indexes

            written = write_reader_indexes(dataset)
    except (PackdataError, OSError) as exc:
        fail(exc)
    print(f"wrote {len(written)} index files in {dataset}")
