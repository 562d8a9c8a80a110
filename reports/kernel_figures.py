"""Figures of the kernel benchmark (``pagebench.kernels.benchmark`` results) for the HTML report.

``kernel_figures(results)`` returns three (matplotlib Figure, caption) pairs, one subplot per head config:

1. decode latency vs context length (paged solid, contiguous dashed, SDPA dotted), at
   block size 16 (or the sweep's block size closest to it);
2. achieved bandwidth of the paged kernel vs block size, with the contiguous kernel and
   the device's measured copy bandwidth as references, at the longest context;
3. paged / contiguous time vs block size, one line per (batch, context).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, no global backend), so
they are safe in a headless run; CPU results say "CPU timings" in every title. Each
figure's legend sits outside its panels, on the right, so it never covers a line.
"""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.figure import Figure

SUBPLOT_W, SUBPLOT_H = 5.2, 3.9
LEGEND_W = 1.9  # inches right of the panels for the legend


def _rows(results: dict, **match) -> list[dict]:
    return [r for r in results.get("rows", []) if all(r.get(k) == v for k, v in match.items())]


def _sorted_unique(values: Iterable) -> list:
    return sorted({v for v in values if v is not None})


def _axes(n: int, title: str, results: dict) -> tuple[Figure, list]:
    fig = Figure(figsize=(SUBPLOT_W * max(n, 1) + LEGEND_W, SUBPLOT_H), layout="constrained")
    axes = fig.subplots(1, max(n, 1), squeeze=False)[0]
    fig.suptitle(f"{title}\n{_timing_label(results)}", fontsize=10)
    return fig, list(axes)


def _log2_ticks(ax, values: list) -> None:
    """Log-2 x axis labelled with the swept values themselves (16, not 2^4)."""
    ax.set_xscale("log", base=2)
    if values:
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()


def _timing_label(results: dict) -> str:
    dev = results.get("device", {}).get("name", "?")
    kind = "CPU timings" if results.get("timings") == "cpu" else "GPU timings"
    return f"{kind}, {dev}, {results.get('date', '')[:10]}"


def _main_dtype(results: dict) -> str | None:
    dtypes = _sorted_unique(r.get("dtype") for r in results.get("rows", []))
    return "float16" if "float16" in dtypes else (dtypes[0] if dtypes else None)


def _block_size_near_16(results: dict) -> int | None:
    sizes = _sorted_unique(r.get("block_size") for r in results.get("rows", []))
    return min(sizes, key=lambda b: (abs(b - 16), b)) if sizes else None


def latency_vs_context(results: dict) -> Figure:
    heads = _sorted_unique(r["head_config"] for r in results.get("rows", []))
    dtype, block = _main_dtype(results), _block_size_near_16(results)
    fig, axes = _axes(len(heads), f"Decode attention latency vs context (block {block}, {dtype})", results)
    for ax, head in zip(axes, heads):
        rows = _rows(results, head_config=head, dtype=dtype, block_size=block)
        for i, batch in enumerate(_sorted_unique(r["batch"] for r in rows)):
            pts = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["context_len"])
            color = f"C{i % 10}"
            for key, style, label in (("paged_ms", "-o", "paged"), ("contiguous_ms", "--s", "contiguous"),
                                      ("sdpa_ms", ":^", "SDPA")):
                xy = [(r["context_len"], r[key]) for r in pts if r.get(key) is not None]
                if xy:
                    ax.plot(*zip(*xy), style, color=color, markersize=4, label=f"{label}, batch {batch}")
        _log2_ticks(ax, _sorted_unique(r["context_len"] for r in rows))
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(head)
        ax.grid(True, which="both", alpha=0.3)
    _legend_outside(fig, axes)
    return fig


