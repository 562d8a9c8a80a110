"""Config values of the wrong type, non-finite or out of range fail with a ConfigError that
names the key (exit status 2 on the command line), never a traceback or a silently wrong
run: booleans are real booleans ('no' is not false), integers are not booleans, numbers
are finite, the KV pool is one the device and the int32 slot numbers can hold, ``run``
names a mode, and arrival keys of another process are refused."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config.specs import (MAX_KV_SLOTS, RUN_MODES, CostSpec, EngineSpec, FittedCostSpec,
                            HardwareSpec, ModelSpec, SystemSpec, build_spec, check_run_options,
                            kv_capacity_slots)
from harness.errors import ConfigError
from harness.workloads import build_workload
from harness.workloads.spec import ArrivalSpec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def yaml_node(group: str, name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))


FITTED = {"model": "tiny", "num_layers": 2, "dtype": "float32", "step_overhead_s": 0.001,
          "per_token_s": 0.0, "per_attention_pair_s": 0.0, "per_kv_read_slot_s": 0.0,
          "per_seq_s": 0.0}
# A valid node of every spec and the key prefix its errors carry.
SPECS = {
    ModelSpec: (lambda: yaml_node("model", "llama-2-13b"), "model"),
    HardwareSpec: (lambda: yaml_node("hardware", "a100-80gb"), "hardware"),
    EngineSpec: (lambda: {}, "engine"),
    CostSpec: (lambda: {}, "engine.cost"),
    FittedCostSpec: (lambda: dict(FITTED), "hardware.fitted"),
    SystemSpec: (lambda: {"name": "paged", "kind": "paged", "block_size": 16}, "allocator.paged"),
}


def build(cls, **changes):
    make, where = SPECS[cls]
    return build_spec(cls, {**make(), **changes}, where)


def refused(cls, key: str, value, *fragments: str) -> str:
    where = SPECS[cls][1]
    with pytest.raises(ConfigError) as info:
        build(cls, **{key: value})
    message = str(info.value)
    assert message.startswith(f"{where}.{key}: "), message
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def typed_fields():
    """(spec, key, base type, optional) of every bool, int and float field of every spec."""
    for cls in SPECS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            args = set(typing.get_args(tp)) or {tp}
            optional = type(None) in args
            base = args - {type(None)}
            if len(base) == 1 and next(iter(base)) in (bool, int, float):
                yield cls, f.name, next(iter(base)), optional


TYPED = list(typed_fields())
WRONG = {bool: ["no", "yes", "maybe", "false", 0, 1, 1.0],
         int: [True, False, "7", "abc", 2.5, float("inf")],
         float: ["abc", "0.5", True, False, float("inf"), float("-inf"), float("nan")]}


def test_every_spec_has_typed_fields_to_check():
    kinds = {base for _, _, base, _ in TYPED}
    assert kinds == {bool, int, float} and len(TYPED) > 30


@pytest.mark.parametrize("cls, key, base, optional", TYPED,
                         ids=[f"{SPECS[c][1]}.{k}" for c, k, _, _ in TYPED])
def test_every_typed_key_refuses_values_of_another_type(cls, key, base, optional):
    for value in WRONG[base]:
        refused(cls, key, value)
    if not optional:
        refused(cls, key, None)


@pytest.mark.parametrize("cls, key", [
    (EngineSpec, "chunked_prefill"), (EngineSpec, "fast_forward"),
    (EngineSpec, "block_tables_on_device"), (SystemSpec, "prefix_caching"),
    (ModelSpec, "tied_embeddings")])
def test_boolean_keys_take_true_and_false_only(cls, key):
    for value in (True, False):
        assert getattr(build(cls, **{key: value}), key) is value
    message = refused(cls, key, "no", "must be true or false, got 'no'")
    assert "null" not in message


def test_batch_invariant_takes_true_false_or_null():
    for value in (True, False, None):
        assert build(EngineSpec, batch_invariant=value).batch_invariant is value
    refused(EngineSpec, "batch_invariant", "maybe", "must be true, false or null", "got 'maybe'")


def test_prefix_caching_no_does_not_label_a_prefix_cache():
    """'no' used to be truthy: the system ran, and was labelled, with a prefix cache."""
    refused(SystemSpec, "prefix_caching", "no")
    assert build(SystemSpec, prefix_caching=False).label == "paged (block 16)"


@pytest.mark.parametrize("key", ["max_num_seqs", "max_num_batched_tokens", "kv_capacity_slots",
                                 "max_model_len", "cpu_threads", "profile_activation_tokens"])
def test_integer_keys_refuse_booleans(key):
    refused(EngineSpec, key, True, "must be a positive integer", "got True")


@pytest.mark.parametrize("key, value", [
    ("gpu_memory_utilization", "abc"), ("swap_space_gib", "abc"), ("activation_reserve_gib", "abc"),
    ("wall_time_limit_s", "abc"), ("activation_reserve_gib", float("inf")),
    ("swap_space_gib", float("inf")), ("gpu_memory_utilization", float("nan"))])
def test_engine_numbers_of_the_wrong_type_or_not_finite_name_the_key(key, value):
    refused(EngineSpec, key, value, "must be")


def test_nested_cost_numbers_name_their_full_key():
    for value in ("abc", float("inf")):
        with pytest.raises(ConfigError, match=r"^engine\.cost\.step_overhead_s: must be a number >= 0"):
            build_spec(EngineSpec, {"cost": {"step_overhead_s": value}}, "engine")
    with pytest.raises(ConfigError, match=r"^engine\.cost: must be a mapping"):
        build_spec(EngineSpec, {"cost": 5}, "engine")


def test_an_infinite_memory_is_refused():
    refused(HardwareSpec, "memory_gib", float("inf"), "not finite")


def test_int_and_float_values_that_are_valid_still_build():
    engine = build(EngineSpec, gpu_memory_utilization=1, swap_space_gib=0, wall_time_limit_s=5,
                   kv_capacity_slots=4096, telemetry_interval_s=0)
    assert engine.gpu_memory_utilization == 1 and engine.kv_capacity_slots == 4096
    assert build(HardwareSpec, memory_gib=80).memory_gib == 80


# ---------------------------------------------------------------- KV pool bounds
def test_kv_capacity_slots_is_capped_at_int32_slot_numbers():
    assert build(EngineSpec, kv_capacity_slots=MAX_KV_SLOTS).kv_capacity_slots == MAX_KV_SLOTS
    for value in (MAX_KV_SLOTS + 1, 10**15, 99999999999999999999):
        refused(EngineSpec, "kv_capacity_slots", value, "must be at most 2,147,483,648", "int32")


def test_explicit_kv_capacity_must_fit_the_hardware_memory():
    model, hardware = build(ModelSpec), build(HardwareSpec)  # llama-2-13b, 80 GiB
    fits = int(hardware.memory_gib * 2**30 // model.bytes_per_slot)
    assert kv_capacity_slots(model, hardware, build(EngineSpec, kv_capacity_slots=fits)) == fits
    with pytest.raises(ConfigError) as info:
        kv_capacity_slots(model, hardware, build(EngineSpec, kv_capacity_slots=fits + 1))
    message = str(info.value)
    assert message.startswith(f"engine.kv_capacity_slots={fits + 1:,} is more KV than hardware=")
    assert f"at most {fits:,} slots fit" in message


def test_an_absurd_memory_cannot_derive_an_absurd_pool():
    model, engine = build(ModelSpec), build(EngineSpec)
    for memory in (1e300, 1e9):
        with pytest.raises(ConfigError, match=r"^hardware\.memory_gib=.* more than the 2,147,483,648"):
            kv_capacity_slots(model, build(HardwareSpec, memory_gib=memory), engine)
    assert kv_capacity_slots(model, build(HardwareSpec), engine) > 0


# ---------------------------------------------------------------- top-level keys
def test_run_must_name_a_mode():
    for mode in RUN_MODES:
        check_run_options({"run": mode, "progress": True})
    check_run_options({})  # the defaults
    for mode, fragment in (("train", "unknown run mode 'train'. Valid modes: serve, study, kernels"),
                           ("serv", "Did you mean 'serve'?"), (None, "unknown run mode None")):
        with pytest.raises(ConfigError) as info:
            check_run_options({"run": mode})
        assert str(info.value).startswith("run: ") and fragment in str(info.value)


@pytest.mark.parametrize("value", ["no", "yes", 0, 1, None])
def test_progress_must_be_a_boolean(value):
    with pytest.raises(ConfigError, match=r"^progress: must be true or false"):
        check_run_options({"run": "serve", "progress": value})


# ---------------------------------------------------------------- arrival keys
@pytest.mark.parametrize("key, value, process", [
    ("cv", 2.0, "gamma"), ("time_scale", 0.5, "trace"), ("target_rate", 3.0, "trace")])
def test_arrival_keys_of_another_process_are_refused(key, value, process):
    others = [p for p in ("poisson", "gamma", "offline", "trace") if p != process]
    for other in others:
        node = {"process": other, "rate": 2.0, "cv": 1.5 if other == "gamma" else None, key: value}
        with pytest.raises(ConfigError) as info:
            parse_spec(ArrivalSpec, node, "workload.arrival")
        message = str(info.value)
        assert message.startswith(f"workload.arrival.{key}: is used only with process={process}")
        assert f"arrival process is {other}" in message
    spec = parse_spec(ArrivalSpec, {"process": process, "rate": 2.0, key: value,
                                    **({"cv": value} if process == "gamma" else {})},
                      "workload.arrival")
    assert getattr(spec, key) == value


def test_the_presets_null_arrival_keys_still_build_and_rate_stays_optional():
    node = yaml_node("workload", "docqa")
    node.update(num_requests=5)
    assert node["arrival"]["cv"] is None and node["arrival"]["time_scale"] is None
    assert len(build_workload(node, seed=0, max_model_len=4096).requests) == 5
    # rate is ignored by offline, so process=offline needs no other change
    node["arrival"]["process"] = "offline"
    assert len(build_workload(node, seed=0, max_model_len=4096).requests) == 5
    node["arrival"].update(process="poisson", target_rate=3.0)
    with pytest.raises(ConfigError, match=r"^workload\.arrival\.target_rate: .*process=trace"):
        build_workload(node, seed=0, max_model_len=4096)


def test_a_trace_mixture_refuses_a_rescale_it_would_ignore():
    node = yaml_node("workload", "mixture")
    node["arrival"] = {"process": "trace", "time_scale": 0.5}
    with pytest.raises(ConfigError, match=r"^workload\.arrival\.time_scale: a mixture with process=trace"):
        build_workload(node, seed=0, max_model_len=4096)


# ---------------------------------------------------------------- the command line
CLI_CASES = {
    "bool_string": ("engine.chunked_prefill=no", "engine.chunked_prefill: must be true or false, got 'no'"),
    "bool_for_int": ("engine.max_num_seqs=true", "engine.max_num_seqs: must be a positive integer"),
    "string_number": ("engine.gpu_memory_utilization=abc",
                      "engine.gpu_memory_utilization: must be a number in (0, 1], got 'abc'"),
    "infinite_memory": ("hardware.memory_gib=1e400", "hardware.memory_gib: must be a positive number"),
    "huge_pool": ("engine.kv_capacity_slots=99999999999999999999",
                  "engine.kv_capacity_slots: must be at most 2,147,483,648"),
    "unknown_run_mode": ("run=train", "run: unknown run mode 'train'. Valid modes: serve, study, kernels"),
    "cv_on_poisson": ("workload.arrival.cv=2", "workload.arrival.cv: is used only with process=gamma"),
}


def test_the_cli_exits_2_with_one_line_naming_the_key(tmp_path, run_cli):
    procs = {name: run_cli.start(tmp_path / name, "workload=docqa", "workload.num_requests=20",
                                 "report=false", "progress=false", override)
             for name, (override, _) in CLI_CASES.items()}
    for name, proc in procs.items():
        result = run_cli.wait(proc)
        stdout, stderr = result.stdout, result.stderr
        expected = CLI_CASES[name][1]
        assert proc.returncode == 2, (name, stderr[-2000:])
        assert "Traceback" not in stdout + stderr, (name, stderr[-2000:])
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {expected}"), (name, stderr[-2000:])
        assert not (tmp_path / name / "results.json").exists()


def test_a_deleted_nested_spec_is_named_at_its_own_path():
    """``~workload.arrival`` leaves the arrival spec's defaults, which docqa's poisson process
    cannot run with: the error names workload.arrival.rate, not workload.rate."""
    from omegaconf import OmegaConf

    from harness.workloads.build import parse_workload

    data = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "workload" / "docqa.yaml"))
    del data["arrival"]
    with pytest.raises(ConfigError, match=r"^workload\.arrival\.rate: process=poisson needs a rate"):
        parse_workload(data)
