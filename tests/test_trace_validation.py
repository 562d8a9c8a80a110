"""Dirty traces: every malformed row names file, line and field; on_error=skip counts instead."""

from __future__ import annotations

import copy
import csv
import functools
import io
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from harness.workloads.presets import load_preset
from harness.errors import ConfigError, InputError
from harness.workloads import build_workload
from harness.workloads.rows import _longest_ordered_run

CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"]


@functools.lru_cache(maxsize=None)
def preset(name: str) -> dict:
    return load_preset(name)


def load(name: str, path: Path, max_model_len: int = 1 << 16, **overrides):
    node = copy.deepcopy(preset(name))
    node.update(path=str(path), **overrides)
    return build_workload(node, seed=0, max_model_len=max_model_len)


def azure_file(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


def raises_at(name, path, line, field, fragment, **overrides) -> str:
    with pytest.raises(InputError) as info:
        load(name, path, **overrides)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}:" if line else f"{path}:"), message
    if field is not None:
        assert f"field {field!r}" in message, message
    assert fragment in message, message
    assert (info.value.path, info.value.line, info.value.field) == (str(path), line, field)
    return message


@pytest.mark.parametrize("bad_row, field, fragment", [
    ("2023-11-16 18:15:52.0,12.5,44", "ContextTokens", "not an integer"),
    ("2023-11-16 18:15:52.0,abc,44", "ContextTokens", "not an integer"),
    ("2023-11-16 18:15:52.0,0,44", "ContextTokens", "negative or zero length"),
    ("2023-11-16 18:15:52.0,10,-3", "GeneratedTokens", "negative or zero length"),
    ("2023-11-16 18:15:52.0,10", "GeneratedTokens", "missing"),
    ("2023-11-16 18:15:52.0,,5", "ContextTokens", "missing"),
    ("yesterday,10,5", "TIMESTAMP", "not a date-time"),
    ("2023-11-16 18:15:52.0,3_96,5", "ContextTokens", "not an integer"),  # int() would take it
    ("2023-11-16 18:15:52.0,٣٩٦,5", "ContextTokens", "not an integer"),  # Arabic-Indic 396
    ("2023-11-16 18:15:52.0,9000000000000000000,5", "ContextTokens", "out of range"),
    ("0,10,5", "TIMESTAMP", "date-time out of range"),  # numpy alone reads year 0 as 1753
    ("2300-01-01 00:00:00,10,5", "TIMESTAMP", "date-time out of range"),
    ("2023-11-16 18:15:40.0,10,5", "TIMESTAMP", "timestamp goes backwards"),
    ("2023-11-16 18:15:52.0,10,5,9", None, "invalid record: 4 fields, but the header names 3"),
])
def test_a_malformed_azure_row_names_file_line_and_field(tmp_path, bad_row, field, fragment):
    path = azure_file(tmp_path, *GOOD, bad_row, GOOD[1])
    message = raises_at("azure_conv", path, 4, field, fragment)
    assert "on_error=skip" in message


def test_on_error_skip_skips_and_counts_by_reason(tmp_path):
    path = azure_file(tmp_path, GOOD[0], "2023-11-16 18:15:47.0,x,5", "2023-11-16 18:15:48.0,5,0",
                      "2023-11-16 18:15:30.0,5,5", GOOD[1], "2023-11-16 18:15:51.0,5")
    workload = load("azure_conv", path, on_error="skip")
    assert [r.prompt_len for r in workload.requests] == [374, 396]
    rows = workload.summary["rows"]
    assert rows["rows_read"] == 6
    assert rows["skipped"] == {"total": 4, "by_reason": {
        "ContextTokens: not an integer": 1, "GeneratedTokens: negative or zero length": 1,
        "GeneratedTokens: missing": 1, "TIMESTAMP: timestamp goes backwards": 1}}


JUMP = "2033-11-16 18:15:48.0,7,7"  # a mistyped year: ten years ahead of its neighbours


