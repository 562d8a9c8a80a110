"""The report of a kernels-only run: a summary first, captions that say what was timed,
and no section with nothing in it."""

from __future__ import annotations

import json
import re

from pagebench.reports.render import render_run_report
from test_report import kernel_results


def render(tmp_path, timings: str) -> str:
    data = kernel_results()
    data["timings"] = timings
    (tmp_path / "kernel_results.json").write_text(json.dumps(data))
    return render_run_report(tmp_path).read_text(encoding="utf-8")


def test_a_cpu_kernel_report_starts_with_its_summary_and_names_the_torch_reference(tmp_path):
    html = render(tmp_path, "cpu")
    summary = html.index("id='kernel-summary'")
    assert summary < html.index("<img")  # what it measured comes before the figures
    assert "paged / contiguous decode time median 1.030" in html[summary:html.index("<img")]
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", html)
    assert len(captions) == 3
    assert all("torch&#x27;s reference paths" in c and "not the Triton kernels" in c
               for c in captions)
    assert "same Triton kernel" not in html


def test_a_kernel_report_has_no_empty_sections_and_links_only_those_it_has(tmp_path):
    html = render(tmp_path, "cuda")
    sections = re.findall(r"<h2 id='(\w+)'>", html)
    assert sections == ["summary", "kernels", "telemetry", "claims"]
    nav = re.search(r"<nav>(.*?)</nav>", html).group(1)
    assert re.findall(r"href='#(\w+)'", nav) == sections
    assert "Workload and run" not in html
    assert "Triton decode kernels" in html
