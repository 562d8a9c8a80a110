"""Synthetic workloads: reproducibility, prefix structure, lengths, arrivals, mixtures, summaries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from harness.workloads.presets import load_preset
from harness.workloads import KINDS, build_workload

CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"
SYNTHETIC = ["docqa", "sharegpt_like", "alpaca_like", "fixed", "chat", "shared_prefix",
             "parallel_sampling", "beam_search", "mixture"]


def preset(name: str, **overrides) -> dict:
    node = load_preset(name)
    for key, value in overrides.items():
        node[key] = value
    return node


def build(name_or_node, seed: int = 0, max_model_len: int = 4096, **overrides):
    node = preset(name_or_node, **overrides) if isinstance(name_or_node, str) else name_or_node
    return build_workload(node, seed=seed, max_model_len=max_model_len)


def fingerprint(workload) -> list:
    return [(r.request_id, r.arrival_time, r.prompt_token_ids.tobytes(), r.output_len, r.num_samples,
             r.beam_width, r.name) for r in workload.requests]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_same_seed_reproduces_the_workload_exactly(name):
    assert fingerprint(build(name, seed=7)) == fingerprint(build(name, seed=7))


@pytest.mark.parametrize("name", SYNTHETIC)
def test_a_different_seed_gives_different_tokens(name):
    a, b = build(name, seed=1), build(name, seed=2)
    assert a.requests[0].prompt_token_ids.tobytes() != b.requests[0].prompt_token_ids.tobytes()


@pytest.mark.parametrize("name", SYNTHETIC)
def test_requests_are_sorted_numbered_readonly_and_summarised(name):
    workload = build(name)
    times = [r.arrival_time for r in workload.requests]
    assert times == sorted(times)
    assert [r.request_id for r in workload.requests] == list(range(len(workload.requests)))
    for r in workload.requests:
        assert r.prompt_token_ids.dtype == np.int32 and r.prompt_token_ids.ndim == 1
        assert not r.prompt_token_ids.flags.writeable
        assert 0 <= r.prompt_token_ids.min() and r.prompt_token_ids.max() < 2**30
    summary = json.loads(json.dumps(workload.summary))  # JSON-safe
    assert summary["num_requests"] == len(workload.requests) == preset(name)["num_requests"]
    for key in ("prompt_len", "output_len"):
        assert set(summary[key]) == {"mean", "p50", "p99", "max"}
    assert {"total_tokens", "arrival_span_s", "mean_rate_rps", "rows"} <= set(summary)


def test_every_preset_names_a_registered_kind_and_itself():
    for path in CONF.glob("*.yaml"):
        node = load_preset(path)
        assert node["name"] == path.stem
        assert node["kind"] in KINDS


def test_docqa_shares_the_system_prompt_and_reuses_documents():
    node = preset("docqa")
    workload = build(node)
    system = node["system_prompt_len"]
    first = workload.requests[0].prompt_token_ids[:system]
    by_doc: dict[str, list] = {}
    for r in workload.requests:
        assert np.array_equal(r.prompt_token_ids[:system], first)
        by_doc.setdefault(r.name.split("/")[1], []).append(r)
    assert len(by_doc) <= node["num_documents"]
    reused = [rs for rs in by_doc.values() if len(rs) > 1]
    assert len(reused) >= node["num_documents"] // 2
    for requests in reused:
        a, b = requests[0].prompt_token_ids, requests[1].prompt_token_ids
        common = int(np.argmin(a[:min(len(a), len(b))] == b[:min(len(a), len(b))]))
        assert common > system  # the document is shared too ...
        assert not np.array_equal(a[-4:], b[-4:])  # ... and the questions are not
    # Requests on different documents share only the system prompt.
    docs = list(by_doc.values())
    a, b = docs[0][0].prompt_token_ids, docs[1][0].prompt_token_ids
    assert a[system] != b[system]
    assert max(r.output_len for r in workload.requests) <= node["answer"]["max"]


def test_unrelated_requests_share_no_token_ids():
    workload = build("sharegpt_like")
    ids = np.concatenate([r.prompt_token_ids for r in workload.requests])
    assert len(np.unique(ids)) == len(ids)


def test_shared_prefix_uses_the_configured_prefixes():
    workload = build("shared_prefix")
    prefixes = {}
    for r in workload.requests:
        which = r.name.split("/")[1]
        length = (80, 341)[int(which[1:])]
        prefixes.setdefault(which, r.prompt_token_ids[:length])
        assert np.array_equal(r.prompt_token_ids[:length], prefixes[which])
        assert r.prompt_len > length
    assert set(prefixes) == {"p0", "p1"}


def test_chat_turns_contain_the_previous_turn_and_its_output():
    workload = build("chat")
    sessions: dict[str, list] = {}
    for r in workload.requests:
        sessions.setdefault(r.name.split("/")[1], []).append(r)
        assert r.output_token_ids is not None and len(r.output_token_ids) == r.output_len
    multi = [turns for turns in sessions.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        turns.sort(key=lambda r: int(r.name.split("/t")[1]))
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.arrival_time > prev.arrival_time
            k = prev.prompt_len
            assert np.array_equal(nxt.prompt_token_ids[:k], prev.prompt_token_ids)
            assert np.array_equal(nxt.prompt_token_ids[k:k + prev.output_len], prev.output_token_ids)


def test_parallel_sampling_and_beam_search_set_the_request_fields():
    assert {r.num_samples for r in build("parallel_sampling").requests} == {4}
    beams = build("beam_search").requests
    assert {r.beam_width for r in beams} == {4} and {r.num_samples for r in beams} == {1}
    summary = build("parallel_sampling").summary
    assert summary["max_num_samples"] == 4


@pytest.mark.parametrize("name, mean_in, mean_out", [("sharegpt_like", 161.31, 337.99),
                                                     ("alpaca_like", 19.31, 58.45)])
def test_lognormal_lengths_match_the_published_means(name, mean_in, mean_out):
    summary = build(name, num_requests=20000).summary
    assert summary["prompt_len"]["mean"] == pytest.approx(mean_in, rel=0.05)
    assert summary["output_len"]["mean"] == pytest.approx(mean_out, rel=0.05)
    assert summary["prompt_len"]["p50"] < mean_in  # right-skewed


def test_fixed_lengths_and_offline_arrivals():
    workload = build("fixed")
    assert {(r.prompt_len, r.output_len, r.arrival_time) for r in workload.requests} == {(512, 128, 0.0)}


def _gaps(node) -> np.ndarray:
    times = np.array([r.arrival_time for r in build(node).requests])
    return np.diff(times)


def test_poisson_and_gamma_arrivals_have_the_configured_rate_and_burstiness():
    base = preset("fixed", num_requests=20000, prompt_len=1)
    poisson = _gaps({**base, "arrival": {"process": "poisson", "rate": 4.0}})
    assert 1 / poisson.mean() == pytest.approx(4.0, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)
    gamma = _gaps({**base, "arrival": {"process": "gamma", "rate": 4.0, "cv": 3.0}})
    assert 1 / gamma.mean() == pytest.approx(4.0, rel=0.1)
    assert gamma.std() / gamma.mean() == pytest.approx(3.0, rel=0.1)


def test_mixture_splits_by_weight_and_components_never_share_ids():
    node = preset("mixture")
    workload = build(node)
    counts = workload.summary["components"]
    assert sum(counts.values()) == node["num_requests"]
    assert sorted(counts.values()) == [80, 120, 200]
    docqa_ids = np.concatenate([r.prompt_token_ids for r in workload.requests if r.name.startswith("docqa")])
    other_ids = np.concatenate([r.prompt_token_ids for r in workload.requests if not r.name.startswith("docqa")])
    assert not np.intersect1d(docqa_ids, other_ids).size
    assert {r.num_samples for r in workload.requests} == {1, 4}


def test_mixture_accepts_inline_components_and_overrides():
    node = preset("mixture", components=[
        {"weight": 1, "kind": "fixed", "num_requests": 1, "prompt_len": 5, "output_len": 2,
         "arrival": {"process": "offline"}},
        {"weight": 1, "preset": "docqa", "system_prompt_len": 7}])
    workload = build(node)
    assert {r.prompt_len for r in workload.requests if r.name.startswith("fixed")} == {5}
    assert len(workload.requests) == node["num_requests"]


def test_clip_drop_and_truncate_are_counted():
    dropped = build("sharegpt_like", max_model_len=512)
    assert 0 < dropped.summary["rows"]["dropped"]["total"] < 500
    assert len(dropped.requests) + dropped.summary["rows"]["dropped"]["total"] == 500
    assert max(r.prompt_len + r.output_len for r in dropped.requests) <= 512
    truncated = build("fixed", max_model_len=600, clip="truncate")
    assert truncated.summary["rows"]["truncated"]["total"] == 200
    assert {(r.prompt_len, r.output_len) for r in truncated.requests} == {(472, 128)}


def test_a_workload_with_no_requests_left_fails_clearly():
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="produced no requests"):
        build("fixed", max_model_len=600)


def test_mixture_takes_a_global_preset_as_a_component(tmp_path):
    """mooncake.yaml is a global preset (it also selects a model): its workload node is the
    component."""
    trace = tmp_path / "moon.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 600, "output_length": 5,
                                         "hash_ids": [0, t + 1]}) + "\n" for t in range(4)))
    node = preset("mixture", num_requests=4, components=[
        {"weight": 1, "preset": "mooncake", "path": str(trace)}])
    workload = build(node)
    assert [r.prompt_len for r in workload.requests] == [600] * 4
