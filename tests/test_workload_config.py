"""Bad workload configs fail with a ConfigError that names the key and says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.workloads import build_workload

CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"


def preset(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))


def fails(node, *fragments, max_model_len=4096):
    with pytest.raises(ConfigError) as info:
        build_workload(node, seed=0, max_model_len=max_model_len)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


def test_accepts_an_omegaconf_node_as_hydra_passes_it():
    node = OmegaConf.load(CONF / "docqa.yaml")
    assert len(build_workload(node, seed=0, max_model_len=4096).requests) == node.num_requests


def test_unknown_key_lists_the_allowed_keys():
    node = {**preset("docqa"), "num_request": 3}
    fails(node, "workload.num_request", "unknown key", "num_requests")


def test_unknown_nested_key_names_its_path():
    node = preset("docqa")
    node["arrival"]["rat"] = 2
    fails(node, "workload.arrival.rat", "unknown key", "rate")


def test_unknown_kind_lists_the_kinds():
    fails({**preset("docqa"), "kind": "docqq"}, "workload.kind", "docqa", "mooncake")


@pytest.mark.parametrize("key, value, fragment", [
    ("num_requests", 0, "workload.num_requests"),
    ("num_requests", -3, "workload.num_requests"),
    ("num_requests", 1.5, "workload.num_requests: must be an integer"),
    ("clip", "cut", "workload.clip: must be one of drop, truncate"),
    ("num_samples", 0, "workload.num_samples"),
    ("num_documents", 0, "workload.num_documents"),
    ("system_prompt_len", "long", "workload.system_prompt_len: must be an integer"),
])
def test_invalid_top_level_values_name_the_key(key, value, fragment):
    fails({**preset("docqa"), key: value}, fragment)


def test_negative_rate_names_the_key():
    node = preset("docqa")
    node["arrival"]["rate"] = -1.0
    fails(node, "workload.arrival.rate", "> 0")


def test_gamma_needs_a_cv_and_poisson_a_rate():
    node = preset("docqa")
    node["arrival"] = {"process": "gamma", "rate": 2.0}
    fails(node, "workload.arrival.cv", "workload.arrival.cv=")
    node["arrival"] = {"process": "poisson"}
    fails(node, "workload.arrival.rate", "workload.arrival.rate=")
    node["arrival"] = {"process": "poison", "rate": 1.0}
    fails(node, "workload.arrival.process", "poisson, gamma, offline, trace")


def test_trace_arrivals_on_a_synthetic_workload_explain_the_alternatives():
    node = preset("docqa")
    node["arrival"]["process"] = "trace"
    fails(node, "workload.arrival.process", "poisson")


def test_bad_length_distribution_names_the_nested_key():
    node = preset("docqa")
    node["document"]["sigma"] = -0.5
    fails(node, "workload.document.sigma")
    node = preset("docqa")
    node["document"] = {"mean": 100, "min": 50, "max": 10}
    fails(node, "workload.document.max")


def test_sampling_and_beam_search_cannot_be_combined():
    fails({**preset("parallel_sampling"), "beam_width": 2}, "workload.beam_width")


def test_a_trace_preset_without_a_path_says_how_to_set_it():
    message = fails(preset("azure_conv"), "workload.path is required", "workload.path=")
    assert "???" not in message.split("required")[0]


def test_a_missing_file_names_the_path_key(tmp_path):
    fails({**preset("azure_conv"), "path": str(tmp_path / "nope.csv")}, "workload.path", "no such file")


def test_window_and_rate_options_are_validated():
    fails({**preset("azure_conv"), "path": "x.csv", "start_s": 10, "end_s": 5}, "workload.end_s")
    node = preset("azure_conv")
    node["path"] = "x.csv"
    node["arrival"].update(time_scale=2.0, target_rate=3.0)
    fails(node, "workload.arrival.target_rate", "not both")


def test_mixture_component_errors_name_the_component():
    node = preset("mixture")
    node["components"] = [{"weight": 1, "preset": "docqa", "num_documents": -1}]
    fails(node, "workload.components[0].num_documents")
    node["components"] = [{"weight": 0, "preset": "docqa"}]
    fails(node, "workload.components[0].weight")
    node["components"] = [{"weight": 1, "preset": "nonesuch"}]
    fails(node, "workload.components[0].preset", "docqa")


def test_max_model_len_must_be_sensible():
    with pytest.raises(ConfigError, match="max_model_len"):
        build_workload(preset("fixed"), seed=0, max_model_len=1)


def test_a_timestamp_column_under_an_arrival_process_that_ignores_it_is_refused():
    from harness.errors import ConfigError
    from harness.workloads.build import parse_workload

    table = {"kind": "table", "path": "t.csv", "input_column": "i", "output_column": "o",
             "timestamp_column": "t", "arrival": {"process": "poisson", "rate": 1.0}}
    with pytest.raises(ConfigError, match=r"workload\.timestamp_column: is read only with "
                                          r"arrival\.process=trace .*this arrival process is "
                                          r"poisson, which ignores the trace's times"):
        parse_workload(table)
    parse_workload({**table, "arrival": {"process": "trace"}})  # replayed
    parse_workload({**table, "start_s": 10.0})  # a time window reads it
