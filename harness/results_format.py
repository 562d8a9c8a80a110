"""The results format every package may read: results.json's schema version and reader
(its shape and numbers checked), study.json's schema version, the config keys left out of a
job's identity, and where a run directory keeps earlier runs' outputs. Imports nothing of the
project but ``harness.errors`` and ``harness.fileio`` (``pagebench.reports`` and the gate
read results through it; the run room writes them: ``harness.run.results``)."""

from __future__ import annotations

from pathlib import Path

from harness.errors import InputError, OutputError
from harness.fileio import read_json

SCHEMA_VERSION = 1
STUDY_SCHEMA_VERSION = 1  # of study.json (harness.studies writes it, pagebench.reports.paper_section reads it)


def read_results(path: Path) -> dict:
    """Load a results.json, checking it is one this version understands."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    data = read_json(path, "results file not found; pass a run directory or its results.json")
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError("not a pagebench results file (no schema_version)", path=str(path))
    if data["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"schema_version {data['schema_version']} is not supported (this pagebench reads "
            f"{SCHEMA_VERSION}); re-run or re-render with the matching version", path=str(path))
    for key in ("systems", "workload"):
        if key not in data:
            raise InputError(f"missing key {key!r}", path=str(path), field=key)
        if not isinstance(data[key], dict):
            raise InputError(f"must be a mapping, got {type(data[key]).__name__}",
                             path=str(path), field=key)
    for name, summary in data["systems"].items():
        if not name or name.strip(".") == "" or any(c in name for c in "/\\\0"):
            raise InputError("not a system name (its tables are steps_<name>.csv beside it: no "
                             "path separators)", path=str(path), field=f"systems.{name}")
        if not isinstance(summary, dict) or not isinstance(summary.get("memory"), dict):
            raise InputError("must be a mapping with a 'memory' summary", path=str(path),
                             field=f"systems.{name}")
    check_result_shape(data, path)
    check_result_numbers(data, path)
    return data


# What every system's summary holds (``harness.run.serve``), which the report and the gate
# read: each key a mapping holding these keys (None: a figure).
RESULT_SYSTEM_KEYS = {
    "memory": ("token_states_pct", "reserved_pct", "internal_fragmentation_pct",
               "external_fragmentation_pct", "idle_pct"),
    "requests": ("finished", "rejected", "unfinished"),
    "throughput": ("requests_per_s", "output_tokens_per_s"),
    "latency": ("ttft_s", "e2e_s"),
    "batch": ("mean_seqs",),
    "preemptions": None,
}
# Keys that, where present, hold a mapping (a system's ``latency.<metric>`` too).
RESULT_MAPPINGS = ("model", "hardware", "allocator", "prefix_cache",
                   "time_by_phase_s", "layer_groups", "offload", "cost_model")


def check_result_shape(data: dict, path: Path) -> None:
    """``InputError`` naming the first key of a results.json's systems that is missing, or
    holds something other than a mapping where a mapping belongs."""
    def mapping(value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise InputError(f"must be a mapping, got {type(value).__name__}", path=str(path),
                             field=field)
        return value

    for key in ("model", "hardware"):
        if key in data:
            mapping(data[key], key)
    for name, summary in data["systems"].items():
        for key, inner in RESULT_SYSTEM_KEYS.items():
            where = f"systems.{name}.{key}"
            if key not in summary:
                raise InputError("missing (every system's summary has it)", path=str(path),
                                 field=where)
            for part in inner or ():
                if part not in mapping(summary[key], where):
                    raise InputError("missing (every system's summary has it)", path=str(path),
                                     field=f"{where}.{part}")
        for metric, figures in summary["latency"].items():
            if figures is not None:
                mapping(figures, f"systems.{name}.latency.{metric}")
        for key in RESULT_MAPPINGS:
            for holder, where in ((summary, f"systems.{name}"),
                                  (summary["memory"], f"systems.{name}.memory")):
                if key in holder:
                    mapping(holder[key], f"{where}.{key}")


# The figures of a results.json (dotted paths; ``*`` a system's name, ``**`` any depth
# below): each is a finite number or null. A received file that holds text, a boolean or
# an Infinity there is refused in one line naming the field, before a report formats it
# (``f"{x:,}"`` of a string) or the gate compares it (``True`` as 1, ``Infinity`` as
# "improved"). Text keys below them (a layer group's ``kind``) may hold text.
RESULT_NUMBERS = ("block_size", "capacity_slots", "seed", "workload.prompt_len.**",
                  "workload.output_len.**", "workload.num_requests", "workload.total_*",
                  "workload.arrival_span_s", "workload.mean_rate_rps", "model.num_params",
                  "model.active_params", "model.bytes_per_slot", "model.max_model_len",
                  "hardware.memory_gib", "hardware.hbm_bandwidth_gbps",
                  "hardware.peak_fp16_tflops", "systems.*.slot_bytes",
                  "systems.*.sharing_savings_pct", "systems.*.simulated_time_s",
                  *(f"systems.*.{part}.**" for part in (
                      "memory", "latency", "throughput", "batch", "steps", "time_by_phase_s",
                      "requests", "preemptions", "swaps", "prefix_cache", "offload",
                      "layer_groups")))
RESULT_TEXT_KEYS = ("kind", "name", "label", "mode", "source", "note", "unit")


def check_result_numbers(data: dict, path: Path) -> None:
    """``InputError`` naming the first field of ``RESULT_NUMBERS`` in ``data`` (a results.json
    read from ``path``) that is not a finite number or null."""
    import math
    import re

    def compiled(pattern: str) -> re.Pattern:
        """``*`` is one key (no dot), a final ``.**`` the key and everything below it."""
        below = pattern.endswith(".**")
        keys = pattern[:-3] if below else pattern
        body = r"\.".join(re.escape(key).replace(r"\*", r"[^.\[]*") for key in keys.split("."))
        return re.compile(body + (r"(?:[.\[].*)?" if below else r"(?:\[.*)?") + r"\Z")

    patterns = [compiled(pattern) for pattern in RESULT_NUMBERS]
    todo: list[tuple[str, Any]] = [(str(key), value) for key, value in data.items()]
    while todo:
        where, value = todo.pop()
        if isinstance(value, dict):
            todo += [(f"{where}.{key}", item) for key, item in value.items()]
            continue
        if isinstance(value, list):
            todo += [(f"{where}[{i}]", item) for i, item in enumerate(value)]
            continue
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value)):
            continue
        leaf = where.rsplit(".", 1)[-1].split("[", 1)[0]
        if isinstance(value, str) and leaf in RESULT_TEXT_KEYS:
            continue
        if any(pattern.match(where) for pattern in patterns):
            shown = repr(value) if not isinstance(value, str) else repr(value[:40])
            raise InputError(f"must be a finite number or null, got {shown}", path=str(path),
                             field=where)


# Config keys that cannot change results (they are left out of the hash): how a run is
# shown, spread over processes and reported, not what it computes.
DISPLAY_ONLY_KEYS = ("progress", "jobs", "report")
PREVIOUS_DIR = "previous"


def next_previous_dir(out_dir: Path) -> Path:
    """``out_dir/previous/<n>``, the first n = 1, 2, ... that is free; an ``OutputError``
    when ``previous`` is there but not a directory."""
    previous = Path(out_dir) / PREVIOUS_DIR
    if previous.exists() and not previous.is_dir():
        raise OutputError(f"{previous}: is a file; pagebench moves earlier runs' outputs into "
                          f"a directory of that name: move the file away")
    n = 1
    while (previous / str(n)).exists():
        n += 1
    return previous / str(n)