def _legend_outside(fig: Figure, axes: list) -> None:
    """One legend for the figure, right of its panels (the panels share their labels)."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=7)


def bandwidth_vs_block_size(results: dict) -> Figure:
    heads = _sorted_unique(r["head_config"] for r in results.get("rows", []))
    dtype = _main_dtype(results)
    copy_bw = results.get("copy_bandwidth_GBps")
    fig, axes = _axes(len(heads), f"Achieved bandwidth vs block size ({dtype})", results)
    for ax, head in zip(axes, heads):
        rows = _rows(results, head_config=head, dtype=dtype)
        context = max((r["context_len"] for r in rows), default=None)
        rows = [r for r in rows if r["context_len"] == context]
        for i, batch in enumerate(_sorted_unique(r["batch"] for r in rows)):
            pts = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["block_size"])
            color = f"C{i % 10}"
            xy = [(r["block_size"], r["paged_GBps"]) for r in pts if r.get("paged_GBps") is not None]
            if xy:
                ax.plot(*zip(*xy), "-o", color=color, markersize=4, label=f"paged, batch {batch}")
            contig = [r["contiguous_GBps"] for r in pts if r.get("contiguous_GBps") is not None]
            if contig:
                ax.axhline(contig[0], color=color, linestyle="--", linewidth=1, label=f"contiguous, batch {batch}")
        if copy_bw:
            ax.axhline(copy_bw, color="black", linestyle=":", label=f"copy bandwidth ({copy_bw:.0f} GB/s)")
        _log2_ticks(ax, _sorted_unique(r["block_size"] for r in rows))
        ax.set_xlabel("block size (tokens per block)")
        ax.set_ylabel("achieved bandwidth (GB/s)")
        ax.set_title(f"{head}, context {context}")
        ax.grid(True, which="both", alpha=0.3)
    _legend_outside(fig, axes)
    return fig


def ratio_vs_block_size(results: dict) -> Figure:
    heads = _sorted_unique(r["head_config"] for r in results.get("rows", []))
    dtype = _main_dtype(results)
    fig, axes = _axes(len(heads), f"Paged / contiguous time vs block size ({dtype})", results)
    for ax, head in zip(axes, heads):
        rows = _rows(results, head_config=head, dtype=dtype)
        keys = sorted({(r["batch"], r["context_len"]) for r in rows})
        for i, (batch, context) in enumerate(keys):
            pts = sorted((r for r in rows if (r["batch"], r["context_len"]) == (batch, context)),
                         key=lambda r: r["block_size"])
            xy = [(r["block_size"], r["paged_over_contiguous"]) for r in pts
                  if r.get("paged_over_contiguous") is not None]
            if xy:
                ax.plot(*zip(*xy), "-o", color=f"C{i % 10}", markersize=3,
                        label=f"batch {batch}, context {context}")
        ax.axhline(1.0, color="black", linewidth=1)
        _log2_ticks(ax, _sorted_unique(r["block_size"] for r in rows))
        ax.set_xlabel("block size (tokens per block)")
        ax.set_ylabel("paged time / contiguous time (ratio)")
        ax.set_title(head)
        ax.grid(True, which="both", alpha=0.3)
    _legend_outside(fig, axes)
    return fig


def kernel_figures(results: dict) -> list[tuple[Figure, str]]:
    """Latency vs context, bandwidth vs block size, paged/contiguous ratio vs block size,
    each with its caption (which says what was timed: the Triton kernels on a GPU, torch's
    reference paths on a CPU)."""
    timed = _what_was_timed(results)
    return [
        (latency_vs_context(results), f"Decode attention time per call against context length. "
         f"{timed} SDPA is torch's scaled_dot_product_attention on the contiguous cache."),
        (bandwidth_vs_block_size(results), "Bytes of K and V the paged path must read, per second, "
         f"against block size at the longest context; dashed: the contiguous path, dotted: the "
         f"device's copy bandwidth measured in the same run. {timed}"),
        (ratio_vs_block_size(results), "Paged time over contiguous time against block size, one "
         f"line per batch and context: above 1 is what the block table costs. {timed}"),
    ]


def _what_was_timed(results: dict) -> str:
    if results.get("timings") == "cpu":
        return ("On this CPU, paged and contiguous are torch's reference paths (gather through "
                "the block table, then dense attention; the same attention over the contiguous "
                "cache), not the Triton kernels: the timings say nothing about the GPU kernel.")
    return ("Paged and contiguous are the Triton decode kernels, the same kernel with and without "
            "the block-table indirection.")
