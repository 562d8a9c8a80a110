"""The PagedAttention-paper section of a study's report: figure, measured vs published, causes.

``render_study_report(run_dir)`` reads ``study.json`` (written by ``harness.studies``)
and ``reports/paper_values.yaml`` (the published values) and writes ``report.html``:
the measured figure drawn like the paper's (published values beside the measured
ones where the paper prints them), a table of published vs measured values with the
difference, and a sentence for each material difference.

    python -m pagebench.reports.paper_section <study run dir> [...]              # re-render
    python -m pagebench.reports.paper_section --markdown <study run dirs>        # docs/paper.md table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.fileio import atomic_write_text
from pagebench.reports import figures as F
from pagebench.reports.html import esc, figure, fmt, page, table
from pagebench.reports.paper_figures import FIGURES, PAPER_LABELS

PAPER_VALUES = Path(__file__).with_name("paper_values.yaml")


def load_paper_values(path: Path = PAPER_VALUES) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


# ------------------------------------------------------------------ comparison rows

def compare(entry: dict, measured: Any, material: dict) -> dict:
    """Published vs measured for one value: the difference and whether it is material."""
    published, how = entry["published"], entry.get("how", "label")
    out = {"published": published, "measured": measured, "diff": None, "rel": None,
           "material": None}
    if measured is None:
        return out
    if how == "set":
        same = set(published) == set(measured)
        out["diff"] = "same set" if same else (
            f"missing {sorted(set(published) - set(measured))}, extra {sorted(set(measured) - set(published))}")
        out["material"] = not same
        return out
    if how == "range":
        lo, hi = published
        diff = 0.0 if lo <= measured <= hi else (measured - hi if measured > hi else measured - lo)
        ref = hi if measured > hi else lo
    else:
        diff, ref = measured - float(published), float(published)
    out["diff"] = diff
    out["rel"] = diff / ref if ref else None
    limit = max(float(material.get("abs", 0.0)), float(material.get("rel", 0.0)) * abs(ref))
    out["material"] = abs(diff) > limit + 1e-12
    return out


def cause_for(ident: str, causes: dict) -> str | None:
    """The cause sentence for ``ident``: an exact key, else the longest matching id prefix."""
    if ident in causes:
        return causes[ident]
    best = None
    for key in causes:
        if ident.startswith(key + ".") or ident.startswith(key + "/"):
            if best is None or len(key) > len(best):
                best = key
    return causes[best] if best else None


def comparison_rows(study: dict, spec: dict) -> list[dict]:
    measured = study.get("measured", {})
    rows = []
    for entry in spec.get("values", []):
        row = compare(entry, measured.get(entry["id"]), spec.get("material", {}))
        row.update(id=entry["id"], system=entry.get("system"), quantity=entry["quantity"],
                   how=entry.get("how", "label"), quote=entry.get("quote"))
        rows.append(row)
    return rows


def _show(value: Any, digits: int = 2) -> str:
    if isinstance(value, list):
        if len(value) == 2 and all(isinstance(v, (int, float)) for v in value) and \
                not all(isinstance(v, int) for v in value):
            return f"{value[0]:g}–{value[1]:g}"
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, float):
        return fmt(value, digits)
    return fmt(value) if value is not None else "–"


def comparison_table(rows: list[dict], unit: str) -> str:
    header = ["system", "quantity", f"published ({unit})", "how read", f"measured ({unit})",
              "difference", "material"]
    body = []
    for r in rows:
        diff = r["diff"]
        if isinstance(diff, float):
            rel = f" ({100 * r['rel']:+.0f}%)" if r["rel"] is not None and r["how"] != "range" else ""
            diff_text = f"{diff:+.2f}{rel}" if r["how"] != "range" or diff else "inside range"
        else:
            diff_text = diff if diff is not None else "–"
        verdict = {True: "yes", False: "no", None: "not measured"}[r["material"]]
        body.append([PAPER_LABELS.get(r["system"], r["system"] or ""), r["quantity"],
                     _show(r["published"]), r["how"], _show(r["measured"]), diff_text, verdict])
    return table(header, body, text_columns=(0, 1, 3, 5, 6))


# ------------------------------------------------------------------------- details

def details_table(study: dict) -> str | None:
    """Study-specific measured details (sustained rates, waiting shares, token-level savings...)."""
    name = study["study"]
    if name in ("vllm_fig12", "shared_prefix"):
        rows = []
        for panel, systems in (study.get("sustained") or {}).items():
            for system, s in systems.items():
                bracket = (f"{s['lo']:g}–{s['hi']:g}" if s.get("lo") is not None and s.get("hi") is not None
                           else "not reached" if not s.get("bounded") else "below the grid")
                rows.append([panel, PAPER_LABELS.get(system, system), s.get("rate"), bracket])
        return table(["panel", "system", "sustained rate (req/s)", "between grid rates"], rows,
                     text_columns=(0, 1, 3))
    details = study.get("details")
    if not details:
        return None
    keys = sorted({k for d in details.values() for k in d})
    rows = [[ident] + [d.get(k) for k in keys] for ident, d in details.items()]
    return table(["run"] + keys, rows, text_columns=(0,))


def causes_list(rows: list[dict], spec: dict, scale: float = 1.0) -> str:
    causes = spec.get("causes") or {}
    items = []
    for r in rows:
        if not r["material"]:
            continue
        text = cause_for(r["id"], causes)
        label = f"{PAPER_LABELS.get(r['system'], r['system'])}, {r['quantity']}"
        items.append(f"<li><b>{esc(label)}</b>: "
                     + (esc(text) if text else "<i>no cause recorded in reports/paper_values.yaml</i>")
                     + "</li>")
    general = spec.get("notes")
    parts = []
    if items:
        parts.append("<h4>Material differences and their likely causes</h4><ul>" + "".join(items) + "</ul>")
        if scale != 1.0:  # the sentences quote figures of the full-size study
            parts.append(f"<p class='note'>This run is scaled (study.scale={scale:g}); the causes "
                         "were written for the full-size study, so the figures they quote may "
                         "differ from the table above.</p>")
    else:
        parts.append("<p>No material difference from the published values.</p>")
    if general:
        parts.append(f"<p class='note'>{esc(general)}</p>")
    return "\n".join(parts)


def _setup_text(study: dict) -> str:
    """The study's setup and timing lines. Every value is escaped (``fmt`` escapes text): a
    received study.json may hold anything in any field."""
    setup, params = study.get("setup", {}), study.get("params", {})
    engine = setup.get("engine", {})
    model, hw = setup.get("model", {}), setup.get("hardware", {})
    bits = [f"model <b>{esc(model.get('name'))}</b>", f"hardware <b>{esc(hw.get('name'))}</b>",
            f"KV capacity <b>{fmt(engine.get('kv_capacity_slots'))}</b> slots",
            f"max length {fmt(engine.get('max_model_len'))}",
            f"max_num_seqs {fmt(engine.get('max_num_seqs'))}, max_num_batched_tokens "
            f"{fmt(engine.get('max_num_batched_tokens'))}",
            f"preemption {fmt(engine.get('preemption'))}",
            f"block size {fmt(setup.get('block_size'))} (vLLM)",
            f"executor {fmt(engine.get('executor'))}", f"seed {esc(setup.get('seed'))}"]
    shown = {k: v for k, v in params.items()
             if k not in ("name", "figure", "workers", "systems", "min_requests")}
    timing = study.get("timing", {})
    jobs = study.get("jobs")
    return ("<p class='meta'>" + "; ".join(bits) + "</p>"
            + f"<p class='meta'>Study parameters: <code>{esc(json.dumps(shown))}</code></p>"
            + f"<p class='meta'>{fmt(len(jobs) if isinstance(jobs, list) else 0)} runs; wall "
              f"{fmt(timing.get('wall_time_s'))} s on {fmt(timing.get('workers'))} worker(s) "
              f"({fmt(timing.get('jobs_cpu_time_s'))} CPU-s in the runs; load average "
              f"{fmt(timing.get('load_average_1m'))}); "
              f"{'complete' if study.get('complete') else 'INCOMPLETE'}.</p>")


def study_section(study: dict, values: dict | None = None, *, heading_level: int = 2) -> str:
    """One experiment's section: figure, published-vs-measured table, causes, details."""
    values = values or load_paper_values()
    name = study["study"]
    spec = (values.get("experiments") or {}).get(name, {})
    h = f"h{heading_level}"
    parts = [f"<{h} id='{esc(name)}'>{esc(spec.get('figure', ''))}: {esc(spec.get('title', name))}</{h}>",
             f"<p class='meta'>Paper caption: <i>{esc(spec.get('paper_caption', ''))}</i></p>",
             _setup_text(study)]
    drawer = FIGURES.get(name)
    if drawer is not None:
        try:
            parts.append(figure(F.to_data_uri(drawer(study, spec)), f"{name} figure",
                                "The paper's figure redrawn from this study's measurements; "
                                "the table below sets them beside the published values."))
        except Exception as exc:  # a figure must not lose the tables
            parts.append(f"<p class='absent'>figure failed: {esc(type(exc).__name__)}: {esc(exc)}</p>")
    rows = comparison_rows(study, spec)
    if rows:
        parts.append("<h4>Published vs measured</h4>")
        parts.append(comparison_table(rows, spec.get("unit", "")))
        quotes = [r for r in rows if r.get("quote")]
        if quotes:
            parts.append("<ul class='meta'>" + "".join(f"<li>{esc(r['quote'])}</li>" for r in quotes)
                         + "</ul>")
        material = spec.get("material")
        if material:
            parts.append(f"<p class='meta'>A difference is material above max({material.get('abs', 0):g}, "
                         f"{100 * material.get('rel', 0):g}% of the published value).</p>")
        parts.append(causes_list(rows, spec, float(study.get("params", {}).get("scale", 1.0))))
    details = details_table(study)
    if details:
        parts.append("<h4>Measured details</h4>" + details)
    if name == "vllm_fig18b":  # the memory and the time effect of the block size, apart
        from pagebench.reports.block_size_effects import study_effects

        parts.append(study_effects(study))
    return "\n".join(parts)


