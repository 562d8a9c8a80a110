"""Kernel and host profiles of the operator cost model: loaded, checked, resolved for a run.

A *kernel profile* (``conf/kernel_profile/<name>.yaml``) gives decode attention's
bandwidth efficiency: the fraction of the device's memory bandwidth the kernel reaches
while it reads the KV cache, by layout (paged / contiguous), block size, batch, mean
context and head config (GQA group = heads per KV head, head dim, dtype). Either a table
in the YAML (``points``; a key left out holds for every value of it) or, with ``source:
kernel_results``, the rows of the project's own kernel benchmark (``kernel_results.json``
of ``python -m harness experiment=kernels``): efficiency = ``paged_frac_copy_bw`` (or
``contiguous_frac_copy_bw``), the achieved bandwidth over the copy bandwidth measured in
the same run. In results with ``kernel_timing: cuda_graph`` (issue 33) those come from
CUDA-graph-timed calls, as the engine replays graphs; older CUDA results (no
``kernel_timing``, e.g. benchmarks/gpu/2026-12-04-h200) are eager, event-timed figures that
include the wrapper's host time below ~0.3 ms a call. CPU results (``timings: cpu``) time
this host.

A *host profile* (``conf/host_profile/<name>.yaml``) gives the host's work per step and per
scheduled sequence (scheduling, input preparation, sampling, output processing).

Bad files are a ``ConfigError`` naming the file and the field. ``load_*`` are cached: the
executor of every system reads the same profiles.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from harness.config.conf_tree import CONF_DIR
from harness.errors import ConfigError
from harness.fileio import read_json

LAYOUTS = ("paged", "contiguous")
# Keys a point may give; those left out hold for any value.
SHAPE_KEYS = ("block_size", "batch", "context_len", "gqa_group", "head_dim", "dtype")


@dataclass(frozen=True)
class KernelPoint:
    layout: str
    efficiency: float
    block_size: int | None = None
    batch: int | None = None
    context_len: int | None = None
    gqa_group: int | None = None
    head_dim: int | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class KernelProfile:
    name: str
    where: str  # the file, for messages
    points: tuple[KernelPoint, ...]
    # "exact": a run whose head config (GQA group, head dim, dtype) the profile did not measure
    # is refused; "nearest": it takes the nearest measured config (the profile's YAML says so,
    # e.g. a hardware profile's default, which every model preset must be able to run on)
    head_configs: str = "exact"


@dataclass(frozen=True)
class HostProfile:
    """Host seconds per step and per scheduled sequence (the sums of the components)."""

    name: str
    per_step_s: float
    per_seq_s: float


def _resolve_path(name: str, group: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return path
    return CONF_DIR / group / f"{name}.yaml"


def profile_files(name: str, group: str, kernel_results: str | None = None) -> list[Path]:
    """The files the profile ``name`` of ``group`` (``kernel_profile`` / ``host_profile``)
    reads, resolved as ``load_*`` resolves them: its YAML and, for a ``source:
    kernel_results`` kernel profile, the benchmark rows it takes (``kernel_results``, else
    the YAML's ``path``). For a run's identity (``harness.run.job_identity``); a file that is
    not there is left out (the loader reports it)."""
    path = _resolve_path(name, group)
    files = [path] if path.is_file() else []
    if files and group == "kernel_profile":
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return files  # the loader names what is wrong with it
        if isinstance(data, dict) and data.get("source") == "kernel_results":
            results = Path(kernel_results or data.get("path") or "kernel_results.json")
            files += [results] if results.is_file() else []
    return files


def _read_yaml(path: Path, what: str) -> dict:
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        raise ConfigError(f"{what}: no profile {path}" + (f"; known: {', '.join(known)}" if known else ""))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of the profile's keys")
    return data


def _number(value, where: str, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(f"{where}: must be a finite number {'> 0' if positive else '>= 0'}, "
                          f"got {value!r}")
    return float(value)


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: must be a positive integer, got {value!r}")
    return value


@lru_cache(maxsize=32)
def load_host_profile(name: str) -> HostProfile:
    """The host profile ``name`` (conf/host_profile/) or at path ``name``."""
    path = _resolve_path(name, "host_profile")
    data = _read_yaml(path, "engine.cost.host_profile")
    components = data.get("components")
    if not isinstance(components, dict) or not components:
        raise ConfigError(f"{path}: components: must map each host task to its per_step_s and "
                          "per_seq_s")
    step = seq = 0.0
    for task, costs in components.items():
        if not isinstance(costs, dict):
            raise ConfigError(f"{path}: components.{task}: must give per_step_s and per_seq_s")
        step += _number(costs.get("per_step_s"), f"{path}: components.{task}.per_step_s")
        seq += _number(costs.get("per_seq_s"), f"{path}: components.{task}.per_seq_s")
    return HostProfile(str(data.get("name", path.stem)), step, seq)


@lru_cache(maxsize=32)
def load_kernel_profile(name: str, kernel_results: str | None = None) -> KernelProfile:
    """The kernel profile ``name`` (conf/kernel_profile/) or at path ``name``; a ``source:
    kernel_results`` one reads ``kernel_results`` (or the file its ``path`` names)."""
    path = _resolve_path(name, "kernel_profile")
    data = _read_yaml(path, "engine.cost.kernel_profile")
    if data.get("source") == "kernel_results":
        results = Path(kernel_results or data.get("path") or "kernel_results.json")
        return KernelProfile(str(data.get("name", path.stem)), str(results),
                             _points_from_kernel_results(results))
    reference = data.get("reference_bandwidth_gbps")
    head_configs = data.get("head_configs", "exact")
    if head_configs not in ("exact", "nearest"):
        raise ConfigError(f"{path}: head_configs: must be exact or nearest, got {head_configs!r}")
    raw = data.get("points")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: points: must list the profile's measured points")
    points = []
    for i, point in enumerate(raw):
        where = f"{path}: points[{i}]"
        if not isinstance(point, dict):
            raise ConfigError(f"{where}: must be a mapping")
        layout = point.get("layout")
        if layout not in LAYOUTS:
            raise ConfigError(f"{where}.layout: must be paged or contiguous, got {layout!r}")
        if "efficiency" in point:
            efficiency = _number(point["efficiency"], f"{where}.efficiency", positive=True)
        else:
            achieved = _number(point.get("achieved_gbps"), f"{where}.achieved_gbps", positive=True)
            efficiency = achieved / _number(reference, f"{path}: reference_bandwidth_gbps",
                                            positive=True)
        shape = {key: point[key] for key in SHAPE_KEYS if point.get(key) is not None}
        for key in ("block_size", "batch", "context_len", "gqa_group", "head_dim"):
            if key in shape:
                _positive_int(shape[key], f"{where}.{key}")
        points.append(KernelPoint(layout, efficiency, **shape))
    return KernelProfile(str(data.get("name", path.stem)), str(path), tuple(points), head_configs)


def _points_from_kernel_results(path: Path) -> tuple[KernelPoint, ...]:
    """Paged and contiguous points of a kernel benchmark's rows (one contiguous point per
    head config, dtype, batch and context: it does not depend on the block size)."""
    data = read_json(path, "file not found: write it with python -m harness experiment=kernels "
                           "(or set engine.cost.kernel_results=PATH)")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{path}: rows: missing or empty (write it with python -m harness "
                          "experiment=kernels)")
    points: dict[tuple, KernelPoint] = {}
    for i, row in enumerate(rows):
        where = f"{path}: rows[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: must be an object")
        if row.get("errors"):
            continue  # a point whose kernel failed measured nothing
        heads = _positive_int(row.get("num_heads"), f"{where}.num_heads")
        kv_heads = _positive_int(row.get("num_kv_heads"), f"{where}.num_kv_heads")
        shape = dict(batch=_positive_int(row.get("batch"), f"{where}.batch"),
                     context_len=_positive_int(row.get("context_len"), f"{where}.context_len"),
                     gqa_group=heads // kv_heads,
                     head_dim=_positive_int(row.get("head_dim"), f"{where}.head_dim"),
                     dtype=row.get("dtype"))
        if not isinstance(shape["dtype"], str):
            raise ConfigError(f"{where}.dtype: must be a dtype name, got {shape['dtype']!r}")
        block = _positive_int(row.get("block_size"), f"{where}.block_size")
        for key in ("paged_ms", "contiguous_ms"):
            _number(row.get(key), f"{where}.{key}", positive=True)
        paged = _number(row.get("paged_frac_copy_bw"), f"{where}.paged_frac_copy_bw", positive=True)
        contig = _number(row.get("contiguous_frac_copy_bw"), f"{where}.contiguous_frac_copy_bw",
                         positive=True)
        points[("paged", block, *shape.values())] = KernelPoint("paged", paged, block_size=block, **shape)
        points[("contiguous", *shape.values())] = KernelPoint("contiguous", contig, **shape)
    if not points:
        raise ConfigError(f"{path}: rows: every row has errors; no point was measured")
    return tuple(points.values())


class DecodeEfficiency:
    """Decode attention's efficiency for one run's layout, block size and head config, as a
    function of (batch, mean context): bilinear between measured points, held at the edge
    beyond them (those steps are counted: ``steps_beyond``)."""

    def __init__(self, batches: list[int], curves: list[tuple[list[int], list[float]]],
                 note: str | None, ranged: bool = True) -> None:
        self.batches = batches  # ascending; curves[i] = (contexts ascending, efficiencies)
        self.curves = curves
        self.constant = curves[0][1][0] if len(batches) == 1 and len(curves[0][0]) == 1 else None
        self.note = note  # why the block size or shape was approximated, or None
        self.ranged = ranged  # False: the points hold for any batch and context
        self.steps = self.steps_beyond = 0
        self.context_range = (min(c[0][0] for c in curves), max(c[0][-1] for c in curves))

    def tally(self, batch: int, context: float) -> None:
        """Count one decode step of ``batch`` sequences at mean ``context`` that ran."""
        self.steps += 1
        if self.ranged and (batch < self.batches[0] or batch > self.batches[-1]
                            or context < self.context_range[0] or context > self.context_range[1]):
            self.steps_beyond += 1

    def __call__(self, batch: int, context: float) -> float:
        batches = self.batches
        i = bisect_right(batches, batch)
        if i == 0 or i == len(batches):
            return _interp(*self.curves[0 if i == 0 else -1], context)
        b0, b1 = batches[i - 1], batches[i]
        e0, e1 = _interp(*self.curves[i - 1], context), _interp(*self.curves[i], context)
        return e0 + (e1 - e0) * (batch - b0) / (b1 - b0)

    def report(self) -> dict:
        return {"measured_batches": [self.batches[0], self.batches[-1]],
                "measured_contexts": list(self.context_range), "steps_priced": self.steps,
                "steps_beyond_profile": self.steps_beyond, **({"note": self.note} if self.note else {})}


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    j = bisect_right(xs, x)
    if j == 0:
        return ys[0]
    if j == len(xs):
        return ys[-1]
    x0, x1 = xs[j - 1], xs[j]
    return ys[j - 1] + (ys[j] - ys[j - 1]) * (x - x0) / (x1 - x0)


def decode_efficiency(profile: KernelProfile, layout: str, block_size: int | None,
                      gqa_group: int, head_dim: int, dtype: str) -> DecodeEfficiency:
    """``profile`` resolved for a run; a ``ConfigError`` naming the nearest measured points
    when it lacks the layout or the head config."""
    mine = [p for p in profile.points if p.layout == layout]
    if not mine:
        raise ConfigError(f"{profile.where}: has no {layout} points (the run's {layout} system "
                          f"needs them); it measured {sorted({p.layout for p in profile.points})}")
    heads = [p for p in mine if p.gqa_group in (None, gqa_group) and p.head_dim in (None, head_dim)
             and p.dtype in (None, dtype)]
    note = None
    if not heads and profile.head_configs == "nearest":
        heads, note = _nearest_head_config(mine, gqa_group, head_dim, dtype)
    if not heads:
        near = sorted({(p.gqa_group, p.head_dim, p.dtype) for p in mine},
                      key=lambda h: (abs(h[0] - gqa_group), abs(h[1] - head_dim), h[2] != dtype))
        listed = ", ".join(f"group {g} head_dim {d} {t}" for g, d, t in near[:3])
        raise ConfigError(f"{profile.where}: no {layout} points for the run's head config (GQA "
                          f"group {gqa_group}, head_dim {head_dim}, {dtype}); nearest measured: "
                          f"{listed}")
    if layout == "paged":
        blocks = sorted({p.block_size for p in heads if p.block_size is not None})
        if blocks and block_size not in blocks:
            nearest = min(blocks, key=lambda b: (abs(math.log2(b) - math.log2(block_size)), b))
            below = [b for b in blocks if b < block_size]
            above = [b for b in blocks if b > block_size]
            if below and above:  # between two measured sizes: log-linear in the block size
                lo, hi = below[-1], above[0]
                w = (math.log2(block_size) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
                grid_lo, grid_hi = _grid([p for p in heads if p.block_size == lo]), \
                    _grid([p for p in heads if p.block_size == hi])
                if grid_lo[0] == grid_hi[0] and all(a[0] == b[0] for a, b in zip(grid_lo[1], grid_hi[1])):
                    curves = [(a[0], [y0 + (y1 - y0) * w for y0, y1 in zip(a[1], b[1])])
                              for a, b in zip(grid_lo[1], grid_hi[1])]
                    return DecodeEfficiency(grid_lo[0], curves, note, _ranged(heads))
            else:
                note = "; ".join(filter(None, [note, (
                    f"block size {block_size} is outside the measured {blocks[0]}-{blocks[-1]}: "
                    f"block {nearest}'s efficiency is used")]))
            heads = [p for p in heads if p.block_size == nearest]
        elif blocks:
            heads = [p for p in heads if p.block_size == block_size]
    batches, curves = _grid(heads)
    return DecodeEfficiency(batches, curves, note, _ranged(heads))


# 16-bit types move the same bytes through the same kernel: one class for the nearest match
_DTYPE_CLASS = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1}


def _nearest_head_config(points: list[KernelPoint], gqa_group: int, head_dim: int,
                         dtype: str) -> tuple[list[KernelPoint], str]:
    """The points of the measured head config nearest to the run's (GQA group, then head dim,
    on a log2 scale; then the dtype's width), and a note that says which one stands in."""
    configs = {(p.gqa_group, p.head_dim, p.dtype) for p in points}

    def distance(config: tuple) -> tuple:
        group, dim, kind = config
        return (abs(math.log2(group or gqa_group) - math.log2(gqa_group)),
                abs(math.log2(dim or head_dim) - math.log2(head_dim)),
                _DTYPE_CLASS.get(kind or dtype) != _DTYPE_CLASS.get(dtype), str(config))

    group, dim, kind = min(configs, key=distance)
    chosen = [p for p in points if (p.gqa_group, p.head_dim, p.dtype) == (group, dim, kind)]
    return chosen, (f"head config GQA group {gqa_group}, head_dim {head_dim}, {dtype} was not "
                    f"measured: the nearest measured (group {group}, head_dim {dim}, {kind}) is used")


def _ranged(points: list[KernelPoint]) -> bool:
    return any(p.batch is not None or p.context_len is not None for p in points)


def _grid(points: list[KernelPoint]) -> tuple[list[int], list[tuple[list[int], list[float]]]]:
    """Points as ascending batches, each with its ascending (contexts, efficiencies); a
    point without a batch or context holds for all (batch 1, context 1 stands for it)."""
    by_batch: dict[int, dict[int, float]] = {}
    for p in points:
        by_batch.setdefault(p.batch or 1, {})[p.context_len or 1] = p.efficiency
    batches = sorted(by_batch)
    return batches, [(sorted(by_batch[b]), [by_batch[b][c] for c in sorted(by_batch[b])])
                     for b in batches]
