"""The run report: sections, numbers from the run, claims, kernels/NVML when present, errors."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import InputError
from pagebench.reports.claims import FAILS, HOLDS, NOT_MEASURED, evaluate_claims, load_claims
from pagebench.reports.figures import FIXED_SYSTEM_COLORS, system_colors
from pagebench.reports.html import fmt
from pagebench.reports.rundata import load_run
from pagebench.reports.telemetry import telemetry_panels

ROOT = Path(__file__).resolve().parents[1]
SECTION_IDS = ("summary", "memory", "serving", "kernels", "telemetry", "claims", "workload")


def small_run(out_dir: Path, *overrides: str) -> Path:
    """A real run (sim executor) of a few dozen docqa requests, written to ``out_dir``
    (``report=false`` where a test reads no report: drawing it is most of the run's time)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.run.serve import run_serving

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "workload=docqa", "workload.num_requests=40", "workload.arrival.rate=8",
            "engine.kv_capacity_slots=12000", "engine.max_model_len=4096", "progress=false",
            *overrides])
    GlobalHydra.instance().clear()
    out_dir.mkdir(parents=True, exist_ok=True)
    run_serving(cfg, out_dir)
    return out_dir


class Tables(HTMLParser):
    """Cell texts of every table with an id: {id: [[cell, ...], ...]} (header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[dict] = []
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = attrs["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "img":
            self.images.append(attrs)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(path: Path) -> Tables:
    parser = Tables()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def results(run_dir) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_report_has_every_section_and_the_run_header(run_dir, results):
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    for section in SECTION_IDS:
        assert f"id='{section}'" in text, section
    meta = re.search(r"<p class='meta' id='run-meta'>(.*?)</p>", text).group(1)
    for label, value in (("workload", "docqa"), ("model", results["model"]["name"]),
                         ("hardware", results["hardware"]["name"]), ("executor", "sim"),
                         ("seed", "0"), ("pagebench", results["pagebench_version"])):
        assert f"{label} <b>{value}</b>" in meta
    assert re.search(r"date <b>\d{4}-\d\d-\d\dT", meta)
    # one self-contained file: no external resources, figures inlined
    assert "http://" not in text and "https://" not in text
    images = parse(run_dir / "report.html").images
    assert len(images) >= 8 and all(img["src"].startswith("data:image/png;base64,") for img in images)
    assert all(img.get("alt") for img in images)


def test_summary_memory_and_latency_tables_hold_the_runs_numbers(run_dir, results):
    tables = parse(run_dir / "report.html").tables
    systems = results["systems"]
    summary = {row[0]: row for row in tables["summary-table"][1:]}
    memory = {row[0]: row for row in tables["memory-table"][1:]}
    latency = {row[0]: row for row in tables["latency-table"][1:]}
    assert list(summary) == list(systems) == ["paged", "max", "pow2", "oracle"]
    for name, s in systems.items():
        assert fmt(s["memory"]["token_states_pct"]) in summary[name]
        assert fmt(s["throughput"]["requests_per_s"]) in summary[name]
        assert fmt(s["batch"]["mean_seqs"]) in summary[name]
        assert str(s["requests"]["finished"]) in summary[name]
        assert fmt(s["memory"]["external_fragmentation_pct"]) in memory[name]
        assert fmt(s["memory"]["internal_over_reservation_pct"]) in memory[name]
        assert fmt(s["latency"]["ttft_s"]["p50"], 4) in latency[name]
        assert fmt(s["latency"]["e2e_s"]["p99"], 4) in latency[name]


def test_kernels_and_telemetry_say_not_measured_when_absent(run_dir):
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    kernels = text.split("id='kernels'")[1].split("<h2")[0]
    telemetry = text.split("id='telemetry'")[1].split("<h2")[0]
    assert "not measured in this run" in kernels
    assert "not measured in this run" in telemetry


def test_claims_table_checks_the_worked_examples_and_this_run(run_dir, results):
    rows = evaluate_claims(load_run(run_dir))
    by_id: dict[str, list] = {}
    for row in rows:
        by_id.setdefault(row.claim_id, []).append(row)
    assert set(by_id) == {c["id"] for c in load_claims()["claims"]}
    assert all(row.verdict in (HOLDS, FAILS, NOT_MEASURED) for row in rows)
    example = by_id["max_reservation_waste"][0]
    assert example.measured == pytest.approx(87.5) and example.verdict == HOLDS
    assert by_id["max_reservation_waste"][1].subject == "max"
    utilisation = by_id["block_utilization_17_of_32"][0]
    assert utilisation.measured == pytest.approx(100 * 17 / 32) and utilisation.verdict == HOLDS
    per_seq = by_id["paged_waste_per_sequence"][0]
    assert per_seq.subject == "paged" and "7.5" in per_seq.expected
    [waste] = by_id["contiguous_waste"]  # docqa: not the article's kind of requests
    assert waste.verdict == NOT_MEASURED and waste.how.startswith("not comparable")
    assert by_id["indirection_overhead"][0].verdict == NOT_MEASURED
    # the HTML holds the same verdicts, one row per measurement
    claims_html = parse(run_dir / "report.html").tables["claims-table"]
    assert len(claims_html) - 1 == len(rows)
    assert "not measured in this run" in claims_html[-1]


def test_claims_file_is_checked(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text("claims:\n- {id: x, claim: c, article_value: v, checks: [{measure: nope, "
                   "expect: {below: 1}}]}\n")
    with pytest.raises(ValueError, match="unknown 'nope'"):
        load_claims(bad)
    bad.write_text("claims:\n- {id: x, claim: c, article_value: v, checks: [{measure: "
                   "paged_waste_pct, expect: {below: 1, range: [0, 1]}}]}\n")
    with pytest.raises(ValueError, match="exactly one"):
        load_claims(bad)


def kernel_results() -> dict:
    """A small kernel_results.json in the kernel benchmark's schema."""
    rows = []
    for batch in (1, 8):
        for context in (512, 2048):
            for block in (8, 16, 64):
                contiguous = 0.01 * batch * context / 512
                paged = contiguous * (1.02 + 0.1 / block)
                rows.append({"head_config": "llama-2-13b", "dtype": "float16", "batch": batch,
                             "context_len": context, "block_size": block, "paged_ms": paged,
                             "contiguous_ms": contiguous, "sdpa_ms": contiguous * 1.1,
                             "paged_GBps": 900.0 + block, "contiguous_GBps": 950.0,
                             "paged_over_contiguous": paged / contiguous,
                             "indirection_share": 0.002 * batch / 8 + 0.001, "errors": None})
    return {"schema": "pagebench.kernel_bench/1", "timings": "cuda", "truncated": False,
            "date": "2026-11-30T00:00:00+00:00", "device": {"name": "NVIDIA H200"},
            "copy_bandwidth_GBps": 4000.0, "rows": rows,
            "summary": {"llama-2-13b": {"points": len(rows),
                                        "paged_over_contiguous": {"min": 1.02, "median": 1.03,
                                                                  "max": 1.15},
                                        "indirection_share": {"min": 0.001, "median": 0.002,
                                                              "max": 0.003},
                                        "paged_frac_copy_bw_max": 0.25, "errors": 0}}}