def test_one_timestamp_jumping_ahead_costs_its_own_row_only(tmp_path):
    later = ["2023-11-16 18:15:52.0,11,1", "2023-11-16 18:15:53.0,12,1", "2023-11-16 18:15:54.0,13,1"]
    path = azure_file(tmp_path, *GOOD, JUMP, *later)
    message = raises_at("azure_conv", path, 4, "TIMESTAMP", "timestamp jumps ahead")
    assert "'2033-11-16 18:15:48.0' is later than line 5's '2023-11-16 18:15:52.0'" in message
    workload = load("azure_conv", path, on_error="skip")
    assert [r.prompt_len for r in workload.requests] == [374, 396, 11, 12, 13]
    assert workload.summary["rows"]["skipped"] == {
        "total": 1, "by_reason": {"TIMESTAMP: timestamp jumps ahead": 1}}


def test_a_timestamp_going_back_names_the_kept_row_above_it(tmp_path):
    path = azure_file(tmp_path, *GOOD, "2023-11-16 18:15:40.0,10,5", GOOD[1])
    message = raises_at("azure_conv", path, 4, "TIMESTAMP", "timestamp goes backwards")
    assert "'2023-11-16 18:15:40.0' is earlier than line 3's '2023-11-16 18:15:50.9951690'" in message


def _ordered_runs_by_brute_force(times: list[int]) -> list[int]:
    """The lexicographically first longest non-decreasing subsequence, by trying them all."""
    for size in range(len(times), 0, -1):
        for chosen in itertools.combinations(range(len(times)), size):
            if all(times[a] <= times[b] for a, b in zip(chosen, chosen[1:])):
                return list(chosen)
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=9))
def test_the_rows_kept_are_the_first_longest_ordered_run(times):
    assert _longest_ordered_run([float(t) for t in times]) == _ordered_runs_by_brute_force(times)


def test_a_missing_column_names_the_header_line(tmp_path):
    path = azure_file(tmp_path, "2023-11-16 18:15:46.6,374", header="TIMESTAMP,ContextTokens\n")
    raises_at("azure_conv", path, 1, "GeneratedTokens", "missing column")


def test_the_first_bad_row_is_reported_whatever_its_field(tmp_path):
    path = azure_file(tmp_path, GOOD[0], "2023-11-16 18:15:47.0,5,x", "2023-11-16 18:15:48.0,y,5")
    raises_at("azure_conv", path, 3, "GeneratedTokens", "not an integer")


@pytest.mark.parametrize("content, fragment", [("", "empty"), ("\n\n", "empty"), (HEADER, "no data rows")])
def test_empty_files_fail_clearly(tmp_path, content, fragment):
    path = tmp_path / "trace.csv"
    path.write_text(content)
    raises_at("azure_conv", path, None, None, fragment)


def test_an_unknown_format_names_the_format_key(tmp_path):
    path = tmp_path / "trace.xyz"
    path.write_text(HEADER + GOOD[0])
    with pytest.raises(ConfigError, match="workload.format"):
        load("azure_conv", path)
    assert len(load("azure_conv", path, format="csv").requests) == 1


def test_a_binary_file_is_an_input_error(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00binary")
    with pytest.raises(InputError, match="UTF-8"):
        load("azure_conv", path)


def mooncake_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


MOON_GOOD = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]})


def test_a_trace_of_another_kind_says_so_at_its_first_record(tmp_path):
    path = mooncake_file(tmp_path, MOON_GOOD, MOON_GOOD)  # a Mooncake trace given to azure_conv
    message = raises_at("azure_conv", path, 1, None, "the record has none of the fields",
                        format="jsonl")
    assert "(it has: timestamp, input_length, output_length, hash_ids)" in message


