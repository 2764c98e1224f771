"""What is in a packed dataset (``packdata inspect``): a summary dict, its lines as a table
shows them, and a preview grid of samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from packdata import containers, sources
from packdata.containers.base import Reader, disk_size
from packdata.containers.integrity import at_open
from packdata.errors import DatasetError, PackdataError
from packdata.urls import is_url

PADDING_BATCH = 64  # batch size of the padding estimate shown for text datasets
SKIPPED_SHOWN = 5  # skipped inputs named by `packdata inspect` (the manifest lists them all)


def describe(path: str | Path, preview: str | Path | None = None) -> dict[str, Any]:
    """Count, fields, classes, size on disk and creation parameters of the dataset at ``path``
    (a path or a URL, as :func:`packdata.open` takes; at a URL the size is what is stored), and
    the inputs conversion skipped (path and reason each). ``preview``: also write a PNG grid of
    its first images there (:func:`write_preview`)."""
    url = is_url(path)
    path = str(path).rstrip("/") if url else Path(path)
    reader = containers.open_reader(path)  # its reader, not the dataset: no torch for a summary
    try:
        info = _described(reader, path, url)
    finally:
        reader.close()
    if preview is not None:
        info["preview"] = str(write_preview(path, preview))
    return info


def _described(reader: Reader, path: str | Path, url: bool) -> dict[str, Any]:
    m = reader.manifest
    try:
        sources.get(m.kind)
    except PackdataError as exc:  # an edited manifest, or one of a newer packdata
        raise DatasetError(f"{path}: {exc}") from None
    # the checks packdata.open makes, damage named here (at a URL each shard fetched is checked)
    at_open(reader, path, "off" if url else "sample")
    info: dict[str, Any] = {
        "path": str(path),
        "container": m.container,
        "kind": m.kind,
        "count": m.count,
        "fields": {k: f.to_dict() for k, f in m.fields.items()},
        "classes": m.classes,
        "bytes_on_disk": reader.shards.stored_bytes() if url else disk_size(Path(path)),
        "source": m.source,
        "options": m.options,
        "skipped": m.skipped,
        "extra": {k: v for k, v in m.extra.items() if k != "shards"},
    }
    if "shards" in m.extra:
        info["shards"] = len(m.extra["shards"])
    for name in m.variable_fields:
        lengths = reader.lengths(name)
        info.setdefault("lengths", {})[name] = {
            "min": int(lengths.min()), "median": float(np.median(lengths)),
            "max": int(lengths.max()), "total": int(lengths.sum()),
        }
    if m.kind == "text" and m.count:
        # the samplers a text dataset is read with: the one part of a summary that loads torch
        from packdata.loading.buckets import LengthBucketBatchSampler, padding_fraction
        from packdata.loading.sampling import EpochBatchSampler

        lengths = reader.lengths("tokens")
        random = EpochBatchSampler(len(lengths), PADDING_BATCH, seed=0)
        info["padding"] = {  # what padding each batch to its longest costs, one epoch
            "batch_size": PADDING_BATCH,
            "random": padding_fraction(random, lengths),
            "bucketed": LengthBucketBatchSampler(lengths, PADDING_BATCH).padding_fraction(0),
        }
    return info


def print_table(info: dict[str, Any], console: Console) -> None:
    """:func:`describe`'s result as ``packdata inspect`` shows it: a table of what and value."""
    table = Table(title=escape(info["path"]), show_header=False)
    for key, value in lines(info):  # values hold paths and lists: no markup
        table.add_row(escape(key), escape(value))
    console.print(table)


