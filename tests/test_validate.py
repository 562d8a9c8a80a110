"""python -m harness.tools.validate: the sim against a measured run (the committed H200
docqa run), the comparison's arithmetic, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.tools.validate import main
from harness.tools.validate_compare import compare_steps, error_pct, pow2_bucket, system_figures

ROOT = Path(__file__).resolve().parents[1]
DOCQA = ROOT / "benchmarks" / "gpu" / "2026-12-04-h200" / "call2" / "docqa"


def _steps(rows):
    return pd.DataFrame(rows, columns=["duration_s", "num_seqs", "num_batched_tokens",
                                       "num_prefill_tokens", "token_states"])


def test_error_and_buckets_by_hand():
    assert error_pct(11.0, 10.0) == 10.0 and error_pct(1.0, 0.0) is None
    assert [pow2_bucket(v) for v in (1, 7, 8, 15, 16, 0.4)] == [1, 4, 8, 8, 16, 1]
    measured = _steps([[0.5, 4, 4000, 4000, 4000], [0.02, 4, 4, 0, 4004], [0.03, 4, 4, 0, 4008]])
    predicted = measured.assign(duration_s=[0.4, 0.022, 0.03])
    got = compare_steps(predicted, measured)
    assert got["paired"] and got["by_phase"]["prefill"]["error_pct"] == -20.0
    assert got["by_phase"]["decode"]["error_pct"] == 4.0  # (0.052 - 0.05) / 0.05
    (decode,) = [b for b in got["buckets"] if b["phase"] == "decode"]
    assert (decode["batch_bucket"], decode["context_bucket"], decode["steps"]) == (4, 512, 2)
    assert decode["median_abs_step_error_pct"] == 5.0  # |+10%| and |0%|
    # another schedule: buckets compared unpaired
    other = _steps([[0.6, 5, 4000, 4000, 4000], [0.025, 5, 5, 0, 4004]])
    assert not compare_steps(other, measured)["paired"]
    figures = system_figures({"throughput": {"requests_per_s": 2.0}}, measured)
    assert figures["requests_per_s"] == 2.0 and figures["decode_step_mean_s"] == pytest.approx(0.025)


def test_validate_the_committed_h200_docqa_run(tmp_path, capsys):
    out = tmp_path / "v"
    assert main([str(DOCQA), "--out", str(out)]) == 0
    report = json.loads((out / "validate.json").read_text())
    measured = json.loads((DOCQA / "results.json").read_text())["systems"]
    assert set(report["systems"]) == {"paged", "max", "oracle"}
    for name, s in report["systems"].items():
        rate = s["figures"]["requests_per_s"]
        assert rate["measured"] == measured[name]["throughput"]["requests_per_s"]
        assert rate["error_pct"] == error_pct(rate["predicted"], rate["measured"])
        # an offline run: the sim replays the measured schedule step for step
        assert s["steps"]["paired"] and s["steps"]["measured_steps"] == len(pd.read_csv(DOCQA / f"steps_{name}.csv"))
    paged = report["systems"]["paged"]
    assert [row["step"] for row in paged["measured_slow_steps"]] == [1, 5]  # the compiling steps
    assert report["profiles"]["kernel_profile"] == "h200_event_timed"
    assert report["profiles"]["host_profile"] == "pagebench_torch_h200"
    printed = capsys.readouterr().out
    assert "req/s" in printed and "2 measured steps >2x their shape's" in printed
    assert "<h2 id='validation'>" in (out / "validate.html").read_text()
    assert "data:image/png;base64," in (out / "validate.html").read_text()  # the scatter
    assert (out / "validate.md").read_text().startswith("# Validation: docqa (llama-2-13b)")
    # profiles named on the command line replace the hardware's
    again = tmp_path / "vidur"
    assert main([str(DOCQA), "--out", str(again), "--host-profile", "vidur_a100_llama2_7b_tp1",
                 "--kernel-profile", "fa_sm100_pr2104_before"]) == 0
    named = json.loads((again / "validate.json").read_text())["profiles"]
    assert (named["kernel_profile"], named["host_profile"]) == ("fa_sm100_pr2104_before",
                                                                "vidur_a100_llama2_7b_tp1")


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "not a run directory"),
    (lambda d: d, "no config_resolved.yaml"),
])
def test_a_bad_run_dir_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    assert main([str(make(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_a_sim_run_is_refused(tmp_path, capsys):
    (tmp_path / "config_resolved.yaml").write_text((DOCQA / "config_resolved.yaml").read_text())
    results = json.loads((DOCQA / "results.json").read_text())
    results["executor"] = "sim"
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path)]) == 2
    assert "validate compares the sim with a measured (engine.executor=torch) run" in capsys.readouterr().err