def test_python_m_reports_rerenders_with_kernels_and_nvml(run_dir, tmp_path):
    from pagebench.reports.__main__ import main

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "report.html").unlink()
    (copy / "kernel_results.json").write_text(json.dumps(kernel_results()))
    samples = pd.DataFrame({"time_s": [0.0, 0.1, 0.2, 0.0, 0.1, 0.2],
                            "power_w": [300.0, 420.0, 410.0, 280.0, 390.0, 400.0],
                            "gpu_util_pct": [50.0, 90.0, 95.0, 40.0, 85.0, 90.0],
                            "memory_used_mib": [60000.0] * 6, "energy_j": [0, 40, 81, 0, 38, 78],
                            "system": ["paged"] * 3 + ["max"] * 3})
    samples.to_csv(copy / "nvml_samples.csv", index=False)
    data = json.loads((copy / "results.json").read_text())
    data["systems"]["paged"]["energy_per_token_j"] = 0.75
    (copy / "results.json").write_text(json.dumps(data))

    assert main([str(copy)]) == 0
    report = parse(copy / "report.html")
    text = (copy / "report.html").read_text(encoding="utf-8")
    kernels = text.split("id='kernels'")[1].split("<h2")[0]
    assert "not measured" not in kernels and kernels.count("<img") >= 1
    assert report.tables["kernel-summary-table"][1][0] == "llama-2-13b"
    assert report.tables["energy-table"][1] == ["paged", "0.75"]
    assert "GPU telemetry over time" in text
    indirection = [r for r in report.tables["claims-table"] if "kernel benchmark" in " ".join(r)]
    assert indirection and "holds" in indirection[0]
    # CPU timings of the reference paths say nothing about the GPU kernel's overhead
    (copy / "kernel_results.json").write_text(json.dumps({**kernel_results(), "timings": "cpu"}))
    assert main([str(copy)]) == 0
    rows = parse(copy / "report.html").tables["claims-table"]
    [row] = [r for r in rows if "1% of a decode step" in " ".join(r)]
    assert "not measured in this run" in row and "ran on a CPU" in " ".join(row)


