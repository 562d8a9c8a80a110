"""benchmarks/cpu/sim_timings.py: repeated CLI runs reported as medians, with every run kept."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("sim_timings", ROOT / "benchmarks/cpu/sim_timings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_report_medians_of_real_cli_runs(tmp_path):
    trace = tmp_path / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    trace.parent.mkdir()
    rows = [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + 7 * i},{5 + i}" for i in range(30)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "figures.json"
    assert load_script().main(["--traces", str(tmp_path), "--only", "azure_conv_jobs1",
                               "--rounds", "2", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["azure_conv_jobs1"]
    assert run["rounds"] == 2 and run["requests"] == 30 and run["jobs"] == 1
    assert len(run["total_wall_time_s_runs"]) == 2
    assert sorted(run["systems"]) == ["max", "oracle", "paged", "pow2"]
    for figures in run["systems"].values():
        times = figures["wall_time_s_runs"]
        assert len(times) == 2 and figures["wall_time_s"] == sum(times) / 2  # median of two
        assert figures["steps"] > 0


def test_medians_of_three_runs():
    runs = [{"command": "c", "jobs": 1, "requests": 5, "total_wall_time_s": t,
             "systems": {"paged": {"wall_time_s": t - 1, "steps": 9}}} for t in (3.0, 9.0, 4.0)]
    summary = load_script().medians(runs)
    assert summary["total_wall_time_s"] == 4.0 and summary["total_wall_time_s_runs"] == [3.0, 9.0, 4.0]
    assert summary["systems"]["paged"] == {"wall_time_s": 3.0, "wall_time_s_runs": [2.0, 8.0, 3.0],
                                           "steps": 9}
