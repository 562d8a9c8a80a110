"""Decode in CUDA graphs: the buckets, the padding, and the executor's graph path.

Capturing needs CUDA; what does not is tested here on CPU: which sizes get a graph, which
bucket a batch replays, what a padding row holds, that CPU runs report the eager path, and
the executor's whole graph path (padded uploads, static buffers, block-table rows,
sampling from the bucket's logits) with the capture replaced by an eager call of the same
forward -- it must generate the eager path's tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.engine.cuda_graphs import (DecodeGraphs, bucket_for, capture_sizes,
                                        pad_decode_arrays)
from harness.engine.engine import run_engine
from harness.engine.torch_executor import TorchExecutor
from harness.config.systems import build_manager
from torch_helpers import (MAX_MODEL_LEN, TINY, RecordingScheduler, contiguous, engine,  # noqa: F401
                           mixed_workload, one_torch_thread, paged, run_torch)


def test_capture_sizes_are_vllms_buckets_up_to_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(5) == [1, 2, 4, 5]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [248, 256] and len(sizes) == 35


def test_a_batch_replays_the_smallest_bucket_that_holds_it():
    sizes = capture_sizes(20)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 20)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 20, 20]
    assert bucket_for(21, sizes) is None and bucket_for(0, sizes) is None


def test_padding_rows_write_nothing_and_read_nothing():
    arrays = {"tokens": np.array([5, 6, 7], dtype=np.int32), "positions": np.array([9, 3, 4], dtype=np.int32),
              "write_slots": np.array([40, 41, 42], dtype=np.int32),
              "decode_lens": np.array([10, 4, 5], dtype=np.int32), "sample_rows": np.array([0, 2])}
    padded = pad_decode_arrays(arrays, 3, 8)
    assert padded["write_slots"].tolist() == [40, 41, 42] + [-1] * 5  # the KV write skips them
    assert padded["decode_lens"].tolist() == [10, 4, 5] + [0] * 5  # the decode kernel reads nothing
    assert padded["tokens"].tolist() == [5, 6, 7] + [0] * 5
    assert padded["positions"].tolist() == [9, 3, 4] + [0] * 5
    assert padded["sample_rows"] is arrays["sample_rows"]
    with pytest.raises(ValueError, match="write_slots has 2 rows, the step has 3"):
        pad_decode_arrays({**arrays, "write_slots": arrays["write_slots"][:2]}, 3, 8)


def test_cpu_runs_report_the_eager_path():
    result = run_torch(mixed_workload(n=4), paged(16), engine(cuda_graphs=True))
    report = result.executor.report()
    assert report["decode_path"] == "eager (CPU: no CUDA graphs)"
    assert report["cuda_graph_steps"] == 0 and report["cuda_graph_sizes"] is None


class _EagerReplay:
    """Stands in for a captured graph on CPU: replay runs the same forward eagerly."""

    def __init__(self, run) -> None:
        self.replay = run

    def pool(self):
        return None


class _CpuDecodeGraphs(DecodeGraphs):
    def _capture(self, size, pool):
        return _EagerReplay(lambda: self._forward(size))


def _run_with_graphs(requests, system, spec):
    manager = build_manager(system, spec.kv_capacity_slots, TINY, spec, MAX_MODEL_LEN)
    scheduler = RecordingScheduler(manager, spec)
    executor = TorchExecutor(TINY, system, manager, spec, max_model_len=MAX_MODEL_LEN)
    width = (-(-MAX_MODEL_LEN // executor.block_size),) if executor.paged else ()
    executor.graphs = _CpuDecodeGraphs(executor.model, sizes=capture_sizes(spec.max_num_seqs),
                                       index_shape=width, max_context_len=MAX_MODEL_LEN,
                                       attention_fn=executor.attention.for_graph)
    run_engine(tuple(requests), scheduler, executor, spec, max_model_len=MAX_MODEL_LEN)
    return scheduler, executor


@pytest.mark.parametrize("system", [paged(16, prefix_caching=True), paged(1), contiguous("oracle")],
                         ids=["paged16_prefix", "paged1", "oracle"])
def test_graph_path_generates_the_eager_tokens(system):
    """Padded buckets, static buffers and sampling from the bucket's logits change no token
    (float32 path, the decode kernels' torch reference; forks, so shared blocks too)."""
    requests = mixed_workload(n=6)
    spec = engine(batch_invariant=False, max_num_seqs=12)
    eager = run_torch(requests, system, spec)
    scheduler, executor = _run_with_graphs(requests, system, spec)
    assert scheduler.tokens == eager.tokens
    graph_steps = sum(s.cuda_graph for s in executor.step_log)
    decode_only = sum(s.num_prefill_chunks == 0 and s.num_decode_seqs > 0 for s in executor.step_log)
    report = executor.report()
    assert graph_steps > 0 and report["cuda_graph_steps"] == graph_steps
    assert report["decode_step_ms_cuda_graph"]["count"] == graph_steps
    if system.kind == "paged":  # contiguous forks' extra KV writes run eagerly
        assert graph_steps == decode_only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_generate_the_eager_tokens_on_cuda():
    requests = mixed_workload(n=6)
    eager = run_torch(requests, paged(16), engine(device="cuda", cuda_graphs=False), poison=False)
    graphs = run_torch(requests, paged(16), engine(device="cuda"), poison=False)
    assert graphs.executor.report()["decode_path"] == "cuda graphs"
    assert graphs.executor.report()["cuda_graph_steps"] > 0
    assert eager.executor.report()["decode_path"] == "eager (engine.cuda_graphs=false)"
    assert graphs.tokens == eager.tokens