def test_a_kernels_only_directory_renders(tmp_path):
    from pagebench.reports.render import render_run_report

    (tmp_path / "kernel_results.json").write_text(json.dumps(kernel_results()))
    text = render_run_report(tmp_path).read_text(encoding="utf-8")
    assert "kernels-only run" in text and "NVIDIA H200" in text


def test_bad_inputs_name_the_file(tmp_path, capsys):
    from pagebench.reports.__main__ import main

    with pytest.raises(InputError, match="no results.json"):
        load_run(tmp_path)
    (tmp_path / "results.json").write_text('{"schema_version": 1, "systems": {')
    with pytest.raises(InputError, match=r"results.json:1: not valid JSON"):
        load_run(tmp_path)
    assert main([str(tmp_path)]) == 2
    assert "results.json" in capsys.readouterr().err


def test_python_m_reports_says_what_is_wrong_with_a_directory(tmp_path, capsys):
    from pagebench.reports.__main__ import main

    (tmp_path / "file").write_text("x")
    failed = tmp_path / "failed_job"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- block_size=0\n")
    (failed / "job_failed.txt").write_text("ConfigError: block_size: must be a positive integer\n")
    assert main([str(tmp_path / "missing"), str(tmp_path / "file"), str(failed)]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'missing'}: no such directory" in err
    assert f"error: {tmp_path / 'file'}: not a directory" in err
    assert f"error: {failed}: a run directory without results (ConfigError: block_size" in err
    assert "Traceback" not in err


def test_incomplete_runs_are_flagged(run_dir):
    from pagebench.reports.render import _header

    run = load_run(run_dir)
    run.results = dict(run.results, complete=False, stop_reason="interrupted")
    assert "This run is incomplete (interrupted)" in "".join(_header(run))


def test_system_colours_depend_on_the_name_only():
    a = system_colors(["paged", "max", "custom_a", "custom_b"])
    b = system_colors(["custom_b", "oracle", "custom_a"])
    assert a["paged"] == FIXED_SYSTEM_COLORS["paged"]
    assert a["custom_a"] == b["custom_a"]
    assert len(set(a.values())) == len(a)


def test_telemetry_columns_are_grouped_by_quantity():
    frame = pd.DataFrame({"time_s": [0.0], "power_w": [1.0], "gpu_util_pct": [1.0],
                          "mem_util_pct": [1.0], "memory_used_mib": [1.0], "sm_clock_mhz": [1.0],
                          "mem_clock_mhz": [1.0], "temperature_c": [1.0], "energy_j": [1.0],
                          "system": ["paged"]})
    panels = telemetry_panels(frame)
    assert panels["utilisation (%)"] == ["gpu_util_pct", "mem_util_pct"]
    assert panels["clock (MHz)"] == ["sm_clock_mhz", "mem_clock_mhz"]
    assert panels["memory used (GiB)"] == ["memory_used_mib"]
    assert set(panels) == {"power (W)", "utilisation (%)", "memory used (GiB)", "clock (MHz)",
                           "temperature (°C)", "energy (J)"}


def test_a_system_that_served_nothing_measures_nothing(tmp_path):
    """max cannot hold a parallel-sampling group in this pool and rejects every request: its
    memory figures are not measured (not 0%), so no claim is judged on it."""
    run_dir = small_run(tmp_path / "run", "workload=parallel_sampling", "workload.num_requests=20",
                        "engine.kv_capacity_slots=6000", "systems=[paged,max]")
    results = json.loads((run_dir / "results.json").read_text())
    assert results["systems"]["max"]["steps"] == 0
    memory = results["systems"]["max"]["memory"]
    assert memory["token_states_pct"] is None and memory["idle_pct"] is None
    assert results["systems"]["max"]["prefix_cache"] == {
        "queried_tokens": 0, "hit_tokens": 0, "hit_rate": None, "readmission_hit_tokens": 0}
    rows = evaluate_claims(load_run(run_dir))
    assert "max" not in {row.subject for row in rows}
    waste = [row for row in rows if row.claim_id == "contiguous_waste"]
    assert [(row.verdict, row.how) for row in waste] == [
        (NOT_MEASURED, "no contiguous system served a request in this run")]
    summary = parse(run_dir / "report.html").tables["summary-table"]
    assert [row[2:4] for row in summary if row[0] == "max"] == [["–", "–"]]


