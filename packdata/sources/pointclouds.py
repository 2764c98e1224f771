"""Point-cloud sources: LAS/LAZ, PLY, XYZ/TXT and NPY files, presampled at conversion.

Each cloud becomes one fixed-shape record, so a batch is one contiguous gather:

- ``points``: (K, N, F) — K presampled variants of exactly N points; F columns, xyz first, then
  the other requested fields (``rgb`` is three columns, values as stored in the file);
- ``num_points`` / ``num_valid``: points in the file / with finite coordinates (int64);
- ``label`` (int64) from class sub-folders or a labels file; ``point_labels`` (K, N) int32 from a
  per-point column (e.g. LAS ``classification``); ``mask`` (K, N) bool with ``fewer="pad"``;
- ``center`` (3,) float64 and ``scale`` when normalised, to map points back to file coordinates;
- ``variant_checksums`` (K,) uint64 when K > 1: each variant's checksum (with the record's other
  fields), so that a read of the variant served is checked by hashing that variant alone
  (:class:`packdata.checksum.EntryChecks`).

Loading serves one variant per sample: ``(index + epoch) % K`` (``variant_order="epoch"``), or a
seeded hash of (seed, epoch, index) (``"random"``).
"""

from __future__ import annotations

import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from packdata.checksum import EntryChecks, entry_checksums
from packdata.errors import (
    InputWarning,
    MissingExtraError,
    OptionError,
    PackdataError,
    SampleError,
    require,
)
from packdata.manifest import Field, Manifest
from packdata.options import Option, resolve
from packdata.prep.pointsample import (
    DTYPES,
    FEWER,
    METHODS,
    NORMALIZE,
    SampleSpec,
    finite_rows,
    normalization,
    presample,
)
from packdata.sources import labels as labelling
from packdata.sources import pointfiles
from packdata.sources.base import FileTable, Item, Source, shown

KIND = "pointcloud"
SUFFIXES = pointfiles.SUFFIXES
VARIANT_ORDERS = ("epoch", "random")
#: what each normalisation does to the file's coordinates, as the manifest states it
COORDINATES = {
    "none": "stored = file coordinates (no offset, no scale)",
    "center": "stored = file coordinates - center (per-record field 'center')",
    "unit_sphere": "stored = (file coordinates - center) / scale (per-record fields 'center' "
                   "and 'scale')",
}
OPTIONS = (
    labelling.LABELS,
    Option("points", int, 4096, "Points per stored sample, N."),
    Option("sampling", str, "fps", "Presampling method.", METHODS),
    Option("voxel_size", float, None, "With --sampling voxel: voxel edge in file units (default: "
           "chosen so that about N voxels are occupied)."),
    Option("variants", int, 1, "Presamples stored per cloud, K; one is served per epoch."),
    Option("seed", int, 0, "Sampling seed."),
    Option("fields", str, "xyz", "Comma-separated fields, xyz always first, then any of "
           "intensity, classification, rgb or other column names (e.g. xyz,intensity)."),
    Option("normalize", str, "none", "Centre each cloud, or centre and scale it into the unit "
           "sphere.", NORMALIZE),
    Option("dtype", str, "float32", "Stored float type (float16 halves storage; float32 keeps "
           "about 7 significant digits: normalise map coordinates or store float64).", DTYPES),
    Option("fewer", str, "replace", "Clouds with fewer than N points: 'replace' repeats points, "
           "'pad' pads with zeros and stores a mask.", FEWER),
    Option("point_labels", str, None, "Per-point labels from this column (e.g. classification)."),
    Option("variant_order", str, "epoch", "Serve variant (index + epoch) % K, or a seeded random "
           "one.", VARIANT_ORDERS),
)