@pytest.mark.parametrize("bad, field, fragment", [
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]', None, "not valid JSON"),
    ('[1, 2]', None, "expected a JSON object"),
    ('{"timestamp": 1, "input_length": "abc', None, "(Unterminated string starting at column 34)"),
    ('{"timestamp": 1, "input_length": 600, "hash_ids": [0, 1]}', "output_length", "missing"),
    ('{"timestamp": 1, "input_length": "six", "output_length": 5, "hash_ids": [0, 1]}', "input_length",
     "not an integer"),
    ('{"timestamp": 1, "input_length": 600, "output_length": true, "hash_ids": [0, 1]}', "output_length",
     "not an integer"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0]}', "hash_ids",
     "wrong number of hash ids"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, -1]}', "hash_ids",
     "not a list of integers in [0, "),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 9223372036854775808]}',
     "hash_ids", "not a list of integers in [0, "),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 999999999999]}',
     "hash_ids", "(the ids 512-token blocks can take)"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": "0,1"}', "hash_ids",
     "not a list"),
    ('{"timestamp": "soon", "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "timestamp",
     "not a number"),
    # a key named twice: which value is meant cannot be told (as with a CSV column named twice)
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "input_length": 9, "hash_ids": [0, 1]}',
     None, "the key 'input_length' appears twice in one object"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": ' + "[" * 100_000
     + "]" * 100_000 + "}", None, "nested too deeply to read"),
])
def test_a_malformed_mooncake_line_names_file_line_and_field(tmp_path, bad, field, fragment):
    path = mooncake_file(tmp_path, MOON_GOOD, "", bad, MOON_GOOD)
    raises_at("mooncake", path, 3, field, fragment)
    workload = load("mooncake", path, on_error="skip")
    assert len(workload.requests) == 2 and workload.summary["rows"]["skipped"]["total"] == 1


def test_a_malformed_sharegpt_record_names_line_and_field(tmp_path):
    path = tmp_path / "sg.json"
    records = [{"conversations": [{"value": "hello there my friend"}, {"value": "hi how are you today"}]},
               {"conversations": [{"value": "hello there my friend"}, {"text": "no value"}]}]
    path.write_text(json.dumps(records, indent=1))
    raises_at("sharegpt", path, 12, "conversations[1].value", "missing or not a string")
    assert load("sharegpt", path, on_error="skip").summary["rows"]["skipped"]["total"] == 1
    path.write_text('{"conversations": []}')
    raises_at("sharegpt", path, 1, None, "expected a JSON array")
    path.write_text('[{"conversations": []}, {"conv')
    raises_at("sharegpt", path, 1, None, "not valid JSON")


def test_a_missing_parquet_column_names_the_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"p": [1, 2]}), path)
    raises_at("table", path, None, "o", "missing column", input_column="p", output_column="o")


# --- Property: random malformed rows never escape as anything but InputError ------------------

CELLS = st.one_of(
    st.integers(-5, 10**7).map(str), st.floats().map(repr), st.text(max_size=6), st.just(""),
    st.sampled_from(["1e3", " 7 ", "0x10", "NaN", "12.0", "-0", "9" * 30, "2023-11-16 18:15:46.6805900",
                     "2023-11-16 18:15:99", "NaT"]))
ROWS = st.lists(st.lists(CELLS, min_size=0, max_size=5), min_size=0, max_size=6)


