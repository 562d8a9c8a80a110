"""The report's layer-group tables: what a hybrid KV manager (results.json's
``layer_groups``) holds per layer kind, and every system's KV bytes side by side, so a
run shows what the hybrid manager saves and what its page unification costs."""

from __future__ import annotations

from pagebench.reports.html import esc, fmt, table

GIB = 2**30


def kv_bytes_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    """Per system: its slot, pool, and the time-averaged bytes of token states, allocated
    memory and page padding (slots x ``slot_bytes``)."""
    header = ["system", "slot (bytes)", "pool (GiB)", "token states (GiB)", "allocated (GiB)",
              "allocated per running sequence (GiB)", "page padding (GiB)",
              "page padding % of allocated"]
    rows = []
    for name, s in systems.items():
        m, unit = s["memory"], s.get("slot_bytes")
        if unit is None or m.get("mean_slots") is None:
            continue
        pool = m["capacity_slots"] * unit
        allocated = pool * (m.get("block_level_usage_pct") or 0.0) / 100.0
        padding = (m["mean_slots"].get("internal_page_padding") or 0.0) * unit
        batch = (s.get("batch") or {}).get("mean_seqs")
        rows.append([name, unit, pool / GIB, m["mean_slots"]["token_states"] * unit / GIB,
                     allocated / GIB, allocated / batch / GIB if batch else None, padding / GIB,
                     100.0 * padding / allocated if allocated else None])
    return header, rows


def group_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    """One row per layer kind of each system that reports ``layer_groups``."""
    header = ["system", "kind", "KV cache groups", "layers (+ padding)", "tokens per block",
              "window", "peak blocks", "mean blocks", "blocks freed by the window",
              "prefix-hit blocks"]
    rows = []
    for name, s in systems.items():
        for k in (s.get("layer_groups") or {}).get("kinds", ()):
            layers = f"{k['layers']}" + (f" + {k['padding_layers']}" if k["padding_layers"] else "")
            rows.append([name, k["kind"], k["kv_cache_groups"], layers, k["tokens_per_block"],
                         k["window"], k["peak_blocks"], k["mean_blocks"],
                         k["window_freed_blocks"], k["prefix_hit_blocks"]])
    return header, rows


def _count(value) -> str:
    """A whole number with thousands separators; anything else as it is (escaped by the
    caller: a received file may hold text there)."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def layer_group_parts(systems: dict[str, dict]) -> list[str]:
    """The tables and a sentence per hybrid system against ``paged``; nothing when no
    system keeps layer groups."""
    hybrids = {n: s for n, s in systems.items() if s.get("layer_groups")}
    if not hybrids:
        return []
    parts = ["<h3>Layer groups and page unification</h3>"]
    base = systems.get("paged")
    bytes_header, bytes_rows = kv_bytes_rows(systems)
    per_seq = {row[0]: row[5] for row in bytes_rows}
    for name, s in hybrids.items():
        lay = s["layer_groups"]
        text = (f"{esc(name)}: KV cache groups of {esc(lay['group_size'])} layers, pages of "
                f"{esc(_count(lay['page_bytes']))} bytes ({esc(_count(lay['num_pages']))} of "
                f"them), attention blocks of {esc(lay['attention_block_size'])} tokens, one slot "
                f"= {esc(_count(s['slot_bytes']))} bytes")
        if base is not None and per_seq.get("paged") and per_seq.get(name):
            text += (f"; a running sequence holds {fmt(per_seq[name])} GiB of KV on average "
                     f"against paged's {fmt(per_seq['paged'])} GiB "
                     f"({fmt(per_seq['paged'] / per_seq[name])}x less)")
        text += f"; page padding takes {fmt(s['memory'].get('internal_page_padding_pct'))}% of its pool"
        parts.append(f"<p class='layer-groups'>{text}.</p>")
    header, rows = group_rows(hybrids)
    parts.append(table(header, rows, text_columns=(0, 1, 3), css_id="layer-group-table"))
    parts.append(table(bytes_header, bytes_rows, text_columns=(0,), digits=3,
                       css_id="kv-bytes-table"))
    return parts