def parse_fields(fields: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"intensity,xyz"`` → ``["xyz", "intensity"]``: xyz always present and first."""
    if isinstance(fields, str):
        names = [f.strip() for f in fields.split(",")]
    elif isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields):
        names = list(fields)
    else:  # else a TypeError from iterating it
        raise OptionError(f"--fields {fields!r:.60}: expected names separated by commas, or a "
                          "list of names")
    names = [f for f in names if f and f != "xyz"]
    if len(set(names)) != len(names):
        raise OptionError(f"fields {names}: each field may appear once")
    return ["xyz", *names]


class PointCloudSource(Source):
    """Point-cloud files under ``root`` (class sub-folders, a labels file, or unlabelled)."""

    kind = KIND
    OBSERVES = True  # counts padded clouds and dropped points for the manifest
    ISOLATE_LOADING = True  # lazrs aborts the process on some damaged LAZ files

    def __init__(self, root: str | Path, **options: Any) -> None:
        """``options``: see :data:`OPTIONS`; ``fields`` may also be a list of names."""
        o = resolve(KIND, OPTIONS, options)
        self.root = root if isinstance(root, Path) else Path(root)  # a RemotePath stays one
        self.spec = SampleSpec(points=o["points"], method=o["sampling"], variants=o["variants"],
                               seed=o["seed"], voxel_size=o["voxel_size"], fewer=o["fewer"],
                               normalize=o["normalize"], dtype=o["dtype"])
        self.variant_order = o["variant_order"]
        self.field_names = parse_fields(o["fields"])
        self.point_labels = o["point_labels"]
        labels = o["labels"]
        self.labels_path = Path(labels) if labels else labelling.find_labels_file(self.root)
        if self.labels_path and not self.labels_path.is_file():
            raise PackdataError(f"{self.labels_path}: labels file not found")
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.precision: dict[str, Any] = {}
        self.counts = {"clouds_with_replacement": 0, "clouds_padded": 0,
                       "clouds_with_nonfinite": 0, "nonfinite_points_dropped": 0}
        self.num_points: list[int] = []

    def _files(self) -> list[str]:
        return self.list_inputs(SUFFIXES, used=self.labels_path)

    def items(self) -> FileTable:
        self._reset_counts()
        root = self.root if self.root.is_dir() else self.root.parent
        files = self._files()
        # missing extras fail here, once, rather than in every worker
        if any(f.lower().endswith(".laz") for f in files) and not pointfiles.laz_backend_available():
            raise MissingExtraError("lazrs", "lidar", "reading LAZ files")
        if any(f.lower().endswith(pointfiles.LAS_SUFFIXES) for f in files):
            require("laspy", "lidar", "reading LAS/LAZ files")
        unused: list[str] = []
        labels, self.classes = labelling.assign(files, self.labels_path, unused)
        self.ignore(f"entries of {self.labels_path} naming no input file", unused)
        if files and labelling.layout(files, self.labels_path) == "unlabelled":
            labelling.warn_unlabelled(self.root, "a point cloud", files)
        self._check_precision(root, [f for f in files if f.lower().endswith(pointfiles.LAS_SUFFIXES)])
        return FileTable.of(root, files, labels)

    def _check_precision(self, root: Path, files: list[str]) -> None:
        """Warn (InputWarning) when the stored float type's step at a LAS file's coordinates,
        once normalised, is coarser than the file's own scale: float32 at 487,434 m steps by
        3 cm where the file says 1 cm. From headers only; a file that fails is reported when
        loaded."""
        dtype = np.dtype(self.spec.dtype)
        losing, worst = [], (0.0, 0.0)
        for f in files:
            try:
                lo, hi, file_scale = pointfiles.las_extent(root / f)
            except Exception:  # noqa: S112 - load() names the file and the reason
                continue
            if self.spec.normalize == "unit_sphere":  # stored ≤ 1, then times the radius
                step = float(np.spacing(dtype.type(1))) * float(np.linalg.norm(hi - lo))
            else:
                reach = np.maximum(abs(lo), abs(hi)) if self.spec.normalize == "none" else hi - lo
                with np.errstate(all="ignore"):  # float16 overflows: load() says so
                    step = float(np.spacing(reach.astype(dtype)).max())
            if step > file_scale.min():
                losing.append(f)
                worst = max(worst, (step, float(file_scale.min())))
        self.precision = {"dtype": dtype.name, "files_coarser_than_their_scale": len(losing),
                          "largest_step": worst[0], "its_file_scale": worst[1]}
        if losing:
            # advise only what was not given already: centring, then any wider float type
            wider = [d for d in ("float32", "float64") if np.dtype(d).itemsize > dtype.itemsize]
            advice = ["--normalize center"] if self.spec.normalize == "none" else []
            advice += [f"--dtype {' or '.join(wider)}"] if wider else []
            warnings.warn(
                f"{root}: {dtype.name} stores coordinates in steps of up to {worst[0]:.3g} "
                f"(file units) where the files' own scale is {worst[1]:.3g}, in {len(losing)} "
                f"files ({shown(losing)})"
                + (f"; use {', or '.join(advice)}" if advice else ""),
                InputWarning, stacklevel=3)

    def blocks(self, items: list[Item]) -> list[list[Item]]:
        """One cloud per worker task: a cloud costs milliseconds to seconds to read and sample,
        so spreading them evenly over the workers beats batching them."""
        return [[item] for item in items]

    def load(self, item: Item) -> dict[str, np.ndarray]:
        if item.label == labelling.MISSING:
            raise SampleError(str(item.path), f"no label for '{item.path.name}' in {self.labels_path}")
        wanted = [c for f in self.field_names for c in pointfiles.columns_of(f)]
        table = pointfiles.read_columns(item.path, wanted + [self.point_labels or "x"])
        data = pointfiles.select(table, self.field_names, item.path)
        total = len(data)
        finite = finite_rows(data[:, :3])
        data = data[finite]
        if not len(data):
            raise SampleError(str(item.path), f"no point with finite coordinates ({total} points)")
        # seeded by the key, not the position: a cloud's samples do not depend on its neighbours
        rng = np.random.default_rng([self.spec.seed, zlib.crc32(item.key.encode())])
        chosen = presample(data[:, :3], self.spec, rng)
        centre, scale = normalization(data[:, :3], self.spec.normalize)
        points = data[chosen.indices]  # (K, N, F)
        points[..., :3] = (points[..., :3] - centre) / scale
        record = {"points": points, "num_points": np.asarray(total, dtype=np.int64),
                  "num_valid": np.asarray(len(data), dtype=np.int64)}
        if self.point_labels:
            record["point_labels"] = self._point_labels(table, item.path)[finite][chosen.indices]
        if chosen.mask is not None:
            points[~chosen.mask] = 0
            if "point_labels" in record:
                record["point_labels"][~chosen.mask] = -1  # the usual ignore index
            record["mask"] = chosen.mask
        with np.errstate(over="ignore"):  # reported below, naming the file
            record["points"] = stored = points.astype(self.spec.dtype)
        if not np.isfinite(stored).all():  # e.g. map coordinates beyond float16's ±65504
            raise SampleError(str(item.path), f"values overflow {self.spec.dtype} (largest "
                              f"magnitude {np.abs(points).max():.6g}); use --normalize center "
                              "or unit_sphere, or a wider --dtype")
        if self.spec.normalize != "none":
            record["center"] = centre.astype(np.float64)
            record["scale"] = np.asarray(scale, dtype=np.float64)
        if item.label is not None:
            record["label"] = np.asarray(item.label, dtype=np.int64)
        if self.spec.variants > 1:
            checks = self._entry_checks(record)
            record[checks.field] = entry_checksums({n: v[None] for n, v in record.items()},
                                                   checks, 1)[0]
        return record

    def _entry_checks(self, record: dict[str, np.ndarray]) -> EntryChecks:
        """The variant checksums of ``record`` (without them yet): K, one per variant."""
        return EntryChecks.over(VARIANT_CHECKSUMS, (n for n in record if n in VARIANT_FIELDS),
                                record, self.spec.variants)

    def _point_labels(self, table: dict, path: Path) -> np.ndarray:
        column = pointfiles.lookup(table, self.point_labels or "")
        if column is None:
            have = ", ".join(sorted(table))
            raise SampleError(str(path), f"point-label field '{self.point_labels}' not found "
                                         f"(the file has: {have})")
        values = np.asarray(column)
        if values.dtype.kind == "f" and not np.array_equal(values, np.round(values)):
            raise SampleError(str(path), f"point labels '{self.point_labels}' are not integers")
        return values.astype(np.int32)

    def fields(self, record: dict[str, np.ndarray]) -> dict[str, Field]:
        fields = {name: Field(str(value.dtype), tuple(value.shape)) for name, value in record.items()}
        if VARIANT_CHECKSUMS in fields:  # declared, so that readers check variants by them
            fields[VARIANT_CHECKSUMS] = Field(fields[VARIANT_CHECKSUMS].dtype,
                                              fields[VARIANT_CHECKSUMS].shape,
                                              checks_entries_of=self._entry_checks(record).entries_of)
        return fields

    def observe(self, record: dict[str, np.ndarray]) -> None:
        total, valid = int(record["num_points"]), int(record["num_valid"])
        self.num_points.append(total)
        if valid < total:
            self.counts["clouds_with_nonfinite"] += 1
            self.counts["nonfinite_points_dropped"] += total - valid
        if valid < self.spec.points:
            key = "clouds_padded" if self.spec.fewer == "pad" else "clouds_with_replacement"
            self.counts[key] += 1

    def options(self) -> dict[str, Any]:
        s = self.spec
        return {"labels": labelling.recorded(self.labels_path, self.root),
                "fields": self.field_names, "points": s.points, "variants": s.variants,
                "sampling": s.method, "voxel_size": s.voxel_size, "seed": s.seed,
                "normalize": s.normalize, "dtype": s.dtype, "fewer": s.fewer,
                "point_labels": self.point_labels, "variant_order": self.variant_order}

    def describe(self) -> dict[str, Any]:
        columns = [c for f in self.field_names for c in pointfiles.columns_of(f)]
        s = self.spec
        return {
            "source": {"path": str(self.root), "layout": labelling.layout(self._files(),
                                                                          self.labels_path),
                       "labels": str(self.labels_path) if self.labels_path else None},
            "options": {**self.options(), "columns": columns},
            "extra": {**self.counts, "num_points": self.num_points,
                      "coordinates": COORDINATES[s.normalize],
                      **({"precision": self.precision} if self.precision else {})},
        }


def variant_of(indices: np.ndarray, manifest: Manifest, epoch: int) -> np.ndarray:
    """The stored variant each sample serves this epoch."""
    k = manifest.options.get("variants", 1)
    idx = np.asarray(indices, dtype=np.int64) % max(manifest.count, 1)
    if manifest.options.get("variant_order", "epoch") == "epoch":
        return (idx + epoch) % k
    # splitmix64 of (seed, epoch, index): reproducible, independent of batch composition
    with np.errstate(over="ignore"):
        x = (idx.astype(np.uint64) + np.uint64(epoch) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(manifest.options.get("seed", 0)) * np.uint64(0xD1B54A32D192ED03))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(k)).astype(np.int64)


VARIANT_FIELDS = ("points", "point_labels", "mask")
VARIANT_CHECKSUMS = "variant_checksums"


def select(manifest: Manifest, indices: np.ndarray, epoch: int) -> dict[str, np.ndarray]:
    """The variant each sample serves this epoch, for every per-variant field: the container
    then reads one of the K stored variants instead of all of them."""
    variant = variant_of(indices, manifest, epoch)
    return {name: variant for name in VARIANT_FIELDS if name in manifest.fields}


SOURCE = PointCloudSource
