"""ShareGPT-format conversations (JSON array or JSONL), as vLLM's serving benchmark reads them.

Each record is ``{"conversations": [{"from": ..., "value": text}, ...]}``. As in
vLLM, records with fewer than two turns are skipped, the first turn is the
prompt and the second the completion, whose token count is the output length.
vLLM's benchmark filters (drop prompts or outputs under 4 tokens, prompts over
1024, prompt + output over 2048) are the common ``min_input_len`` /
``min_output_len`` / ``max_input_len`` / ``max_total_len`` options; the preset
sets them. Only as many records as needed for ``num_requests`` are tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.errors import ConfigError, InputError
from harness.workloads.registry import BuildContext, Draft, register
from harness.workloads.replay import TraceRows, length_filters, replay
from harness.workloads.spec import TraceSpec
from harness.workloads.tables import detect_format, iter_records, resolve_path
from harness.workloads.tokenizers import make_tokenizer

_BATCH = 512


@dataclass(frozen=True, kw_only=True)
class ShareGPTSpec(TraceSpec):
    tokenizer: str = "approx"  # "approx" (no download) or a local HF tokenizer name/path
    shuffle: bool = False  # seeded shuffle before taking the first num_requests (vLLM samples randomly)


def _turn_text(record: object, turn: int) -> tuple[str | None, str, str]:
    """(text, field, problem): text of the given turn, or the field at fault and why."""
    if not isinstance(record, dict):
        return None, "conversations", f"expected a JSON object, got {type(record).__name__}"
    conversations = record.get("conversations")
    if not isinstance(conversations, list):
        return None, "conversations", "missing or not a list"
    item = conversations[turn] if turn < len(conversations) else None
    if not isinstance(item, dict) or not isinstance(item.get("value"), str):
        return None, f"conversations[{turn}].value", "missing or not a string"
    return item["value"], "", ""


@register("sharegpt", ShareGPTSpec)
def build_sharegpt(spec: ShareGPTSpec, ctx: BuildContext) -> list[Draft]:
    """ShareGPT JSON conversations: first turn = prompt, second = completion (lengths via a tokenizer)."""
    path = resolve_path(spec.path, ctx.where)
    fmt, gzipped = detect_format(path, spec.format, ctx.where)
    if fmt not in ("json", "jsonl"):
        raise ConfigError(f"{ctx.where}.format: sharegpt reads JSON or JSONL conversations, not {fmt}; "
                          "for a table of lengths use workload=table")
    try:
        records = list(iter_records(path, gzipped, fmt))
    except UnicodeDecodeError as err:
        raise InputError(f"not a UTF-8 text file ({err.reason})", path=str(path)) from None
    if not records:
        raise InputError("the file has no records", path=str(path))
    order = ctx.rng.permutation(len(records)) if spec.shuffle else np.arange(len(records))
    tokenizer = make_tokenizer(spec.tokenizer, ctx.where)
    lines, index, input_len, output_len = [], [], [], []
    accepted = 0
    for lo in range(0, len(order), _BATCH):
        batch = []
        for i in order[lo:lo + _BATCH].tolist():
            line, record, error = records[i]
            ctx.tally.rows_read += 1
            if error is None and isinstance(record, dict) and isinstance(record.get("conversations"), list) \
                    and len(record["conversations"]) < 2:
                ctx.tally.filtered["fewer than 2 turns"] += 1
                continue
            prompt, field, problem = _turn_text(record, 0) if error is None else (None, None, error)
            completion = None
            if prompt is not None:
                completion, field, problem = _turn_text(record, 1)
            if prompt is None or completion is None:
                if spec.on_error == "raise":
                    raise InputError(f"{problem} (fix the record, or set workload.on_error=skip)",
                                     path=str(path), line=line, field=field)
                ctx.tally.skipped[f"{field}: {problem}" if field else problem] += 1
                continue
            batch.append((i, line, prompt, completion))
        if not batch:
            continue
        prompt_counts = tokenizer.count([b[2] for b in batch])
        completion_counts = tokenizer.count([b[3] for b in batch])
        rows = TraceRows(path=str(path), lines=np.array([b[1] for b in batch], dtype=np.int64),
                         index=np.array([b[0] for b in batch], dtype=np.int64),
                         input_len=np.array(prompt_counts, dtype=np.int64),
                         output_len=np.array(completion_counts, dtype=np.int64))
        rows = rows.drop((rows.input_len < 1) | (rows.output_len < 1), "empty prompt or completion", ctx)
        rows = length_filters(rows, spec, ctx)
        lines.append(rows.lines)
        index.append(rows.index)
        input_len.append(rows.input_len)
        output_len.append(rows.output_len)
        accepted += len(rows)
        if spec.num_requests is not None and accepted >= spec.num_requests:
            break
    rows = TraceRows(path=str(path), lines=np.concatenate(lines or [np.empty(0, np.int64)]),
                     index=np.concatenate(index or [np.empty(0, np.int64)]),
                     input_len=np.concatenate(input_len or [np.empty(0, np.int64)]),
                     output_len=np.concatenate(output_len or [np.empty(0, np.int64)]))
    return replay(rows, spec, ctx)
