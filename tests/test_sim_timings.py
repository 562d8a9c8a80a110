"""benchmarks/cpu/sim_timings.py: repeated CLI runs reported as medians, with every run kept."""

import importlib.util
import json
import subprocess
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


def test_ratios_are_taken_inside_rounds_and_a_slower_part_fails(capsys):
    script = load_script()

    def run(paged, total):
        return {"jobs": 1, "total_wall_time_s": total, "systems": {"paged": {"wall_time_s": paged}}}

    # round 2 ran on a loaded machine: both sides doubled, the ratio did not move
    rounds = [{script.CHECKOUT: run(2.0, 3.0), "old": run(1.0, 2.5)},
              {script.CHECKOUT: run(4.0, 6.0), "old": run(2.0, 5.0)},
              {script.CHECKOUT: run(2.2, 3.0), "old": run(1.0, 2.5)}]
    table = script.compare(rounds, ["old"], 1.10)["old"]
    assert table["paged"]["ratio_rounds"] == [2.0, 2.0, 2.2] and table["paged"]["ratio"] == 2.0
    assert table["overhead"]["ratio_rounds"] == [round(1.0 / 1.5, 4), round(2.0 / 3.0, 4), 0.5333]
    assert table["total"]["ratio"] == 1.2 and not table["total"]["ok"] and table["overhead"]["ok"]
    assert not script.print_comparison({"old": table}, 1.10)
    out = capsys.readouterr().out
    assert "FAIL: paged is 2.000x old" in out and "FAIL: total is 1.200x old" in out
    assert "FAIL: overhead" not in out


def test_an_old_layout_tree_runs_from_its_own_folders(tmp_path):
    old = tmp_path / "old"
    (old / "allocators").mkdir(parents=True)
    (old / "allocators" / "__init__.py").write_text("")
    tree = load_script().Tree("old", old)
    assert tree.old_layout and tree.env()["PYTHONPATH"] == str(old)
    new = tmp_path / "new"
    for name in ("allocators", "kernels", "reports"):
        (new / name).mkdir(parents=True)
    tree = load_script().Tree("new", new, tmp_path / "shim")
    assert not tree.old_layout
    assert tree.env()["PYTHONPATH"].split(":") == [str(tmp_path / "shim"), str(new)]
    assert (tmp_path / "shim" / "pagebench" / "allocators").resolve() == (new / "allocators").resolve()


def test_compare_with_a_reference_commit_through_the_cli(tmp_path, capsys):
    trace = tmp_path / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    trace.parent.mkdir()
    rows = [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + 7 * i},{5 + i}" for i in range(20)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "figures.json"
    script = load_script()
    try:
        code = script.main(["--traces", str(tmp_path), "--only", "azure_conv_jobs1", "--ref", "HEAD",
                            "--worktrees", str(tmp_path / "trees"), "--max-ratio", "1e9",
                            "--out", str(out)])
    finally:
        for tree in (tmp_path / "trees").glob("pagebench-ref-*"):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)
    assert code == 0
    figures = json.loads(out.read_text())["azure_conv_jobs1"]
    rows = figures["comparison"]["HEAD"]
    assert sorted(rows) == ["max", "oracle", "overhead", "paged", "pow2", "total"]
    assert figures["references"]["HEAD"]["systems"]["paged"]["steps"] == figures["systems"]["paged"]["steps"]
    assert "OK: every part within" in capsys.readouterr().out
