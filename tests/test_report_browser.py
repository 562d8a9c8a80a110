"""The run report in a real browser: headless Chromium (Debian's ``chromium``) via Playwright.

Loads report.html from a real small run with no network, checks there are no console
errors, that every figure has a non-zero rendered size and that the tables hold the
run's numbers, and saves a full-page screenshot beside the report (its path is printed;
set PAGEBENCH_SCREENSHOT_DIR to keep a copy); then renders hostile strings (markup in
every field of a received results.json, run_info.json, kernel_results.json, sweep job and
study.json) in every report kind and checks that no script runs. Skips when chromium or playwright is
missing; Playwright never downloads a browser here (``executable_path`` is given).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pagebench.reports.html import fmt
from test_report import small_run

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1280, "height": 900}, offline=True)
        try:
            yield context.new_page()
        finally:
            context.close()


def test_report_renders_in_headless_chromium(browser_page, tmp_path):
    run_dir = small_run(tmp_path / "run")
    results = json.loads((run_dir / "results.json").read_text())
    page = browser_page
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto((run_dir / "report.html").as_uri(), wait_until="load")

    assert problems == []
    figures = page.evaluate("""() => Array.from(document.images).map(img => ({
        alt: img.alt, complete: img.complete, natural: img.naturalWidth * img.naturalHeight,
        width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height}))""")
    assert len(figures) >= 8
    for fig in figures:
        assert fig["complete"] and fig["natural"] > 0, fig
        assert fig["width"] > 50 and fig["height"] > 50, fig

    summary = page.evaluate("""() => Array.from(document.querySelectorAll('#summary-table tbody tr'))
        .map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))""")
    assert [row[0] for row in summary] == list(results["systems"])
    for row, (name, s) in zip(summary, results["systems"].items()):
        assert fmt(s["memory"]["token_states_pct"]) in row
        assert fmt(s["throughput"]["output_tokens_per_s"]) in row
    verdicts = page.locator("#claims-table tbody tr").count()
    assert verdicts >= 8
    assert page.locator("#claims-table").inner_text().count("holds") >= 3

    shot = run_dir / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    keep = os.environ.get("PAGEBENCH_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")
    print(f"screenshot: {shot}")


# --------------------------------------------------------------------------- hostile input
# A received result file may hold markup in any field: every report kind must show it as
# text. Each piece tries another way to run script (a tag, an event handler, a broken
# attribute quote); any of them running sets window.__pwned.
PAYLOAD = ("<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"
           "'\"><svg onload=window.__pwned=3></svg>")
KEEP = {"kind", "policy", "status", "arena", "timings", "schema", "study"}  # what picks the code path


def poisoned(node, key: str = ""):
    """``node`` with PAYLOAD appended to every string (and set as a key of every mapping of
    strings and numbers, holding a string or a number as its siblings do), except the few
    fields that choose what the report draws."""
    if isinstance(node, dict):
        out = {k: poisoned(v, k) for k, v in node.items()}
        if node and all(isinstance(v, (str, int)) for v in node.values()) and key != "systems":
            out[PAYLOAD] = PAYLOAD if all(isinstance(v, str) for v in node.values()) else 1
        return out
    if isinstance(node, list):
        return [poisoned(v, key) for v in node]
    if isinstance(node, str) and key not in KEEP:
        return node + PAYLOAD
    return node


def hostile_run(root: Path, run_dir: Path) -> Path:
    """A copy of a real run whose results.json and run_info.json carry PAYLOAD everywhere."""
    shutil.copytree(run_dir, root)
    for name in ("results.json", "run_info.json"):
        data = poisoned(json.loads((root / name).read_text()))
        if name == "results.json":
            data["warnings"] = [PAYLOAD]
            data["complete"], data["stop_reason"] = False, PAYLOAD
        (root / name).write_text(json.dumps(data))
    (root / "report.html").unlink(missing_ok=True)
    return root


def hostile_kernels(root: Path) -> Path:
    from test_report import kernel_results

    root.mkdir()
    data = poisoned(kernel_results())
    data["note"] = PAYLOAD
    (root / "kernel_results.json").write_text(json.dumps(data))
    return root


def hostile_sweep(root: Path, run_dir: Path) -> Path:
    import yaml

    root.mkdir()
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": [
        "block_size=8,16"]}}, "experiment": {"focus": [PAYLOAD]}}))
    for num, block in enumerate((8, 16)):
        job = hostile_run(root / str(num), run_dir)
        (job / ".hydra").mkdir(exist_ok=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
            [f"block_size={block}", f"workload.name={PAYLOAD}"]))
    (root / "2" / ".hydra").mkdir(parents=True)
    (root / "2" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"x={PAYLOAD}"]))
    (root / "2" / "job_failed.txt").write_text(PAYLOAD + "\n")
    return root


def hostile_study(root: Path) -> Path:
    root.mkdir()
    study = {"study": "vllm_fig15", "kind": "study", "complete": False, "jobs": [],
             "params": {"systems": {"vllm": "paged_noprefix"},
                        "widths": {"parallel": [2], "beam": [2]}, "note": PAYLOAD},
             "measured": {"parallel.2": 6.0, "beam.2": 80.0},
             "setup": {"model": {"name": PAYLOAD}, "hardware": {"name": PAYLOAD},
                       "block_size": PAYLOAD, "seed": PAYLOAD,
                       "engine": {key: PAYLOAD for key in (
                           "kv_capacity_slots", "max_model_len", "max_num_seqs",
                           "max_num_batched_tokens", "preemption", "executor")}},
             "timing": {key: PAYLOAD for key in ("wall_time_s", "jobs_cpu_time_s", "workers",
                                                 "load_average_1m")},
             "details": {PAYLOAD: {PAYLOAD: PAYLOAD}},
             "created": PAYLOAD, "pagebench_version": PAYLOAD, "host": {"node": PAYLOAD}}
    (root / "study.json").write_text(json.dumps(study))
    return root


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> Path:
    """A small real run whose results and tables the hostile and sweep pages start from
    (both draw their own pages: its report is not needed)."""
    return small_run(tmp_path_factory.mktemp("source") / "run", "systems=[paged,oracle]",
                     "workload.num_requests=16", "report=false")


def test_hostile_strings_in_every_report_kind_stay_text(browser_page, source_run, tmp_path):
    from pagebench.reports.__main__ import main as render_reports

    run_dir = source_run
    pages = {"run": hostile_run(tmp_path / "hostile_run", run_dir) / "report.html",
             "kernels": hostile_kernels(tmp_path / "kernels") / "report.html",
             "sweep": hostile_sweep(tmp_path / "sweep", run_dir) / "sweep_report.html",
             "study": hostile_study(tmp_path / "study") / "report.html"}
    for kind, path in pages.items():
        assert render_reports([str(path.parent)]) == 0, kind
    for kind, path in pages.items():
        state = _page_state(browser_page, path)
        errors = state["errors"]
        state["shown"] = browser_page.evaluate(
            "() => document.body.innerText.split('<script>window.__pwned=1</script>').length - 1")
        assert (kind, state["pwned"], state["scripts"], state["handlers"], errors) == \
            (kind, None, 0, [], []), state
        assert state["shown"] >= 3, (kind, state)  # the payload was rendered, as text


@pytest.fixture(scope="module")
def rich_runs(tmp_path_factory) -> dict[str, Path]:
    """Small real runs whose results.json hold the fields the default run lacks: a hybrid
    model's layer groups (and radix, vattention), and an offload tier's figures."""
    root = tmp_path_factory.mktemp("rich")
    return {"hybrid": small_run(root / "hybrid", "model=gemma-2-9b", "workload.num_requests=16",
                                "systems=[paged,paged_hybrid,oracle,radix,vattention]",
                                "report=false"),
            "offload": small_run(root / "offload", "workload=shared_prefix", "systems=[paged]",
                                 "workload.num_requests=16", "engine.offload.cpu_gib=0.05",
                                 "report=false")}


def numbers_poisoned(node, key: str = ""):
    """``node`` with PAYLOAD in place of every number (a received file may hold a string
    anywhere), except the fields that pick the code path."""
    if isinstance(node, dict):
        return {k: numbers_poisoned(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [numbers_poisoned(v, key) for v in node]
    if isinstance(node, (int, float)) and not isinstance(node, bool) and key != "schema_version":
        return PAYLOAD
    return node


def _page_state(page, path: Path) -> dict:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_timeout(100)
    state = page.evaluate("""() => ({
        pwned: window.__pwned === undefined ? null : window.__pwned,
        scripts: document.querySelectorAll('script, svg').length,
        handlers: Array.from(document.querySelectorAll('*')).flatMap(el =>
            Array.from(el.attributes).map(a => a.name).filter(n => n.startsWith('on')))})""")
    state["errors"] = errors
    return state


@pytest.mark.parametrize("kind", ["hybrid", "offload"])
def test_every_field_of_a_received_results_json_stays_text(browser_page, rich_runs, kind, tmp_path,
                                                           capsys):
    """Markup in any string, or a string in place of any number, of every field a hybrid or
    offload run's results.json holds: the report shows it as text, or refuses the file in
    one line (exit 2); never a script, never a traceback."""
    from pagebench.reports.__main__ import main as render_reports

    for mode, poison in (("strings", poisoned), ("numbers", numbers_poisoned)):
        root = tmp_path / mode
        shutil.copytree(rich_runs[kind], root)
        (root / "results.json").write_text(json.dumps(poison(json.loads(
            (rich_runs[kind] / "results.json").read_text()))))
        status = render_reports([str(root)])
        err = capsys.readouterr().err
        if status == 2:
            assert mode == "numbers" and err.count("\n") == 1 and "results.json" in err, err
            continue
        assert status == 0, (mode, err)
        state = _page_state(browser_page, root / "report.html")
        assert state == {"pwned": None, "scripts": 0, "handlers": [], "errors": []}, (mode, state)


def test_the_sweep_table_fits_the_page(browser_page, source_run, tmp_path):
    from pagebench.reports.sweep import render_sweep_report
    from test_sweep import fake_sweep

    report = render_sweep_report(fake_sweep(tmp_path, source_run))
    browser_page.goto(report.as_uri(), wait_until="load")
    table_width, page_width = browser_page.evaluate("""() => {
        const table = document.querySelector('#sweep-table');
        return [table.scrollWidth, table.parentElement.clientWidth]; }""")
    assert table_width <= page_width  # every metric's column is on the page, no scrolling


def test_sweep_table_headers_break_between_words_and_counts_are_whole(browser_page, source_run,
                                                                      tmp_path):
    from pagebench.reports.sweep import render_sweep_report
    from test_sweep import fake_sweep

    report = render_sweep_report(fake_sweep(tmp_path, source_run))
    browser_page.goto(report.as_uri(), wait_until="load")
    split = browser_page.evaluate("""() => {
        const split = [];
        for (const th of document.querySelectorAll('#sweep-table th')) {
            const text = th.firstChild;
            if (!text || text.nodeType !== Node.TEXT_NODE) continue;
            let start = 0;
            for (const word of text.data.split(/[ -]/)) {  // (a line may end at a hyphen)
                const range = document.createRange();
                range.setStart(text, start); range.setEnd(text, start + word.length);
                const lines = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
                if (word && lines.size > 1) split.push(word);
                start += word.length + 1;
            }
        }
        return split; }""")
    assert split == []  # no header word is broken across lines (only at spaces and hyphens)
    header = browser_page.locator("#sweep-table thead th").all_inner_texts()
    column = [h.replace("\\n", " ") for h in header].index("preemptions (count)")
    cells = browser_page.evaluate(f"""() => Array.from(document.querySelectorAll(
        '#sweep-table tbody tr')).map(tr => tr.cells[{column}].innerText.trim())""")
    assert cells and all(c == "–" or c.replace(",", "").isdigit() for c in cells), cells
