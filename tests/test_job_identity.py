"""A job's identity (config hash, a sweep's reuse key) follows the content of every file the
run reads: an edited profile, kernel_results or checkpoint config.json is another job."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.errors import InputError
from harness.run import job_identity as results_module
from harness.run.job_identity import input_files
from harness.run.job_identity import config_hash
from harness.run.reuse import system_input_key

HOST = "name: mine\ncomponents:\n  sched: {per_step_s: 0.001, per_seq_s: 0.0001}\n"
KERNEL = "name: mine\npoints:\n  - {layout: paged, efficiency: 0.5}\n  - {layout: contiguous, efficiency: 0.9}\n"


def _edited(cfg: dict, file: Path, text: str) -> tuple[str, str]:
    before = config_hash(cfg)
    file.write_text(text)
    return before, config_hash(cfg)


def test_an_edited_host_profile_file_is_another_job(tmp_path):
    profile = tmp_path / "host.yaml"
    profile.write_text(HOST)
    cfg = {"engine": {"cost": {"host_profile": str(profile)}}}
    before, after = _edited(cfg, profile, HOST.replace("0.001", "0.05"))
    assert before != after


def test_an_edited_kernel_profile_file_is_another_job(tmp_path):
    profile = tmp_path / "kernel.yaml"
    profile.write_text(KERNEL)
    cfg = {"engine": {"cost": {"kernel_profile": str(profile), "kernel_results": None}}}
    before, after = _edited(cfg, profile, KERNEL.replace("0.5", "0.2"))
    assert before != after
    hardware = {"hardware": {"kernel_profile": str(profile)}}  # the hardware's profile, too
    before, after = _edited(hardware, profile, KERNEL)
    assert before != after


def test_edited_kernel_results_are_another_job_named_directly_or_by_the_profile(tmp_path):
    rows = tmp_path / "kernel_results.json"
    rows.write_text(json.dumps({"rows": [{"batch": 1}]}))
    direct = {"engine": {"cost": {"kernel_profile": "measured", "kernel_results": str(rows)}}}
    before, after = _edited(direct, rows, json.dumps({"rows": [{"batch": 2}]}))
    assert before != after
    profile = tmp_path / "measured_here.yaml"
    profile.write_text(f"name: m\nsource: kernel_results\npath: {rows}\n")
    by_profile = {"engine": {"cost": {"kernel_profile": str(profile), "kernel_results": None}}}
    before, after = _edited(by_profile, rows, json.dumps({"rows": [{"batch": 3}]}))
    assert before != after


def test_an_edited_checkpoint_config_or_weights_index_is_another_job(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    cfg = {"model": {"name": None, "path": str(checkpoint)}}
    before, after = _edited(cfg, checkpoint / "config.json", json.dumps({"num_hidden_layers": 80}))
    assert before != after
    index = checkpoint / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "1.safetensors"}}))
    before, after = _edited(cfg, index, json.dumps({"weight_map": {"a": "2.safetensors"}}))
    assert before != after


def test_a_sweeps_reuse_key_follows_the_files_too(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class System:
        name: str = "paged"

    profile = tmp_path / "host.yaml"
    profile.write_text(HOST)
    cfg = {"block_size": 16, "engine": {"cost": {"host_profile": str(profile)}}}
    before = system_input_key(cfg, System(), 100)
    profile.write_text(HOST.replace("0.001", "0.002"))
    assert system_input_key(cfg, System(), 100) != before


def test_the_programs_own_profiles_leave_a_default_hash_as_it_was():
    # conf/ is versioned with the code: naming a profile of it adds no file to the hash
    cfg = {"engine": {"cost": {"kernel_profile": None, "host_profile": "vidur_a100_llama2_7b_tp1"}},
           "hardware": {"kernel_profile": "ideal"}, "systems": ["paged"]}
    assert input_files(cfg) == []
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    assert config_hash(cfg) == hashlib.sha256(text.encode()).hexdigest()


def test_a_value_that_is_not_under_a_file_key_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "paged").write_text("a file named like a system")
    assert input_files({"systems": ["paged"], "workload": {"name": "paged"}}) == []


def test_an_input_file_that_cannot_be_read_is_named_with_the_reason(tmp_path, monkeypatch):
    trace = tmp_path / "trace.csv"
    trace.write_text("p,o\n1,1\n")

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(results_module, "file_sha256", denied)
    results_module._input_sha256.cache_clear()
    with pytest.raises(InputError, match=rf"{trace}: cannot read it: Permission denied"):
        config_hash({"workload": {"path": str(trace)}})
    results_module._input_sha256.cache_clear()


def test_the_cli_runs_again_after_its_host_profile_file_is_edited(tmp_path, run_cli):
    profile = tmp_path / "host.yaml"
    profile.write_text(HOST)
    args = ["workload=docqa", "workload.num_requests=10", "progress=false", "report=false",
            "systems=[paged]", f"engine.cost.host_profile={profile}"]
    first = run_cli(tmp_path / "run", *args)
    assert first.returncode == 0, first.stderr
    assert "skipped:" in run_cli(tmp_path / "run", *args).stderr
    profile.write_text(HOST.replace("0.001", "0.05"))
    edited = run_cli(tmp_path / "run", *args)
    assert edited.returncode == 0 and "skipped:" not in edited.stderr, edited.stderr