def write_csv(path: Path, header: list[str], rows: list[list[str]], raw: bool) -> None:
    buffer = io.StringIO()
    if raw:  # no quoting: commas and newlines inside cells break the row structure
        buffer.write(",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows))
    else:
        writer = csv.writer(buffer)
        writer.writerow(header)
        writer.writerows(rows)
    path.write_text(buffer.getvalue())


def assert_only_input_error(name: str, path: Path, **overrides) -> None:
    try:
        workload = load(name, path, max_model_len=1 << 16, clip="truncate", **overrides)
    except InputError:
        return
    rows = workload.summary["rows"]
    assert rows["skipped"]["total"] == 0  # on_error=raise: nothing malformed got through silently


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, raw=st.booleans(), good_first=st.booleans())
def test_random_csv_rows_raise_only_input_errors(tmp_path, rows, raw, good_first):
    path = tmp_path / "fuzz.csv"
    if good_first:
        rows = [GOOD[0].split(",")] + rows
    write_csv(path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], rows, raw)
    assert_only_input_error("azure_conv", path)
    write_csv(path, ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"],
              rows, raw)
    try:
        load("burstgpt", path, max_model_len=1 << 16, clip="truncate")
    except InputError:
        pass
    except ConfigError as err:  # every row was a failure (zero response tokens): dropped, then none left
        assert "produced no requests" in str(err)


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 5000), st.floats(), st.text(max_size=4))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
RECORDS = st.lists(st.one_of(
    st.fixed_dictionaries({}, optional={"timestamp": JSON_VALUES, "input_length": JSON_VALUES,
                                        "output_length": JSON_VALUES, "hash_ids": JSON_VALUES}).map(json.dumps),
    st.builds(lambda t, n, o: json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                          "hash_ids": list(range(-(-n // 512)))}),
              st.integers(0, 10**6), st.integers(1, 3000), st.integers(1, 50)),
    st.text(max_size=20)), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=RECORDS)
def test_random_jsonl_records_raise_only_input_errors(tmp_path, lines):
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join(line.replace("\n", " ").replace("\r", " ") + "\n" for line in lines))
    assert_only_input_error("mooncake", path)
    assert_only_input_error("table", path, input_column="input_length", output_column="output_length",
                            timestamp_column="timestamp", timestamp_unit="ms", arrival={"process": "trace"})
    sharegpt = tmp_path / "fuzz_sg.jsonl"
    sharegpt.write_text("".join(json.dumps({"conversations": [{"value": line}, {"value": line[::-1]}]}) + "\n"
                                for line in lines))
    try:
        load("sharegpt", sharegpt, min_input_len=None, min_output_len=None)
    except InputError:
        pass
    except ConfigError as err:  # every conversation was empty text: filtered, then none left
        assert "produced no requests" in str(err)


@pytest.mark.parametrize("bad", [False, True])
def test_utc_offsets_are_read_as_utc_without_a_warning(tmp_path, bad, recwarn):
    """18:00:01+01:00 is 17:00:01 UTC: one second after the first row (also on the row-by-row
    path that a malformed row sends the column through)."""
    rows = ["2023-11-16 17:00:00Z,10,5", "2023-11-16 18:00:01+01:00,10,5"]
    if bad:
        rows.append("2023-11-16 17:00:02Z,x,5")
    workload = load("azure_conv", azure_file(tmp_path, *rows), on_error="skip")
    assert [r.arrival_time for r in workload.requests] == [0.0, 1.0]
    assert not [w for w in recwarn if "timezone" in str(w.message)]


def test_timestamps_centuries_apart_are_exact_not_overflowed(tmp_path):
    """More than 292 years apart, the nanosecond differences overflow int64: still exact."""
    path = azure_file(tmp_path, "1700-01-01 00:00:00,10,5", "2200-01-01 00:00:00.5,10,5")
    workload = load("azure_conv", path)
    days = (2200 - 1700) * 365 + 121  # leap days in 1700..2199 (not 1700, 1800, 1900, 2100)
    assert [r.arrival_time for r in workload.requests] == [0.0, days * 86400 + 0.5]


@pytest.mark.parametrize("rate, message", [
    (1e-308, r"^workload\.arrival\.rate: 1e-308 requests/s spreads 20 requests over inf s, beyond "
             r"what the clock resolves \(at most 9\.01e\+10 s, to 1e-05 s\)"),
    (1e-300, r"^workload\.arrival\.rate: 1e-300 requests/s spreads 20 requests over [\d.]+e\+301 s"),
    (1e-11, r"^workload\.arrival\.rate: 1e-11 requests/s spreads 20 requests over"),  # finite
    (1e300, r"^workload\.arrival\.rate: 1e\+300 requests/s puts arrivals closer than the "
            r"clock's 1e-05 s resolution; for requests that all arrive at once use "
            r"workload\.arrival\.process=offline")])
def test_an_arrival_rate_the_clock_cannot_resolve_is_a_config_error(rate, message):
    with pytest.raises(ConfigError, match=message):
        build_workload({**preset("sharegpt_like"), "num_requests": 20,
                        "arrival": {"process": "poisson", "rate": rate}}, seed=0, max_model_len=4096)
    build_workload({**preset("sharegpt_like"), "num_requests": 20,  # a slow but real rate
                    "arrival": {"process": "poisson", "rate": 1e-4}}, seed=0, max_model_len=4096)


def test_trace_times_stretched_beyond_the_clock_are_a_config_error(tmp_path):
    path = azure_file(tmp_path, "2020-01-01 00:00:00,10,5", "2020-01-01 00:00:01,10,5")
    with pytest.raises(ConfigError, match=r"a request arrives at t=1e\+11 s: .* beyond what the "
                                          r"clock resolves \(at most 9\.01e\+10 s"):
        load("azure_conv", path, arrival={"process": "trace", "time_scale": 1e11})


def test_an_absurd_mean_length_is_a_config_error_not_an_int64_overflow():
    with pytest.raises(ConfigError, match="output.mean: must be at most 2,147,483,648 tokens"):
        build_workload({**preset("sharegpt_like"), "num_requests": 20,
                        "output": {"mean": 1e19, "sigma": 0.5}}, seed=0, max_model_len=4096)


def test_a_timestamp_going_backwards_names_the_row_it_goes_back_from(tmp_path):
    """A jump forward (line 3, ten years on) makes the next rows go backwards: the message
    names line 3 too, the row to fix."""
    path = azure_file(tmp_path, "2023-11-16 18:15:46.0,10,5", "2033-11-16 18:15:47.0,10,5",
                      "2023-11-16 18:15:48.0,10,5")
    raises_at("azure_conv", path, 4, "TIMESTAMP",
              "'2023-11-16 18:15:48.0' is earlier than line 3's '2033-11-16 18:15:47.0'")


def test_a_json_array_trace_with_a_repeated_key_or_deep_nesting_names_the_record(tmp_path):
    path = tmp_path / "trace.json"
    good = {"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "ok"}]}
    path.write_text("[\n" + json.dumps(good) + ",\n" + '{"conversations": [], "conversations": []}'
                    + "\n]\n")
    raises_at("sharegpt", path, 3, None, "the key 'conversations' appears twice in one object")
    path.write_text("[\n" + json.dumps(good) + ",\n" + "[" * 100_000 + "]" * 100_000 + "\n]\n")
    raises_at("sharegpt", path, 3, None, "nested too deeply to read")


def test_an_unterminated_csv_quote_names_the_line_it_opens_on(tmp_path):
    path = azure_file(tmp_path, "2023-11-16 18:15:50.0,10,5", "", '"2023-11-16 18:15:51.0,10,5',
                      "2023-11-16 18:15:52.0,10,5", "2023-11-16 18:15:53.0,10,5")
    raises_at("azure_conv", path, 4, None, "unterminated quote: the quoted field that starts on "
                                           "this line is never closed")


def test_a_long_malformed_value_is_cut_in_the_error_line(tmp_path):
    path = azure_file(tmp_path, GOOD[0], "2023-11-16 18:15:52.0," + "9x" * 2300 + ",44")
    message = raises_at("azure_conv", path, 3, "ContextTokens", "not an integer: '9x9x")
    assert len(message) < 350 + len(str(path)) and "... (4,602 characters)" in message, message


def test_date_time_stamps_read_as_numbers_suggest_the_datetime_unit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t,p,o\n2023-11-16 18:15:46,10,5\n2023-11-16 18:15:50,10,5\n")
    table = {"kind": "table", "path": str(path), "input_column": "p", "output_column": "o",
             "timestamp_column": "t", "arrival": {"process": "trace"}}
    with pytest.raises(InputError) as info:
        build_workload(table, seed=0, max_model_len=1 << 16)
    assert str(info.value) == (f"{path}:2: field 't': not a number: '2023-11-16 18:15:46' (the "
                               "column holds date-times: set workload.timestamp_unit=datetime)")
    assert "on_error" not in str(info.value)
    build_workload({**table, "timestamp_unit": "datetime"}, seed=0, max_model_len=1 << 16)
