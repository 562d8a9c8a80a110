"""The torch executor's plumbing: block tables, reports, capacity, the Triton path, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from harness.config.specs import EngineSpec
from harness.engine.block_tables import HostBlockTables, ResidentBlockTables, Uploader
from harness.engine.executors import executor_capacity_slots
from harness.engine.torch_device import resolve_device
from harness.engine.torch_executor import seeded_sample
from harness.errors import ConfigError
from torch_helpers import (CPU, ROOT, TINY, contiguous, engine, mixed_workload, one_torch_thread,  # noqa: F401
                           paged, run_torch)


def _tables_on_device(builder, seq_ids, tables, device):
    prep = builder.prepare(seq_ids, tables)
    dev = Uploader(device).upload(prep.arrays)
    return builder.finish(prep, dev)


def test_resident_block_tables_equal_rebuilt_tables_as_tables_evolve():
    rng = np.random.default_rng(0)
    device = torch.device("cpu")
    host, resident = HostBlockTables(), ResidentBlockTables(num_rows=12, max_blocks=40, device=device)
    live: dict[int, list[int]] = {}
    next_id = 0
    for step in range(300):
        op = rng.integers(0, 10)
        if op == 0 or not live:  # a new sequence
            live[next_id] = list(rng.integers(0, 1000, rng.integers(1, 5)))
            next_id += 1
        elif op == 1 and len(live) > 1:  # a sequence finishes (its row is reclaimed later)
            live.pop(int(rng.choice(list(live))))
        elif op == 2:  # swap-in: a whole new table of the same length
            s = int(rng.choice(list(live)))
            live[s] = list(rng.integers(0, 1000, len(live[s])))
        elif op == 3:  # copy-on-write of the last block
            s = int(rng.choice(list(live)))
            live[s][-1] = int(rng.integers(0, 1000))
        for s in live:  # decoding: a new block now and then
            if rng.random() < 0.2 and len(live[s]) < 40:
                live[s].append(int(rng.integers(0, 1000)))
        batch = [s for s in live if rng.random() < 0.8][:12] or [next(iter(live))]
        tables = [list(live[s]) for s in batch]
        expected = _tables_on_device(host, batch, tables, device)
        got = _tables_on_device(resident, batch, tables, device)
        for row, table in enumerate(tables):
            assert got[row, :len(table)].tolist() == table == expected[row, :len(table)].tolist()
    assert len(resident._row_of) <= resident.num_rows  # rows were reclaimed, never overflowed


def test_resident_tables_upload_only_changed_rows():
    resident = ResidentBlockTables(num_rows=8, max_blocks=10, device=torch.device("cpu"))
    tables = [[1, 2], [3], [4, 5, 6]]
    assert resident.prepare([0, 1, 2], tables).rows_changed == 3
    assert resident.prepare([0, 1, 2], tables).rows_changed == 0
    tables[1] = [3, 7]
    assert resident.prepare([0, 1, 2], tables).rows_changed == 1


def test_step_log_and_report_describe_the_run():
    requests = mixed_workload(n=6)
    result = run_torch(requests, paged(16, prefix_caching=True), engine(kv_capacity_slots=384))
    executor = result.executor
    steps = result.run.recorder.step_table()
    assert len(executor.step_log) == len(steps)
    np.testing.assert_allclose([s.duration_s for s in executor.step_log], steps["duration_s"])
    assert [s.num_tokens for s in executor.step_log] == steps["num_batched_tokens"].tolist()
    report = executor.report()
    expected_tokens = sum(r.output_len * r.num_samples for r in requests)
    assert report["generated_tokens"] == expected_tokens
    assert report["steps"] == len(steps)
    assert report["batch_invariant"] is True and report["kernel_backend"] == "torch reference"
    assert report["decode_step_ms"]["count"] > 0 and report["host_prep_ms"]["mean"] > 0
    assert report["nvml"]["available"] is False and "CPU" in report["nvml"]["note"]
    json.dumps(report)  # JSON-able as results.json needs
    executor.close()
    assert executor.kv is None


def test_capacity_comes_from_the_override_or_the_host():
    assert executor_capacity_slots(TINY, CPU, engine(kv_capacity_slots=777), max_model_len=512) == 777
    spec = engine(kv_capacity_slots=None)
    slots = executor_capacity_slots(TINY, CPU, spec, max_model_len=512)
    assert 0 < slots <= int((16 * 2**30 * 0.9 - TINY.weight_bytes - 2 * 2**30) // TINY.bytes_per_slot)


def test_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="engine.device=cpu"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="engine.device"):
        EngineSpec(device="tpu").validate("engine")


def test_seeded_sampling_depends_only_on_request_sample_and_position():
    logits = torch.zeros(50, dtype=torch.float64)
    a = seeded_sample(logits, 0, 3, 1, 5)
    assert a == seeded_sample(logits.clone(), 0, 3, 1, 5)
    draws = {seeded_sample(logits, 0, 3, lineage, pos) for lineage in range(1, 4) for pos in range(5)}
    assert len(draws) > 5  # uniform logits: the noise decides


@pytest.mark.slow
def test_triton_kernels_drive_the_engine_under_the_interpreter():
    """The GPU code path (Triton write / copy / paged + contiguous decode kernels, out=
    buffers, int32 tables) on CPU through the interpreter: same tokens as the torch path."""
    script = textwrap.dedent("""
        import os, sys, json
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
        import numpy as np, torch
        torch.set_num_threads(1)
        from torch_helpers import run_torch, paged, contiguous, engine, _request
        rng = np.random.default_rng(3)
        reqs = tuple(_request(i, rng.integers(0, 1 << 29, n, dtype=np.int32), o, num_samples=s)
                     for i, (n, o, s) in enumerate([(5, 6, 1), (19, 5, 2), (33, 4, 1)]))
        out = {}
        for name, system in (("paged", paged(16)), ("oracle", contiguous("oracle"))):
            for backend in ("triton", "torch"):
                r = run_torch(reqs, system, engine(batch_invariant=False, kernel_backend=backend))
                assert r.executor.backend == backend
                out[name + "/" + backend] = {str(k): v for k, v in sorted(r.tokens.items())}
        print(json.dumps(out))
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    # fp32 with different kernels: equal except at an fp32 near-tie (vanishingly rare here)
    assert tokens["paged/triton"] == tokens["paged/torch"] == tokens["oracle/triton"]


