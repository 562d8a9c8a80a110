"""Bad command-line and file inputs get one clear line and exit status 2, never a traceback.

Covers the kernel benchmark's ``kernel_bench`` spec (and ``python -m harness
experiment=kernels``), ``--device`` / ``--seed`` of ``harness.tools.hostcost`` and
``harness.tools.calibrate``, a malformed ``study.json`` under ``python -m pagebench.reports``, a duplicated
trace column, and an unknown name for ``python -m harness.tools.traces fetch``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.errors import ConfigError, InputError, PagebenchError
from pagebench.kernels.bench_spec import KernelBenchSpec

ROOT = Path(__file__).resolve().parents[1]
KERNELS_YAML = ROOT / "conf" / "experiment" / "kernels.yaml"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def _kernel_bench() -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(KERNELS_YAML).kernel_bench, resolve=True)


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:") or ": error:" in line]
    assert len(lines) == 1, stderr
    return lines[0]


# --- the kernel benchmark's spec -------------------------------------------------------------


@pytest.mark.parametrize("key,value", [
    ("batch_sizes", [0]),
    ("batch_sizes", []),
    ("batch_sizes", 8),
    ("context_lens", [-1]),
    ("device", "tpu"),
    ("dtypes", ["int8"]),
    ("dtypes", "float16"),
    ("block_order", "zigzag"),
    ("baselines", ["bogus"]),
    ("head_configs", []),
    ("head_configs", "llama"),
    ("cpu_repeats", 0),
    ("cpu_repeats", "five"),
    ("cpu_threads", 0),
    ("warmup_ms", -1),
    ("rep_ms", 0),
    ("copy_bytes", 0),
    ("seed", -1),
    ("num_splits", 0),
    ("tile_size", 24),
    ("num_stages", 9),
    ("flex_block_sizes", [0]),
    ("reference_max_tokens", -1),
    ("time_budget_s", 0),
    ("cpu", [1]),
])
def test_every_bad_kernel_bench_value_is_a_config_error_naming_its_key(key, value):
    with pytest.raises(ConfigError, match=rf"^kernel_bench\.{key}\b"):
        KernelBenchSpec.from_mapping({**_kernel_bench(), key: value})


def test_kernel_bench_errors_are_config_errors_the_clis_turn_into_exit_status_2():
    assert issubclass(ConfigError, PagebenchError) and issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("head,match", [
    ({"name": "h", "num_heads": 4, "num_kv_heads": 3, "head_dim": 64}, r"\[h\]: num_heads \(4\) must be a multiple"),
    ({"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 0}, r"\[h\]\.head_dim must be a positive int"),
    ({"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 512}, r"\[h\]\.head_dim must be at most 256"),
    ({"name": "h", "num_heads": 4}, r"\[h\]: missing num_kv_heads, head_dim"),
    ({"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "layers": 2}, r"unknown key 'layers'"),
    ({"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "hidden_size": 256},
     r"hidden_size set without intermediate_size, num_layers"),
    ({"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "mlp": "relu"}, r"\.mlp must be"),
    (7, r"entry 7 is not a mapping"),
])
def test_bad_head_configs_name_the_entry(head, match):
    with pytest.raises(ConfigError, match=r"^kernel_bench\.head_configs.*" + match):
        KernelBenchSpec.from_mapping({**_kernel_bench(), "head_configs": [head]})


def test_duplicate_head_config_names_are_refused():
    head = {"name": "h", "num_heads": 4, "num_kv_heads": 2, "head_dim": 64}
    with pytest.raises(ConfigError, match="kernel_bench.head_configs names must be unique"):
        KernelBenchSpec.from_mapping({**_kernel_bench(), "head_configs": [head, head]})


def test_unknown_keys_suggest_the_close_one():
    with pytest.raises(ConfigError, match=r"kernel_bench: unknown key 'cpu_repeat'\. Did you mean 'cpu_repeats'\?"):
        KernelBenchSpec.from_mapping({**_kernel_bench(), "cpu_repeat": 3})


@pytest.mark.parametrize("cpu,match", [
    ({"batch_sizes": [0]}, r"^kernel_bench\.cpu\.batch_sizes must be"),
    ({"cpu_repeats": 0}, r"^kernel_bench\.cpu\.cpu_repeats must be"),
    ({"dtypes": ["int8"]}, r"^kernel_bench\.cpu\.dtypes must be"),
    ({"batch_size": [1]}, r"^kernel_bench\.cpu: unknown key 'batch_size'"),
    ({"cpu": {}}, r"^kernel_bench\.cpu: unknown key 'cpu'"),
])
def test_bad_cpu_overrides_are_named_as_such_and_refused_on_any_device(cpu, match):
    spec = _kernel_bench()
    spec["cpu"] = {**spec["cpu"], **cpu}
    with pytest.raises(ConfigError, match=match):
        KernelBenchSpec.from_mapping(spec)  # at construction: a GPU run refuses it too


def test_the_shipped_spec_and_its_cpu_overrides_stay_valid():
    spec = KernelBenchSpec.from_mapping(_kernel_bench())
    cpu = spec.for_device(torch.device("cpu"))
    assert cpu.batch_sizes == (1, 4) and cpu.cpu is None
    assert spec.for_device(torch.device("cuda")) is spec


def test_a_bad_spec_is_refused_before_anything_is_measured_or_written(tmp_path):
    from pagebench.kernels.benchmark import run_kernel_benchmark

    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="kernel_bench.cpu_repeats"):
        run_kernel_benchmark({**_kernel_bench(), "device": "cpu", "cpu_repeats": 0}, out, progress=False)
    assert not out.exists()


@NO_CUDA
def test_kernel_bench_device_cuda_without_a_gpu_is_a_config_error(tmp_path):
    from pagebench.kernels.benchmark import main, run_kernel_benchmark

    with pytest.raises(ConfigError, match="kernel_bench.device=cuda but no CUDA device"):
        run_kernel_benchmark({**_kernel_bench(), "device": "cuda"}, tmp_path / "out", progress=False)
    assert main(["--device", "cuda", "--out", str(tmp_path / "cli"), "--quiet"]) == 2


def test_harness_kernels_experiment_refuses_a_bad_value_with_exit_status_2(tmp_path, run_cli):
    # (run in tmp_path: Hydra writes its default outputs/<date>/<time> there)
    proc = run_cli(None, "experiment=kernels", "kernel_bench.device=tpu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = _one_error_line(proc.stderr)
    assert line.startswith("error: kernel_bench.device must be one of auto, cuda, cpu, got 'tpu'")
    assert not list(tmp_path.rglob("kernel_results.json"))


# --- --device and --seed of harness.tools.hostcost / harness.tools.calibrate ------------------------------


def _argparse_exit(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:", "gpu"])
def test_hostcost_refuses_an_unknown_device_as_a_usage_error(device, capsys):
    from harness.tools.hostcost import main

    line = _argparse_exit(main, ["--device", device], capsys)
    assert f"argument --device: must be auto, cpu, cuda or cuda:N, got {device!r}" in line


@pytest.mark.parametrize("device", ["tpu", "cuda:x"])
def test_calibrate_refuses_an_unknown_device_as_a_usage_error(device, capsys):
    from harness.tools.calibrate import main

    line = _argparse_exit(main, ["--device", device], capsys)
    assert "argument --device: must be auto, cpu, cuda or cuda:N" in line


@NO_CUDA
@pytest.mark.parametrize("module", ["harness.tools.hostcost", "harness.tools.calibrate"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_cuda_device_without_a_gpu_is_a_clean_error(module, device, capsys, tmp_path):
    import importlib

    main = importlib.import_module(module).main
    argv = ["--device", device] + (["--out", str(tmp_path / "p.yaml")] if module.endswith("calibrate") else [])
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == f"error: --device {device}: no CUDA device is available; use --device cpu (or auto)"


@pytest.mark.parametrize("seed", ["-1", "x"])
def test_calibrate_seed_must_be_a_non_negative_int(seed, capsys):
    from harness.tools.calibrate import main
    from harness.config.cli_args import non_negative_int

    line = _argparse_exit(main, ["--seed", seed], capsys)
    assert "argument --seed:" in line
    assert non_negative_int("0") == 0 and non_negative_int("7") == 7


def test_hostcost_still_measures_on_cpu(capsys):
    from harness.tools.hostcost import main

    assert main(["--device", "cpu", "--batch-sizes", "1,2", "--context-len", "16", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | resident |" in out and "NO GPU" in out


# --- python -m pagebench.reports <study dir> with a malformed study.json ---------------------------------


GOOD_STUDY = {"schema_version": 1, "kind": "study", "study": "vllm_fig15",
              "params": {"systems": {"vllm": "paged_noprefix"}, "widths": {"parallel": [2], "beam": [2]}},
              "measured": {"parallel.2": 6.0, "beam.2": 80.0}, "jobs": [], "complete": True,
              "setup": {}, "timing": {}}


@pytest.mark.parametrize("text,message", [
    ("{", r"study\.json:1: not valid JSON \(truncated\?\)"),
    ("", r"study\.json:1: not valid JSON"),
    ("[1,2]", r"study\.json: not a pagebench study file \(expected a JSON object, got list\)"),
    ('{"kind":"study"}', r"study\.json: field 'study': missing"),
    ('{"kind":"study","study":3}', r"field 'study': must be the study's name, got 3"),
    ('{"kind":"run","study":"vllm_fig2"}', r"field 'kind': not a pagebench study file"),
    (json.dumps({**GOOD_STUDY, "schema_version": 99}), r"field 'schema_version': 99 is not supported"),
    (json.dumps({**GOOD_STUDY, "params": [1]}), r"field 'params': must be a mapping, got list"),
    (json.dumps({**GOOD_STUDY, "measured": {"beam.2": "80"}}), r"field 'measured\.beam\.2': must be a number"),
    (json.dumps({**GOOD_STUDY, "jobs": {}}), r"field 'jobs': must be a list"),
])
def test_reports_refuses_a_malformed_study_json_with_one_line(tmp_path, capsys, text, message):
    import re

    from pagebench.reports.__main__ import main

    (tmp_path / "study.json").write_text(text)
    assert main([str(tmp_path)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / 'study.json'}") and re.search(message, line), line
    assert not (tmp_path / "report.html").exists()


def test_reports_still_renders_a_good_study_and_paper_section_refuses_a_bad_one(tmp_path, capsys):
    from pagebench.reports.__main__ import main
    from pagebench.reports.paper_section import main as paper_main
    from pagebench.reports.paper_section import read_study

    (tmp_path / "study.json").write_text(json.dumps(GOOD_STUDY))
    assert read_study(tmp_path)["study"] == "vllm_fig15"
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "report.html").exists()
    (tmp_path / "study.json").write_text("[]")
    assert paper_main([str(tmp_path)]) == 2
    assert paper_main(["--markdown", str(tmp_path)]) == 2
    assert len([ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]) == 2
    with pytest.raises(InputError, match="study file not found"):
        read_study(tmp_path / "nowhere")


# --- a duplicated trace column ------------------------------------------------------------------


def _table(path: Path, **overrides):
    from harness.workloads import build_workload
    from harness.workloads.presets import load_preset

    node = load_preset("table")
    node.update(path=str(path), input_column="in", output_column="out", arrival={"process": "offline"},
                **overrides)
    return build_workload(node, seed=0, max_model_len=4096)


@pytest.mark.parametrize("header,column", [("in,in,out", "in"), ("in,out,out", "out"), (" in ,in,out", "in")])
def test_a_duplicated_csv_column_is_refused_naming_file_and_column(tmp_path, header, column):
    path = tmp_path / "dup.csv"
    path.write_text(f"{header}\n100,5,20\n")
    with pytest.raises(InputError) as exc:
        _table(path)
    message = str(exc.value)
    assert message.startswith(f"{path}:1: field {column!r}: the header names this column 2 times"), message


def test_a_duplicated_column_in_gzipped_csv_and_parquet_is_refused(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    gz = tmp_path / "dup.csv.gz"
    gz.write_bytes(gzip.compress(b"in,in,out\n100,5,20\n"))
    with pytest.raises(InputError, match="field 'in': the header names this column 2 times"):
        _table(gz)
    parquet = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array([100]), pa.array([5]), pa.array([20])], names=["in", "in", "out"]),
                   parquet)
    with pytest.raises(InputError, match=f"^{parquet}: field 'in': the header names this column 2 times"):
        _table(parquet)


def test_a_duplicated_column_the_workload_does_not_read_is_fine(tmp_path):
    path = tmp_path / "extra.csv"
    path.write_text("note,note,in,out\na,b,100,20\n")
    workload = _table(path)
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(100, 20)]


def test_a_duplicated_column_of_a_named_trace_format_is_refused(tmp_path):
    from harness.workloads import build_workload
    from harness.workloads.presets import load_preset

    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,1,44\n")
    node = load_preset("azure_conv")
    node["path"] = str(path)
    with pytest.raises(InputError, match="field 'ContextTokens': the header names this column 2 times"):
        build_workload(node, seed=0, max_model_len=4096)


def test_harness_refuses_a_duplicated_column_with_exit_status_2(tmp_path, run_cli):
    path = tmp_path / "dup.csv"
    path.write_text("in,in,out\n100,5,20\n")
    proc = run_cli(None, "workload=table", f"workload.path={path}", "workload.input_column=in",
                   "workload.output_column=out", "model=tiny", "hardware=cpu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = _one_error_line(proc.stderr)
    assert line.startswith(f"error: {path}:1: field 'in': the header names this column 2 times")
    assert not list(tmp_path.rglob("results.json"))


# --- python -m harness.tools.traces fetch <unknown> --------------------------------------------------


def test_traces_fetch_of_an_unknown_name_is_a_usage_error_listing_the_known(capsys):
    from harness.tools.traces import KNOWN, main

    line = _argparse_exit(main, ["fetch", "bogus"], capsys)
    assert "unknown trace 'bogus'" in line and all(name in line for name in KNOWN)
    line = _argparse_exit(main, ["fetch", "azure_cnv"], capsys)
    assert "Did you mean 'azure_conv'?" in line