def lines(info: dict[str, Any]) -> list[tuple[str, str]]:
    """:func:`describe`'s result as (what, value) lines."""
    out = [("container", info["container"]), ("kind", info["kind"]),
           ("samples", f"{info['count']:,}")]
    for name, f in info["fields"].items():
        shape = "×".join("N" if s is None else str(s) for s in f["shape"]) or "scalar"
        codec = f" ({f['codec']})" if f.get("codec") else ""
        checks = (f", a checksum per entry of {', '.join(f['checks_entries_of'])}"
                  if f.get("checks_entries_of") else "")
        out.append((f"field {name}", f"{f['dtype']} {shape}{codec}{checks}"))
    for name, stats in info.get("lengths", {}).items():
        out.append((f"{name} lengths", ", ".join(f"{k} {number(v)}" for k, v in stats.items())))
    if "padding" in info:
        p = info["padding"]
        out.append((f"padding (batches of {p['batch_size']})",
                    f"random {p['random']:.1%}, length-bucketed {p['bucketed']:.1%}"))
    if info["classes"]:
        out.append(("classes", f"{len(info['classes'])}: " + ", ".join(info["classes"][:10])))
    out += [("size on disk", f"{info['bytes_on_disk'] / 2**20:,.1f} MiB"),
            ("source", json.dumps(info["source"])), ("options", json.dumps(info["options"]))]
    skipped = info["skipped"]
    if skipped:  # named, the first few: the manifest lists them all
        named = "; ".join(f"{s['path']} ({s['reason']})" for s in skipped[:SKIPPED_SHOWN])
        more = f"; and {len(skipped) - SKIPPED_SHOWN:,} more" if len(skipped) > SKIPPED_SHOWN else ""
        out.append(("skipped inputs", f"{len(skipped):,}: {named}{more}"))
    out += [(k, json.dumps(v)[:200]) for k, v in info["extra"].items()]
    return out + ([("preview", f"written to {info['preview']}")] if "preview" in info else [])


def number(value: float) -> str:
    """1,024 for an integral value (a median of whole lengths is often one), else 1,024.5."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def write_preview(path: str | Path, out: str | Path, count: int = 64, columns: int = 8) -> Path:
    """Write a PNG grid of the first ``count`` images of an image dataset, as the dataset
    serves them (through its torch face), each shrunk to fit :data:`THUMBNAIL` pixels (aspect
    kept): a grid of photos stays a few hundred pixels wide whatever their sizes."""
    from PIL import Image

    from packdata.loading.dataset import open_dataset

    ds = open_dataset(path)
    if ds.manifest.kind != "image":
        raise DatasetError(f"{path}: --preview needs an image dataset, not {ds.manifest.kind}")
    n = min(count, len(ds))
    thumbs = [_thumbnail(ds[i][0] if isinstance(ds[i], tuple) else ds[i]) for i in range(n)]
    h = max(a.shape[0] for a in thumbs)
    w = max(a.shape[1] for a in thumbs)
    rows = -(-n // columns)
    grid = np.zeros((rows * (h + 2), columns * (w + 2), thumbs[0].shape[2]), dtype=np.uint8)
    for i, a in enumerate(thumbs):
        r, c = divmod(i, columns)
        grid[r * (h + 2) : r * (h + 2) + a.shape[0], c * (w + 2) : c * (w + 2) + a.shape[1]] = a
    out = Path(out)
    Image.fromarray(grid.squeeze(-1) if grid.shape[2] == 1 else grid).save(out)
    return out


THUMBNAIL = 128  # the longer side of a preview's image at most, in pixels


def _thumbnail(image: Any) -> np.ndarray:
    """A served C×H×W image as uint8 H×W×C pixels whose longer side is at most THUMBNAIL
    (16-bit values shown by their high byte)."""
    from PIL import Image

    a = image.permute(1, 2, 0).numpy()
    if a.dtype != np.uint8:
        a = (a.astype(np.uint32) >> 8).astype(np.uint8)
    if max(a.shape[:2]) <= THUMBNAIL:
        return a
    im = Image.fromarray(a.squeeze(-1) if a.shape[2] == 1 else a)
    im.thumbnail((THUMBNAIL, THUMBNAIL), Image.Resampling.BILINEAR)
    return np.asarray(im).reshape(im.height, im.width, a.shape[2])