_STUDY_MAPPINGS = ("params", "setup", "timing", "host", "measured", "workloads", "series", "sustained",
                   "details")


def read_study(path: Path) -> dict:
    """Load a study.json (``path``: the file or its run directory), checking that it is one
    this version can render; a malformed file is an InputError naming the file and field."""
    from harness.errors import InputError
    from harness.fileio import read_json
    from harness.results_format import STUDY_SCHEMA_VERSION

    path = Path(path)
    if path.is_dir() and path.name != "study.json":
        path = path / "study.json"
    study = read_json(path, "study file not found; pass a study run directory or its study.json")
    if not isinstance(study, dict):
        raise InputError(f"not a pagebench study file (expected a JSON object, got "
                         f"{type(study).__name__})", path=str(path))
    if study.get("kind", "study") != "study":
        raise InputError(f"not a pagebench study file (kind {study['kind']!r}, expected 'study')",
                         path=str(path), field="kind")
    version = study.get("schema_version", STUDY_SCHEMA_VERSION)
    if version != STUDY_SCHEMA_VERSION:
        raise InputError(f"{version!r} is not supported (this pagebench reads "
                         f"{STUDY_SCHEMA_VERSION}); re-run the study with the matching version",
                         path=str(path), field="schema_version")
    if not isinstance(study.get("study"), str) or not study["study"]:
        problem = "missing" if "study" not in study else f"must be the study's name, got {study['study']!r}"
        raise InputError(f"{problem} (the name of the study, e.g. 'vllm_fig2')", path=str(path), field="study")
    for key in _STUDY_MAPPINGS:
        if study.get(key) is not None and not isinstance(study[key], dict):
            raise InputError(f"must be a mapping, got {type(study[key]).__name__}", path=str(path), field=key)
    if study.get("jobs") is not None and not isinstance(study["jobs"], list):
        raise InputError(f"must be a list, got {type(study['jobs']).__name__}", path=str(path), field="jobs")
    for ident, value in (study.get("measured") or {}).items():
        if not (value is None or _is_number(value)
                or (isinstance(value, list) and all(_is_number(v) for v in value))):
            raise InputError(f"must be a number, a list of numbers or null, got {value!r:.60}",
                             path=str(path), field=f"measured.{ident}")
    return study


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_study_report(run_dir: Path) -> Path:
    """Write ``report.html`` for the study in ``run_dir`` (reads ``study.json``)."""
    run_dir = Path(run_dir)
    study = read_study(run_dir / "study.json")
    values = load_paper_values()
    body = [f"<h1>pagebench: reproducing the PagedAttention paper — {esc(study['study'])}</h1>",
            f"<p class='meta'>{esc(values.get('source', ''))}</p>",
            f"<p class='meta'>pagebench {esc(study.get('pagebench_version'))}, {esc(study.get('created'))}, "
            f"host {esc((study.get('host') or {}).get('node'))}; simulated timings (sim executor), "
            "not GPU measurements.</p>",
            study_section(study, values)]
    out = run_dir / "report.html"
    atomic_write_text(out, page(f"pagebench {study['study']}", body))
    return out