@pytest.mark.slow
def test_cli_runs_the_torch_engine_end_to_end(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness", "engine=torch", "model=tiny", "hardware=cpu",
           "workload=docqa", "workload.num_requests=3", "systems=[paged,max,oracle]",
           "engine.kv_capacity_slots=65536", "progress=false", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "executor=torch" in proc.stderr
    results = json.loads((out / "results.json").read_text())
    systems = results["systems"]
    digests = {s["output_digest"] for s in systems.values()}
    assert len(digests) == 1 and "" not in digests  # every system generated the same tokens
    assert results["outputs_identical"] is True
    assert "outputs: every system generated the same tokens" in proc.stderr
    for summary in systems.values():
        executor = summary["executor"]
        assert executor["steps"] > 0 and executor["generated_tokens"] > 0
        assert summary["nvml"]["available"] is False
    assert (out / "report.html").is_file()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_paged_equals_contiguous_and_reports_device_time():
    requests = mixed_workload()
    exact = engine(device="cuda", batch_invariant=True, kv_capacity_slots=384, preemption="swap")
    reference = run_torch(requests, contiguous("oracle"), engine(device="cuda", batch_invariant=True))
    result = run_torch(requests, paged(16, prefix_caching=True), exact)
    assert result.scheduler.num_preemptions > 0 and result.tokens == reference.tokens
    # Triton kernels, host vs resident tables: identical kernel inputs, identical tokens
    fast = run_torch(requests, paged(16), engine(device="cuda"))
    resident = run_torch(requests, paged(16), engine(device="cuda", block_tables_on_device=True))
    assert fast.tokens == resident.tokens
    report = resident.executor.report()
    assert report["device_busy_ms"]["count"] == report["steps"]
    assert report["kernel_backend"] == "triton"


def test_host_cost_benchmark_reports_both_table_strategies():
    from harness.tools.hostcost import markdown, run

    result = run([4, 32], context_len=64, block_size=16, steps=20, device=torch.device("cpu"),
                 model="llama-2-13b", hardware="h200")
    rows = {(r["batch_size"], r["mode"]): r for r in result["rows"]}
    for batch in (4, 32):
        full, resident = rows[(batch, "full")], rows[(batch, "resident")]
        assert full["rows_uploaded_per_step"] == batch
        # a new block every 16 tokens: about 1/16 of the rows change per step
        assert resident["rows_uploaded_per_step"] <= batch / 16 + 1
        assert resident["bytes_per_step"] < full["bytes_per_step"]
        assert full["est_device_step_ms"] > 0 and full["kv_fits_device"]
    assert "NO GPU" in markdown(result)


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0"], "argument --batch-sizes: must be >= 1, got 0"),
    (["--block-size", "0"], "argument --block-size: must be >= 1, got 0"),
    (["--json", "/dev/null/x.json"], "argument --json: cannot write /dev/null/x.json"),
])
def test_hostcost_bad_arguments_say_which(args, message, capsys):
    from harness.tools.hostcost import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_hostcost_unknown_model_is_an_error_not_a_traceback(capsys):
    from harness.tools.hostcost import main

    assert main(["--model", "nosuch", "--batch-sizes", "1", "--steps", "1"]) == 2
    assert "error: --model: no " in capsys.readouterr().err


def test_explicit_kv_slots_on_cpu_still_check_that_the_weights_fit_the_host(monkeypatch):
    """Setting engine.kv_capacity_slots must not skip the host-memory check: building a
    70B model's weights on a small host ends in the OOM killer, not a message."""
    import harness.engine.torch_device as T

    monkeypatch.setattr(T, "_host_available_bytes", lambda: TINY.weight_bytes // 2)
    spec = EngineSpec(executor="torch", device="cpu", kv_capacity_slots=64)
    with pytest.raises(ConfigError, match="need more than this host's"):
        T.torch_kv_capacity_slots(TINY, CPU, spec, max_model_len=256)
    monkeypatch.setattr(T, "_host_available_bytes", lambda: 1 << 40)
    assert T.torch_kv_capacity_slots(TINY, CPU, spec, max_model_len=256) == 64


def test_systems_that_generated_different_tokens_are_named(capsys):
    from harness.run.serve import _report_outputs

    results = {"systems": {"paged": {"output_digest": "a" * 64, "requests": {"rejected": 0}},
                           "pow2": {"output_digest": "b" * 64, "requests": {"rejected": 6}}}}
    _report_outputs(results)
    assert results["outputs_identical"] is False
    err = capsys.readouterr().err
    assert f"warning: the systems generated different tokens: paged {'a' * 16}, pow2 {'b' * 16}" in err
    assert "some systems rejected requests" in err
