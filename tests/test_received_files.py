"""Numbers in received files (a results.json, a gate baseline, a trace): an integer of more
than 4,300 digits, Infinity, a boolean or a string where a figure belongs is refused in one
line naming the file, the line and the field (exit 2), never a ValueError traceback."""

from __future__ import annotations

import json

import pytest

from harness import gate
from harness.errors import InputError
from harness.fileio import read_json
from harness.results_format import read_results
from harness.workloads.tables import read_table
from test_gate import make_results, run_gate, write

LONG = "7" * 5000


def test_read_json_names_file_line_and_field_of_a_too_long_integer(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{\n  "seed": 0,\n  "block_size": ' + LONG + "\n}")
    with pytest.raises(InputError) as err:
        read_json(path)
    assert str(err.value) == (f"{path}:3: field 'block_size': an integer of 5,000 digits "
                              "(more than the 4,300 a number may have)")


def test_a_jsonl_trace_names_the_line_and_field_of_a_too_long_integer(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_length": 10, "output_length": 5}\n'
                     '{"input_length": ' + LONG + ', "output_length": 5}\n')
    table = read_table(trace, "auto", ["input_length", "output_length"])
    assert table.errors[1] == (None, "invalid record", "an integer of 5,000 digits (more than "
                               "the 4,300 a number may have) in field 'input_length'")
    assert table.lines == [1, 2]


def test_a_json_array_trace_names_the_line_and_field_of_a_too_long_integer(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text('[\n{"input_length": 10, "output_length": 5},\n'
                     '{"input_length": 3,\n "output_length": ' + LONG + "}\n]")
    with pytest.raises(InputError, match=rf"{trace}:4: field 'output_length': an integer of "
                                         r"5,000 digits"):
        read_table(trace, "auto", ["input_length", "output_length"])


@pytest.mark.parametrize("field, value, shown", [
    ("throughput.output_tokens_per_s", float("inf"), "inf"),
    ("preemptions", True, "True"),
    ("memory.token_states_pct", "80.0", "'80.0'"),
    ("latency.e2e_s.p50", float("nan"), "nan"),
])
def test_a_received_results_json_with_a_non_number_figure_is_refused(tmp_path, field, value,
                                                                     shown):
    results = make_results()
    node = results["systems"]["paged"]
    *parents, leaf = field.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    path = write(tmp_path / "r" / "results.json", results)
    with pytest.raises(InputError) as err:
        read_results(path)
    assert str(err.value) == (f"{path}: field 'systems.paged.{field}': must be a finite "
                              f"number or null, got {shown}")


def test_the_gate_refuses_infinity_and_a_boolean_in_current_results(tmp_path, baseline, capsys):
    for value in (float("inf"), True):
        current = make_results()
        current["systems"]["paged"]["throughput"]["output_tokens_per_s"] = value
        code, report = run_gate(tmp_path, current, baseline)
        err = capsys.readouterr().err
        assert code == 2 and report is None, err
        assert err.count("\n") == 1 and "systems.paged.throughput.output_tokens_per_s" in err


def test_the_gate_refuses_a_too_long_integer_in_a_baseline(tmp_path, capsys):
    path = tmp_path / "baseline.json"
    path.write_text('{"pagebench_baseline": 1, "jobs": {"j": {"metrics": {"paged.preemptions": '
                    + LONG + "}}}}")
    run = write(tmp_path / "r" / "results.json", make_results())
    assert gate.main([str(run), "--baseline", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}:1: field 'paged.preemptions': an integer of 5,000 digits " \
                  "(more than the 4,300 a number may have)\n"


def test_the_gate_without_a_baseline_for_any_of_the_results_is_a_usage_error(tmp_path, baseline,
                                                                           capsys):
    code, report = run_gate(tmp_path, make_results(block_size=32), baseline)
    err = capsys.readouterr().err
    assert code == 2 and report is None
    assert err.count("\n") == 1 and "no job of these results is in the baseline" in err
    assert "--update" in err and "docqa/n50/llama-2-13b/a100-80gb/bs16/seed0/sim" in err


@pytest.fixture
def baseline(tmp_path):
    run = write(tmp_path / "base" / "results.json", make_results())
    path = tmp_path / "baseline.json"
    assert gate.main([str(run), "--baseline", str(path), "--update"]) == 0
    return path


@pytest.mark.parametrize("change, message", [
    (lambda r: r["systems"]["paged"].pop("requests"),
     "field 'systems.paged.requests': missing (every system's summary has it)"),
    (lambda r: r["systems"]["paged"]["memory"].pop("idle_pct"),
     "field 'systems.paged.memory.idle_pct': missing (every system's summary has it)"),
    (lambda r: r["systems"]["paged"].__setitem__("latency", [1]),
     "field 'systems.paged.latency': must be a mapping, got list"),
    (lambda r: r["systems"]["paged"]["latency"].__setitem__("ttft_s", 0.5),
     "field 'systems.paged.latency.ttft_s': must be a mapping, got float"),
    (lambda r: r.__setitem__("model", "llama"), "field 'model': must be a mapping, got str"),
])
def test_a_received_results_json_of_the_wrong_shape_is_refused(tmp_path, change, message):
    results = make_results()
    change(results)
    path = write(tmp_path / "r" / "results.json", results)
    with pytest.raises(InputError) as err:
        read_results(path)
    assert str(err.value) == f"{path}: {message}"


def test_the_report_refuses_a_wrong_shape_and_a_broken_overrides_file_in_one_line(tmp_path,
                                                                                 capsys):
    from pagebench.reports.__main__ import main as render_reports

    results = make_results()
    del results["systems"]["max"]["throughput"]
    run = write(tmp_path / "run" / "results.json", results).parent
    assert render_reports([str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {run / 'results.json'}: field 'systems.max.throughput': missing "
                   "(every system's summary has it)\n")
    sweep = tmp_path / "sweep"
    write(sweep / "0" / "results.json", make_results())
    (sweep / "0" / ".hydra").mkdir()
    broken = sweep / "0" / ".hydra" / "overrides.yaml"
    broken.write_text("- block_size=8\n- [unclosed\n")
    assert render_reports([str(sweep), "--no-jobs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {broken}: not a readable YAML list of overrides (")
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "..", "a\\b"])
def test_a_system_name_that_is_a_path_is_refused_before_a_table_is_opened(tmp_path, name):
    results = make_results()
    results["systems"][name] = results["systems"].pop("max")
    path = write(tmp_path / "r" / "results.json", results)
    with pytest.raises(InputError, match="not a system name"):
        read_results(path)


def test_a_checkpoint_config_with_a_too_long_integer_names_line_and_field(tmp_path):
    from harness.models.hf_config import spec_keys

    (tmp_path / "config.json").write_text('{\n  "model_type": "llama",\n  "num_hidden_layers": '
                                          + LONG + "\n}")
    with pytest.raises(InputError) as err:
        spec_keys(str(tmp_path))
    assert str(err.value) == (f"{tmp_path / 'config.json'}:3: field 'num_hidden_layers': an "
                              "integer of 5,000 digits (more than the 4,300 a number may have)")


def test_a_number_pattern_matches_one_key_per_star_not_any_path_ending_like_it(tmp_path):
    """``systems.*.steps.**`` (a system's step counts) does not reach the torch executor's
    ``systems.NAME.executor.slow_steps.steps[0].phase`` (text): ``*`` is one key."""
    from harness.results_format import check_result_numbers

    check_result_numbers({"systems": {"oracle": {"steps": {"total": 3}, "executor": {
        "slow_steps": {"steps": [{"phase": "decode", "step": 4}]}}}}}, tmp_path / "results.json")
    with pytest.raises(InputError, match=r"systems\.oracle\.steps\.total"):
        check_result_numbers({"systems": {"oracle": {"steps": {"total": "3"}}}}, tmp_path / "r.json")