def markdown_summary(studies: list[dict], values: dict | None = None) -> str:
    """One Markdown table of published vs measured values over several studies (docs/paper.md)."""
    values = values or load_paper_values()
    lines = ["| figure | system | quantity | published | measured | difference |",
             "|---|---|---|---|---|---|"]
    for study in studies:
        spec = (values.get("experiments") or {}).get(study["study"], {})
        for r in comparison_rows(study, spec):
            diff = r["diff"]
            if isinstance(diff, float):
                diff = "inside range" if r["how"] == "range" and not diff else f"{diff:+.2f}"
            mark = " *" if r["material"] else ""
            lines.append(f"| {spec.get('figure', study['study'])} | "
                         f"{PAPER_LABELS.get(r['system'], r['system'])} | {r['quantity']} | "
                         f"{_show(r['published'])} | {_show(r['measured'])} | {diff}{mark} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    markdown = "--markdown" in args
    dirs = [a for a in args if a != "--markdown"]
    if not dirs:
        print("usage: python -m pagebench.reports.paper_section [--markdown] <study run dir> [...]",
              file=sys.stderr)
        return 2
    from harness.errors import PagebenchError

    try:
        if markdown:  # the measured-vs-published table of docs/paper.md, from finished studies
            studies = [read_study(Path(d)) for d in dirs]
            print(markdown_summary(studies), end="")
            return 0
        for arg in dirs:
            print(render_study_report(Path(arg)))
    except PagebenchError as exc:  # a malformed study.json
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
