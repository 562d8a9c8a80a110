"""The gate's report: a plain-text table per job, and gate.json / gate.md."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.gate.compare import FAILING, Row
from harness.fileio import atomic_write_text, write_json


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _fmt_delta(row: Row) -> str:
    if row.delta is None:
        return "-"
    text = f"{row.delta:+.4g}"
    if isinstance(row.baseline, (int, float)) and row.baseline:
        text += f" ({row.delta / abs(row.baseline):+.2%})"
    return text


HEADER = ("metric", "baseline", "current", "delta", "rule", "verdict")


def _cells(row: Row) -> tuple[str, ...]:
    return (row.metric, _fmt(row.baseline), _fmt(row.current), _fmt_delta(row), row.rule,
            row.verdict)


def _by_job(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.job, []).append(row)
    return groups


def table_lines(rows: list[Row]) -> list[str]:
    """A plain-text table per job, columns aligned across jobs."""
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]

    def line(c: tuple[str, ...]) -> str:
        return "  " + "  ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))).rstrip()

    lines: list[str] = []
    for job, group in _by_job(rows).items():
        lines += [f"{job}:", line(HEADER), "  " + "  ".join("-" * w for w in widths)]
        lines += [line(_cells(r)) for r in group]
    return lines


def markdown(rows: list[Row], passed: bool) -> str:
    """The report as markdown: failing rows first, then one table per job."""
    failing = [r for r in rows if r.verdict in FAILING]
    out = [f"## pagebench gate: {'PASS' if passed else 'FAIL'}", "",
           f"{len(rows)} checks over {len(_by_job(rows))} jobs, {len(failing)} failing, "
           f"{sum(r.verdict == 'improved' for r in rows)} improved.", ""]
    sections = ([("Failing", failing)] if failing else []) + list(_by_job(rows).items())
    for title, group in sections:
        out += [f"### {title}", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        for r in group:
            metric, *rest = _cells(r)
            if title == "Failing":
                metric = f"{r.job}: {metric}"
            verdict = f"**{r.verdict}**" if r.verdict in FAILING else r.verdict
            out.append("| " + " | ".join([f"`{metric}`", *rest[:-1], verdict]) + " |")
        out.append("")
    return "\n".join(out)


def write_report(rows: list[Row], passed: bool, out_dir: Path) -> None:
    write_json(out_dir / "gate.json", {"passed": passed, "rows": [asdict(r) for r in rows]})
    atomic_write_text(out_dir / "gate.md", markdown(rows, passed))