def test_sharing_is_not_claimed_from_a_preempted_request_hitting_its_own_blocks(tmp_path):
    """Unique prompts in a small pool: requests re-admitted after a preemption hit their own
    freed blocks. That is no sharing, so the sharing claim is not measured."""
    run_dir = small_run(tmp_path / "run", "workload=fixed", "workload.num_requests=60",
                        "engine.kv_capacity_slots=4096", "systems=[paged]", "report=false")
    paged = json.loads((run_dir / "results.json").read_text())["systems"]["paged"]
    assert paged["preemptions"] > 0
    cache = paged["prefix_cache"]
    assert cache["hit_tokens"] == cache["readmission_hit_tokens"] > 0
    rows = [row for row in evaluate_claims(load_run(run_dir)) if row.claim_id == "prefix_sharing_savings"]
    assert [row.verdict for row in rows] == [NOT_MEASURED]


def test_a_preempted_group_hitting_its_own_blocks_is_a_readmission_too(tmp_path):
    """Parallel sampling restarts a preempted group from its prompt (no sequence kept): its
    hits are re-admission hits all the same (unique prompts: no other request shares them)."""
    run_dir = small_run(tmp_path / "run", "workload=parallel_sampling", "workload.num_requests=40",
                        "workload.arrival.rate=20", "engine.kv_capacity_slots=3000",
                        "systems=[paged]", "report=false")
    paged = json.loads((run_dir / "results.json").read_text())["systems"]["paged"]
    assert paged["preemptions"] > 0
    cache = paged["prefix_cache"]
    assert cache["hit_tokens"] == cache["readmission_hit_tokens"] > 0


def test_every_figure_has_a_caption(run_dir):
    text = (run_dir / "report.html").read_text()
    assert text.count("<figure>") == text.count("<figcaption>") >= 8


def test_the_per_sequence_block_claim_is_not_judged_when_sequences_share_blocks(tmp_path):
    run_dir = small_run(tmp_path / "run", "workload=beam_search", "workload.num_requests=20",
                        "systems=[paged]", "report=false")  # (claims from the run's files)
    rows = [row for row in evaluate_claims(load_run(run_dir))
            if row.claim_id == "paged_waste_per_sequence"]
    assert [row.verdict for row in rows] == [NOT_MEASURED]
    assert "share partial blocks" in rows[0].how


def test_layer_group_sentence_escapes_every_received_value():
    from pagebench.reports.layer_groups import layer_group_parts

    markup = "<script>x</script>"
    hybrid = {"memory": {"capacity_slots": 10, "mean_slots": None}, "slot_bytes": markup,
              "layer_groups": {"group_size": markup, "page_bytes": markup, "num_pages": 3000,
                               "attention_block_size": markup, "kinds": []}}
    html = "".join(layer_group_parts({"h": hybrid}))
    assert "<script>" not in html and html.count("&lt;script&gt;") == 4 and "3,000" in html


def test_buddy_rounding_is_explained_where_it_shows():
    from pagebench.reports.render import buddy_rounding_notes

    def system(policy, rounding, arena="buddy"):
        return {"allocator": {"kind": "contiguous", "policy": policy, "arena": arena},
                "memory": {"internal_rounding_pct": rounding}}

    notes = buddy_rounding_notes({"oracle": system("oracle", 29.9), "pow2": system("pow2", 3.0),
                                  "ff": system("oracle", 29.9, arena="first_fit"),
                                  "paged": {"allocator": {"kind": "paged"},
                                            "memory": {"internal_rounding_pct": 30.0}}})
    assert len(notes) == 1 and notes[0].startswith("<p class='note buddy-rounding'>oracle: "
                                                   "29.90% of the pool is buddy rounding")
    assert "reads close to pow2" in notes[0]
