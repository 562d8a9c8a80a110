"""Trace loaders on small inline files and on the shared real traces (skipped if absent)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from harness.workloads.presets import load_preset
from harness.workloads import build_workload

CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"
TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25_conversation" / "conversation_trace.jsonl"
SHAREGPT_LENGTHS = TRACES / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def load(name: str, path, max_model_len: int = 1 << 17, seed: int = 0, **overrides):
    node = load_preset(name)
    node["path"] = str(path)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(node.get(key), dict):
            node[key] = {**node[key], **value}
        else:
            node[key] = value
    return build_workload(node, seed=seed, max_model_len=max_model_len)


def needs(path: Path):
    return pytest.mark.skipif(not path.is_file(), reason=f"shared trace {path.name} not present")


AZURE_SAMPLE = ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                "2023-11-16 18:15:46.6805900,374,44\r\n"
                "2023-11-16 18:15:50.9951690,396,109\r\n"
                "2023-11-16 18:15:51.2224670,879,55\r\n"
                "2023-11-16 18:15:51.3910170,91,16\r\n")


# --- Azure ------------------------------------------------------------------------------


def test_azure_sample_replays_timestamps_from_zero(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_SAMPLE, newline="")
    workload = load("azure_conv", path)
    assert [r.prompt_len for r in workload.requests] == [374, 396, 879, 91]
    assert [r.output_len for r in workload.requests] == [44, 109, 55, 16]
    assert [r.arrival_time for r in workload.requests] == pytest.approx([0, 4.314579, 4.541877, 4.710427])
    assert workload.requests[1].name == "azure.csv:3"
    assert workload.summary["rows"]["rows_read"] == 4


def test_time_scale_target_rate_and_window(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_SAMPLE, newline="")
    scaled = load("azure_conv", path, arrival={"time_scale": 0.5})
    assert scaled.requests[-1].arrival_time == pytest.approx(4.710427 / 2)
    rated = load("azure_conv", path, arrival={"target_rate": 3.0})
    assert rated.summary["mean_rate_rps"] == pytest.approx(3.0)
    windowed = load("azure_conv", path, start_s=1.0, end_s=4.6)
    assert [r.prompt_len for r in windowed.requests] == [396, 879]
    assert windowed.requests[0].arrival_time == pytest.approx(3.314579)  # relative to the window start
    assert windowed.summary["rows"]["filtered"]["by_reason"] == {"outside the time window": 2}
    poisson = load("azure_conv", path, arrival={"process": "poisson", "rate": 1.0})
    assert poisson.summary["arrival_process"] == "poisson"


def test_num_requests_filters_and_clip(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_SAMPLE, newline="")
    assert len(load("azure_conv", path, num_requests=2).requests) == 2
    filtered = load("azure_conv", path, max_input_len=400, min_output_len=20)
    assert [r.prompt_len for r in filtered.requests] == [374, 396]
    dropped = load("azure_conv", path, max_model_len=500)
    assert dropped.summary["rows"]["dropped"]["total"] == 2 and len(dropped.requests) == 2
    truncated = load("azure_conv", path, max_model_len=500, clip="truncate")
    assert [(r.prompt_len, r.output_len) for r in truncated.requests][1:3] == [(391, 109), (445, 55)]
    assert truncated.summary["rows"]["truncated"]["total"] == 2


@needs(AZURE_CONV)
def test_shared_azure_conv_loads_whole_and_matches_its_published_stats():
    workload = load("azure_conv", AZURE_CONV)
    s = workload.summary
    assert s["num_requests"] == 19366
    assert s["prompt_len"]["mean"] == pytest.approx(1154.7, abs=0.1)
    assert s["output_len"]["mean"] == pytest.approx(211.1, abs=0.1)
    assert s["arrival_span_s"] == pytest.approx(3501.7, abs=0.1)
    assert s["prompt_len"]["max"] == 14050


@needs(AZURE_CODE)
def test_shared_azure_code_loads_with_a_window_and_default_context():
    workload = load("azure_code", AZURE_CODE, max_model_len=4096, end_s=600)
    s = workload.summary
    assert 0 < s["num_requests"] < 8819 and s["arrival_span_s"] <= 600
    assert s["rows"]["filtered"]["total"] + s["rows"]["dropped"]["total"] + s["num_requests"] == 8819


# --- Mooncake ----------------------------------------------------------------------------


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


MOONCAKE_SAMPLE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 700, "output_length": 7, "hash_ids": [0, 3]},
    {"timestamp": 3000, "input_length": 1500, "output_length": 9, "hash_ids": [0, 1, 4]},
]


def test_mooncake_sample_derives_tokens_from_hash_ids(tmp_path):
    workload = load("mooncake", write_jsonl(tmp_path / "m.jsonl", MOONCAKE_SAMPLE))
    a, b, c = (r.prompt_token_ids for r in workload.requests)
    assert (len(a), len(b), len(c)) == (1100, 700, 1500)
    assert np.array_equal(a[:512], b[:512]) and np.array_equal(a[:1024], c[:1024])
    assert not np.intersect1d(a[512:], b[512:]).size  # hash 1/2 vs 3
    assert not np.intersect1d(a[1024:], c[1024:]).size  # hash 2 vs 4
    assert [r.arrival_time for r in workload.requests] == [0.0, 0.0, 3.0]


def test_mooncake_truncation_keeps_the_shared_head(tmp_path):
    workload = load("mooncake", write_jsonl(tmp_path / "m.jsonl", MOONCAKE_SAMPLE), max_model_len=1000,
                    clip="truncate")
    a, _, c = (r.prompt_token_ids for r in workload.requests)
    assert (len(a), len(c)) == (995, 991) and np.array_equal(a[:991], c)


@needs(MOONCAKE)
def test_shared_mooncake_loads_whole_with_real_reuse():
    workload = load("mooncake", MOONCAKE)
    s = workload.summary
    assert s["num_requests"] == 12031
    assert s["prompt_len"]["mean"] == pytest.approx(12035.1, abs=0.1)
    assert s["prompt_len"]["max"] == 126195
    assert s["arrival_span_s"] == pytest.approx(3537.0)
    first_blocks = {r.prompt_token_ids[:512].tobytes() for r in workload.requests}
    assert len(first_blocks) < 12031 / 2  # hash id 0 (and others) open many prompts


@needs(MOONCAKE)
def test_shared_mooncake_with_a_short_context_drops_and_counts():
    workload = load("mooncake", MOONCAKE, max_model_len=4096, num_requests=500)
    s = workload.summary
    assert s["rows"]["dropped"]["total"] + s["num_requests"] == 500 and s["rows"]["dropped"]["total"] > 0


# --- BurstGPT -----------------------------------------------------------------------------

BURST_SAMPLE = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                "5,ChatGPT,472,18,490,Conversation log\n"
                "45,ChatGPT,1087,0,1087,Conversation log\n"
                "118,GPT-4,417,30,447,Conversation log\n"
                "130,ChatGPT,200,12,212,API log\n")


def test_burstgpt_drops_failures_and_filters_model_and_log_type(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURST_SAMPLE)
    workload = load("burstgpt", path)
    assert [r.prompt_len for r in workload.requests] == [472, 417, 200]
    assert workload.summary["rows"]["filtered"]["by_reason"] == {"failed request (zero response tokens)": 1}
    assert [r.arrival_time for r in workload.requests] == [0, 113, 125]
    chat = load("burstgpt", path, models=["ChatGPT"], log_types=["Conversation log"])
    assert [r.prompt_len for r in chat.requests] == [472]
    assert chat.summary["rows"]["filtered"]["total"] == 3


# --- ShareGPT -------------------------------------------------------------------------------

SHAREGPT_SAMPLE = [
    {"id": "a", "conversations": [{"from": "human", "value": "Write a haiku about paged memory please."},
                                  {"from": "gpt", "value": "Blocks of quiet state, tables point where tokens "
                                                           "sleep, no byte left behind."}]},
    {"id": "b", "conversations": [{"from": "human", "value": "Hi"}]},  # one turn: skipped
    {"id": "c", "conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "ok"}]},
    {"id": "d", "conversations": [{"from": "human", "value": "Explain copy on write in two sentences."},
                                  {"from": "gpt", "value": "Pages are shared until one writer changes "
                                                           "them. Then it gets its own copy."},
                                  {"from": "human", "value": "thanks"}]},
]


def test_sharegpt_reads_first_two_turns_with_vllm_filters(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT_SAMPLE, indent=1))
    workload = load("sharegpt", path)
    assert len(workload.requests) == 2  # b: one turn; c: under 4 tokens
    by_reason = workload.summary["rows"]["filtered"]["by_reason"]
    assert by_reason["fewer than 2 turns"] == 1
    assert by_reason["input_len < min_input_len=4"] == 1
    assert [r.name for r in workload.requests] == ["sg.json:2", "sg.json:37"]
    assert all(8 <= r.prompt_len <= 14 and 12 <= r.output_len <= 25 for r in workload.requests)
    jsonl = tmp_path / "sg.jsonl"
    write_jsonl(jsonl, SHAREGPT_SAMPLE)
    assert [r.prompt_len for r in load("sharegpt", jsonl).requests] == [r.prompt_len for r in workload.requests]


def test_sharegpt_unknown_tokenizer_fails_clearly(tmp_path):
    from harness.errors import ConfigError

    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT_SAMPLE))
    with pytest.raises(ConfigError, match="workload.tokenizer"):
        load("sharegpt", path, tokenizer="no-such/tokenizer-here")


def test_approx_tokenizer_is_about_four_characters_per_token():
    from harness.workloads.tokenizers import ApproxTokenizer

    text = ("The quick brown fox jumps over the lazy dog. PagedAttention stores the KV cache in "
            "fixed-size blocks, like pages of virtual memory, and maps them with a block table.")
    (count,) = ApproxTokenizer().count([text])
    assert len(text) / 5 < count < len(text) / 3
    assert ApproxTokenizer().count(["The quick brown fox jumps over the lazy dog."]) == [10]


# --- Generic table ---------------------------------------------------------------------------


def table_rows():
    return [{"p": 10, "o": 3, "t": 1000}, {"p": 20, "o": 4, "t": 1500}, {"p": 30, "o": 5, "t": 4000}]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json", "parquet", "csv.gz"])
def test_table_reads_every_format_with_timestamps(tmp_path, fmt):
    rows = table_rows()
    path = tmp_path / f"lengths.{fmt}"
    if fmt == "csv":
        path.write_text("p,o,t\n" + "".join(f"{r['p']},{r['o']},{r['t']}\n" for r in rows))
    elif fmt == "csv.gz":
        with gzip.open(path, "wt") as f:
            f.write("p,o,t\n" + "".join(f"{r['p']},{r['o']},{r['t']}\n" for r in rows))
    elif fmt == "jsonl":
        write_jsonl(path, rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    workload = load("table", path, input_column="p", output_column="o", timestamp_column="t",
                    timestamp_unit="ms", arrival={"process": "trace"})
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(10, 3), (20, 4), (30, 5)]
    assert [r.arrival_time for r in workload.requests] == pytest.approx([0, 0.5, 3.0])


def test_table_without_timestamps_uses_the_arrival_process(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("p,o\n10,3\n20,4\n")
    offline = load("table", path, input_column="p", output_column="o", arrival={"process": "offline"})
    assert [r.arrival_time for r in offline.requests] == [0, 0]
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="workload.arrival.process"):
        load("table", path, input_column="p", output_column="o", arrival={"process": "trace"})


@needs(SHAREGPT_LENGTHS)
def test_shared_sharegpt_lengths_with_vllm_filters_match_the_source_note():
    workload = load("sharegpt_lengths", SHAREGPT_LENGTHS, max_model_len=4096, num_requests=None,
                    min_input_len=4, min_output_len=4, max_input_len=1024, max_total_len=2048)
    s = workload.summary
    assert s["num_requests"] == 11035
    assert s["prompt_len"]["mean"] == pytest.approx(378.0, abs=0.1)
    assert s["output_len"]["mean"] == pytest.approx(418.9, abs=0.1)


@needs(AZURE_CONV)
def test_same_seed_reproduces_a_trace_workload():
    a = load("azure_conv", AZURE_CONV, num_requests=300, seed=4)
    b = load("azure_conv", AZURE_CONV, num_requests=300, seed=4)
    assert all(np.array_equal(x.prompt_token_ids, y.prompt_token_ids) for x, y in zip(a.requests, b.requests))
