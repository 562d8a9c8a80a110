"""The run report in a real browser: headless Chromium (Debian's ``chromium``) via Playwright.

Loads report.html from a real small run with no network, checks there are no console
errors, that every figure has a non-zero rendered size and that the tables hold the
run's numbers, and saves a full-page screenshot beside the report (its path is printed;
set PAGEBENCH_SCREENSHOT_DIR to keep a copy). Skips when chromium or playwright is
missing; Playwright never downloads a browser here (``executable_path`` is given).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from reports.html import fmt
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
