"""The ``torch`` executor: a real model over real KV tensors laid out by the KV manager.

One executor serves one system. At construction it allocates the KV memory once, from
the manager's capacity:

- paged: per layer, K and V caches ``[num_blocks, block_size, num_kv_heads, head_dim]``;
  the manager's block tables are what the paged decode kernel reads;
- contiguous: per layer, K and V arenas ``[num_slots, num_kv_heads, head_dim]``; each
  sequence's slot range (``slot_range``) is what the contiguous decode kernel reads.

(Views of one ``[layers, 2, ...]`` allocation; CPU swap space likewise.)

Each ``execute(plan)``, in order:

1. swap-outs, swap-ins (``pagebench.kernels.cache_write.swap_blocks``), then copy-on-write / fork
   copies (``copy_blocks``): paged pairs are blocks, contiguous (and radix) pairs are slots;
2. host preparation: token ids, positions, slot mappings, decode block tables (or start
   offsets), prefill gather indices -- packed into ONE host-to-device copy;
3. the forward pass: per layer, every new token's K/V is written through
   ``write_kv_cache`` first (so a prefix block registered this step by one sequence is
   filled before another reads it, and each chunk's own keys are in the cache), then
   decode tokens (1-token chunks) run the paged or contiguous decode kernel, and prefill
   chunks run ``pagebench.kernels.paged_prefill.prefill_attention``, which reads each chunk's context
   ``[0, end)`` IN PLACE through the same block tables (or start offsets): prefix-cache hits
   and earlier chunks of a chunked prefill are read from the cache, never recomputed or
   copied. With ``batch_invariant`` (the CPU default) decode and prefill rows read their
   keys through the same index but run ``model.exact_attention`` (float64) instead: that
   is what makes paged and contiguous runs agree token for token;
4. sampling: logits only for chunks that complete their sequence's known tokens; sample
   0 of a request is greedy (argmax), further parallel samples are greedy too
   (``sampling=greedy``) or a Gumbel-max draw seeded by (seed, request, sample, position)
   (``sampling=seeded``, default) so that samples diverge the same way on every system.

Step time: wall clock from the first memory operation to the sampled tokens on the
host (CUDA: after a synchronize), so host overhead counts as it would in a real engine;
device busy time (CUDA events) and host preparation time are kept beside it.
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

import numpy as np
import torch

from harness.config.specs import EngineSpec, ModelSpec, SystemSpec
from harness.engine.block_tables import HostBlockTables, ResidentBlockTables, Uploader
from harness.engine.cache_attention import CacheAttention, PrefillChunk, StepInputs
from harness.engine.cuda_graphs import DecodeGraphs, capture_sizes, pad_decode_arrays
from harness.engine.warmup import warm_up, warmup_summary
from harness.metrics.slow_steps import FACTOR as SLOW_FACTOR, slow_steps, step_shape
from harness.engine.model import DecoderModel
from harness.engine.plan import StepPlan
from harness.engine.torch_device import (device_name, get_model, resolve_batch_invariant,
                                         resolve_device, set_cpu_threads)
from harness.errors import ConfigError
from pagebench.kernels.cache_write import copy_blocks, swap_blocks
from pagebench.kernels import _runtime as rt

class StepSample(NamedTuple):
    """One executed step: what it computed (the sim cost model's features) and what it took."""

    num_tokens: int  # tokens computed (prefill + decode)
    attention_pairs: int  # (query, key) pairs attended
    kv_read_slots: int  # cached KV slots read (context before each chunk)
    num_seqs: int  # sequences in the step (forked members included)
    num_prefill_chunks: int  # chunks of more than one token
    num_decode_seqs: int  # 1-token chunks (decode kernel rows)
    copied_slots: int
    swapped_slots: int
    duration_s: float  # wall time of the step (what drives the engine clock)
    host_prep_s: float  # building + uploading the step's integer arrays
    device_s: float | None  # CUDA-event time of the step (None on CPU)
    table_rows_uploaded: int  # block-table rows sent to the device this step
    cuda_graph: bool = False  # the step replayed a captured decode graph


class TorchExecutor:
    """Runs step plans on the spec's DecoderModel with KV memory laid out by manager."""

    name = "torch"

    def __init__(self, model_spec: ModelSpec, system: SystemSpec, manager, engine: EngineSpec, *,
                 max_model_len: int, seed: int = 0, model: DecoderModel | None = None,
                 warm: bool = True) -> None:
        self.device = resolve_device(engine.device)
        if self.device.type == "cpu" and engine.cpu_threads is not None:
            set_cpu_threads(engine.cpu_threads)  # NOTE: process-wide
        self.batch_invariant = resolve_batch_invariant(engine, self.device)
        backend = engine.kernel_backend
        self.backend = "torch" if backend == "auto" and self.device.type == "cpu" else backend
        try:
            self.resolved_backend = rt.resolve_backend(self.backend, self.device)  # "triton" | "torch"
        except ValueError as exc:  # triton asked for on CPU without the interpreter
            raise ConfigError(f"engine.kernel_backend={backend}: {exc}") from None
        self.model = model or get_model(model_spec, self.device, seed, self.batch_invariant)
        self.spec, self.system, self.manager, self.engine = model_spec, system, manager, engine
        self.seed = seed
        self.sampling = engine.sampling
        if manager.capabilities.layout == "none":
            raise ConfigError(f"systems: {system.name} ({system.kind}) has no KV tensor layout "
                              "for the torch executor; run it with engine=sim")
        self.paged = manager.capabilities.layout == "paged"
        # radix: slot-pair copies, and forked members write their own slots (as contiguous)
        self.slot_copies = not self.paged or manager.capabilities.slot_copies
        layers, kv_heads, head_dim = self.model.num_layers, model_spec.num_kv_heads, model_spec.head_dim
        dtype = self.model.dtype
        if self.paged:
            self.block_size = manager.block_size
            unit_shape = (manager.block_size, kv_heads, head_dim)
            num_units, self.num_cpu_units = manager.num_blocks, manager.num_cpu_blocks
        else:
            self.block_size = 1
            unit_shape = (kv_heads, head_dim)
            num_units, self.num_cpu_units = manager.capacity_slots, manager.num_cpu_slots
        self.unit_shape = unit_shape
        # NOTE: torch.empty: a slot is always written by its owner before any read.
        self.kv = torch.empty((layers, 2, num_units, *unit_shape), dtype=dtype, device=self.device)
        self.k_caches = [self.kv[i, 0] for i in range(layers)]
        self.v_caches = [self.kv[i, 1] for i in range(layers)]
        self.kv_flat = [(k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim))
                        for k, v in zip(self.k_caches, self.v_caches)]
        self.attention = CacheAttention(self.model, self.k_caches, self.v_caches, self.kv_flat,
                                        paged=self.paged, block_size=self.block_size,
                                        backend=self.backend, batch_invariant=self.batch_invariant)
        self.cpu_kv: torch.Tensor | None = None
        if engine.preemption == "swap" and self.num_cpu_units:
            self._allocate_swap_space()
        self.uploader = Uploader(self.device)
        if engine.block_tables_on_device and self.paged:
            rows = 2 * engine.max_num_seqs + 8
            self.tables = ResidentBlockTables(rows, -(-max_model_len // self.block_size), self.device)
        else:
            self.tables = HostBlockTables()
        self.cuda = self.device.type == "cuda"
        self.step_log: list[StepSample] = []
        self.greedy_seqs: dict = {}  # request id -> its lineage-0 sequence (token check)
        self.generated_tokens = 0
        self.first_step_wall: float | None = None
        self.telemetry = None
        self.graphs: DecodeGraphs | None = None
        self.decode_path = self._decode_path(engine)
        # start-up, before any timed step (vLLM's): every kernel shape compiled / autotuned,
        # then the decode graphs captured
        started = time.perf_counter()
        # (warm=False: the caller warmed this process's kernels itself, as calibrate's
        # untimed pass per grid point does; graphs are still captured)
        self.warmup = warm_up(self, engine, max_model_len) if warm else {"skipped": True}
        if self.decode_path == "cuda graphs":
            width = (-(-max_model_len // self.block_size),) if self.paged else ()
            captured = time.perf_counter()
            self.graphs = DecodeGraphs(self.model, sizes=capture_sizes(engine.max_num_seqs),
                                       index_shape=width, max_context_len=max_model_len,
                                       attention_fn=self.attention.for_graph)
            self.warmup["graph_capture_s"] = round(time.perf_counter() - captured, 3)
            self.warmup["cuda_graphs"] = len(self.graphs.sizes)
        self.warmup["seconds"] = round(time.perf_counter() - started, 3)
        if warm:
            print(f"{system.name}: warm-up {self.warmup['seconds']:.2f} s before the timed run "
                  f"({warmup_summary(self.warmup)})", file=sys.stderr)
        if self.cuda:
            if engine.telemetry_interval_s > 0:
                from harness.engine.nvml import NvmlSampler

                self.telemetry = NvmlSampler(self.device, interval_s=engine.telemetry_interval_s)

    # ----------------------------------------------------------------- memory
    @property
    def kv_cache_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def _allocate_swap_space(self) -> None:
        shape = (self.model.num_layers, 2, self.num_cpu_units, *self.unit_shape)
        self.cpu_kv = torch.empty(shape, dtype=self.model.dtype, pin_memory=self.device.type == "cuda")

    def _swap(self, pairs: list[tuple[int, int]], *, out: bool) -> None:
        if self.cpu_kv is None:
            self._allocate_swap_space()
        for layer in range(self.model.num_layers):
            for kv in (0, 1):
                device_cache, host_cache = self.kv[layer, kv], self.cpu_kv[layer, kv]
                # NOTE: "auto", not a forced "triton": the host half of a swap is torch
                backend = "torch" if self.backend == "torch" else "auto"
                if out:
                    swap_blocks(device_cache, host_cache, pairs, backend=backend)
                else:
                    swap_blocks(host_cache, device_cache, pairs, backend=backend)

    def _copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copies with sequential semantics, batched where no pair depends on another."""
        if self.slot_copies:  # [num_slots, kv_heads, head_dim] views: pairs are slots
            caches = [c for k, v in self.kv_flat for c in (k, v)]
        else:  # [num_blocks, block_size, kv_heads, head_dim]: pairs are blocks
            caches = [c for layer in range(self.model.num_layers) for c in (self.k_caches[layer],
                                                                         self.v_caches[layer])]
        batch: list[tuple[int, int]] = []
        srcs: set[int] = set()
        dsts: set[int] = set()
        for src, dst in pairs:
            if src == dst:
                continue
            if dst in dsts or dst in srcs or src in dsts:
                copy_blocks(caches, batch, backend=self.backend)
                batch, srcs, dsts = [], set(), set()
            batch.append((src, dst))
            srcs.add(src)
            dsts.add(dst)
        if batch:
            copy_blocks(caches, batch, backend=self.backend)

    # ----------------------------------------------------------------- step
    def execute(self, plan: StepPlan) -> tuple[float, dict[int, int]]:
        if self.telemetry is not None and not self.telemetry.running:
            self.telemetry.start()
        wall_start = time.perf_counter()
        if self.first_step_wall is None:
            self.first_step_wall = wall_start
        if self.cuda:
            ev_start, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev_start.record()
        with torch.inference_mode():
            if plan.swap_out:
                self._swap(plan.swap_out, out=True)
            if plan.swap_in:
                self._swap(plan.swap_in, out=False)
            if plan.copies:
                self._copy(plan.copies)
            host_start = time.perf_counter()
            inputs, features, rows_uploaded = self._prepare(plan)
            host_prep = time.perf_counter() - host_start
            sampled: dict[int, int] = {}
            if inputs is not None and inputs.graph_bucket is not None:
                logits = self.graphs.replay(inputs.graph_bucket, inputs.num_decode, inputs.tokens,
                                            inputs.positions, inputs.write_slots, inputs.decode_lens,
                                            inputs.index)  # [num_decode, vocab]
                if inputs.sample_rows is not None:
                    sampled = self._sample(logits.index_select(0, inputs.sample_rows), inputs.sample_seqs)
            elif inputs is not None:
                hidden = self.model.forward(inputs.tokens, inputs.positions, self.attention.for_step(inputs))
                if inputs.sample_rows is not None:
                    logits = self.model.logits(hidden.index_select(0, inputs.sample_rows))  # [S, vocab]
                    sampled = self._sample(logits, inputs.sample_seqs)
        device_s = None
        if self.cuda:
            ev_end.record()
            torch.cuda.synchronize(self.device)
            device_s = ev_start.elapsed_time(ev_end) / 1e3
        duration = time.perf_counter() - wall_start
        unit = self.block_size
        copy_unit = 1 if self.slot_copies else unit
        self.step_log.append(StepSample(*features, len(plan.copies) * copy_unit,
                                        (len(plan.swap_in) + len(plan.swap_out)) * unit,
                                        duration, host_prep, device_s, rows_uploaded,
                                        inputs is not None and inputs.graph_bucket is not None))
        self.generated_tokens += len(sampled)
        return duration, sampled

    def _prepare(self, plan: StepPlan):
        """Host side of a step: every per-step integer array, uploaded in one copy."""
        manager, paged = self.manager, self.paged
        planned = plan.chunks  # NOTE: built on each read (see StepPlan.chunks)
        decode = [c for c in planned if c.num_tokens == 1]
        prefill = [c for c in planned if c.num_tokens > 1]
        chunks = decode + prefill
        n_tokens = sum(c.num_tokens for c in chunks)
        pairs = sum(c.num_tokens * c.start + c.num_tokens * (c.num_tokens + 1) // 2 for c in chunks)
        kv_read = sum(c.start for c in chunks)
        num_seqs = sum(1 + len(c.members) for c in chunks)
        features = (n_tokens, pairs, kv_read, num_seqs, len(prefill), len(decode))
        if not chunks:
            return None, features, 0
        tokens = np.empty(n_tokens, dtype=np.int64)
        positions = np.empty(n_tokens, dtype=np.int32)
        write_slots: list[int] = []
        extra_rows: list[int] = []
        extra_slots: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[tuple] = []
        vocab = self.model.vocab_size
        # decode chunks: one token each
        seq_ids, tables, starts, dec_lens = [], [], [], []
        for row, c in enumerate(decode):
            seq, pos = c.seq, c.start
            prompt_len = len(seq.prompt)
            tokens[row] = seq.prompt[pos] if pos < prompt_len else seq.token_at(pos - prompt_len)
            positions[row] = pos
            write_slots.extend(manager.slot_mapping(seq.seq_id, pos, pos + 1))
            dec_lens.append(c.end)
            self._index_row(seq.seq_id, seq_ids, tables, starts)
            self._member_writes(c, row, extra_rows, extra_slots)
            if c.end == seq.num_tokens:
                sample_rows.append(row)
                sample_seqs.append((seq, *c.members))
        # prefill chunks: their context [0, end) is read from the cache through the index
        row = len(decode)
        prefills: list[PrefillChunk] = []
        for c in prefill:
            seq, n = c.seq, c.num_tokens
            tokens[row:row + n] = seq.token_ids(c.start, c.end)
            positions[row:row + n] = np.arange(c.start, c.end, dtype=np.int32)
            write_slots.extend(manager.slot_mapping(seq.seq_id, c.start, c.end))
            self._index_row(seq.seq_id, seq_ids, tables, starts)
            self._member_writes(c, row, extra_rows, extra_slots)
            prefills.append(PrefillChunk((row, row + n), c.start, c.end))
            row += n
            if c.end == seq.num_tokens:
                sample_rows.append(row - 1)
                sample_seqs.append((seq, *c.members))
        arrays = {
            "tokens": (tokens % vocab).astype(np.int32),
            "positions": positions,
            "write_slots": np.asarray(write_slots + extra_slots, dtype=np.int32),
        }
        if extra_rows:
            arrays["write_rows"] = np.concatenate([np.arange(n_tokens, dtype=np.int32),
                                                   np.asarray(extra_rows, dtype=np.int32)])
        table_prep = None
        if decode:
            arrays["decode_lens"] = np.asarray(dec_lens, dtype=np.int32)
        if paged:
            table_prep = self.tables.prepare(seq_ids, tables)
            arrays.update({f"table_{k}": v for k, v in table_prep.arrays.items()})
        else:
            arrays["starts"] = np.asarray(starts, dtype=np.int32)
        if prefills:
            sizes = [p.rows[1] - p.rows[0] for p in prefills]
            arrays["query_starts"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
            arrays["prefill_lens"] = np.asarray([p.end for p in prefills], dtype=np.int32)
        if sample_rows:
            arrays["sample_rows"] = np.asarray(sample_rows, dtype=np.int32)
        bucket = None
        if self.graphs is not None and not prefills and not extra_rows:
            bucket = self.graphs.fits(len(decode), table_prep.width if paged else 0)
            if bucket is not None:
                arrays = pad_decode_arrays(arrays, len(decode), bucket)
        dev = self.uploader.upload(arrays)
        if paged:
            index = self.tables.finish(
                table_prep, {k[len("table_"):]: v for k, v in dev.items() if k.startswith("table_")})
        else:
            index = dev["starts"]
        inputs = StepInputs(
            tokens=dev["tokens"].long(), positions=dev["positions"].long(),
            write_slots=dev["write_slots"],
            write_rows=dev["write_rows"].long() if extra_rows else None,
            num_decode=len(decode), index=index, decode_lens=dev.get("decode_lens"),
            max_decode_len=max(dec_lens, default=0), decode_lens_host=dec_lens, prefills=prefills,
            query_starts=dev.get("query_starts"), prefill_lens=dev.get("prefill_lens"),
            sample_rows=dev["sample_rows"].long() if sample_rows else None, sample_seqs=sample_seqs,
            graph_bucket=bucket,
        )
        rows_uploaded = table_prep.rows_changed if table_prep is not None else 0
        return inputs, features, rows_uploaded

    def _index_row(self, seq_id: int, seq_ids: list[int], tables: list[list[int]],
                   starts: list[int]) -> None:
        """The chunk's row of the cache index: its block table (paged) or its start slot."""
        if self.paged:
            seq_ids.append(seq_id)
            tables.append(self.manager.block_table(seq_id))
        else:
            starts.append(self.manager.slot_range(seq_id)[0])

    def _member_writes(self, chunk, row: int, extra_rows: list[int], extra_slots: list[int]) -> None:
        """Forked members with their own slots (contiguous) also receive the chunk's K/V.

        NOTE: paged members share the parent's blocks at fork, so their slots are the
        parent's and nothing extra is written. A contiguous (or radix: its private pages)
        fork's copies run before the forward, when the parent's slots are not written yet,
        so the rows are written here.
        """
        if not self.slot_copies or not chunk.members:
            return
        for member in chunk.members:
            extra_rows.extend(range(row, row + chunk.num_tokens))
            extra_slots.extend(self.manager.slot_mapping(member.seq_id, chunk.start, chunk.end))

    def _decode_path(self, engine: EngineSpec) -> str:
        """Which path decode steps take, as the report says it."""
        if not self.cuda:
            return "eager (CPU: no CUDA graphs)"
        if not engine.cuda_graphs:
            return "eager (engine.cuda_graphs=false)"
        if self.batch_invariant:
            return "eager (batch_invariant: its float64 attention loops over sequences on the host)"
        return "cuda graphs"

    def _sample(self, logits: torch.Tensor, sample_seqs: list[tuple]) -> dict[int, int]:
        """logits [S, vocab] float32 -> {seq_id: token}."""
        greedy = logits.argmax(dim=-1).tolist()
        sampled: dict[int, int] = {}
        host_logits = None
        for i, seqs in enumerate(sample_seqs):
            for seq in seqs:
                if seq.lineage == 0 and seq.group.request.beam_width == 1:  # greedy: the token check replays it
                    self.greedy_seqs[seq.group.request.request_id] = seq
                if self.sampling == "greedy" or seq.lineage == 0:
                    sampled[seq.seq_id] = greedy[i]
                    continue
                if host_logits is None:
                    host_logits = logits.to("cpu", torch.float64)
                sampled[seq.seq_id] = seeded_sample(host_logits[i], self.seed, seq.group.request.request_id,
                                                    seq.lineage, seq.num_generated)
        return sampled

    # ----------------------------------------------------------------- reports
    def report(self) -> dict:
        """Timing, CPU-side cost and telemetry summary of this executor's run (JSON-able)."""
        log = self.step_log
        durations = np.asarray([s.duration_s for s in log], dtype=np.float64)
        host = np.asarray([s.host_prep_s for s in log], dtype=np.float64)
        decode_only = np.asarray([s.num_prefill_chunks == 0 for s in log], dtype=bool)
        total = float(durations.sum())
        out = {
            "device": device_name(self.device),
            "dtype": self.spec.dtype,
            "layers": self.model.num_layers,
            "batch_invariant": self.batch_invariant,
            "kernel_backend": "torch reference" if self.resolved_backend == "torch" else "triton",
            "block_tables_on_device": isinstance(self.tables, ResidentBlockTables),
            "decode_path": self.decode_path,
            "cuda_graph_sizes": self.graphs.sizes if self.graphs is not None else None,
            "cuda_graph_steps": sum(s.cuda_graph for s in log),
            "weights_gib": round(self.model.weight_bytes / 2**30, 3),
            "kv_cache_gib": round(self.kv_cache_bytes / 2**30, 3) if self.kv is not None else None,
            "steps": len(log),
            "generated_tokens": self.generated_tokens,
            "busy_s": round(total, 4),
            "generated_tokens_per_busy_s": round(self.generated_tokens / total, 2) if total else None,
            "step_ms": _stats(durations * 1e3),
            "decode_step_ms": _stats(durations[decode_only] * 1e3),
            "host_prep_ms": _stats(host * 1e3),
            "host_prep_share_pct": round(100 * float(host.sum()) / total, 2) if total else None,
            "warmup": self.warmup,
            "slow_steps": self._slow_steps(durations),
            # each request's greedy tokens: harness.engine.token_check replays them, then
            # removes them from the report (results.json keeps its figures only)
            "_tokens": {rid: seq.generated_ids().tolist() for rid, seq in sorted(self.greedy_seqs.items())},
        }
        graph = np.asarray([s.cuda_graph for s in log], dtype=bool)
        if graph.any():  # decode steps by path: replayed graphs vs eager (prefill-free) steps
            out["decode_step_ms_cuda_graph"] = _stats(durations[graph] * 1e3)
            out["decode_step_ms_eager"] = _stats(durations[decode_only & ~graph] * 1e3)
        device_s = [s.device_s for s in log if s.device_s is not None]
        if device_s:
            out["device_busy_ms"] = _stats(np.asarray(device_s) * 1e3)
        if self.paged:
            rows = sum(s.num_decode_seqs + s.num_prefill_chunks for s in log)  # one per chunk
            uploaded = sum(s.table_rows_uploaded for s in log)
            out["block_table_rows_uploaded_pct"] = round(100 * uploaded / rows, 2) if rows else None
        if self.telemetry is not None:
            summary = self.telemetry.stop()
            out["nvml"] = summary.as_dict(self.generated_tokens)
        else:
            out["nvml"] = {"available": False,
                           "note": ("telemetry disabled (engine.telemetry_interval_s=0)" if self.cuda
                                    else "no CUDA device: NVML telemetry not collected (CPU run)")}
        return out

    def _slow_steps(self, durations: np.ndarray) -> dict:
        """Timed steps slower than 2x their shape's median (``harness.metrics.slow_steps``),
        said on the console too: a compilation or a stall inside the timed run."""
        shapes = [step_shape(s.num_tokens, s.num_seqs, s.num_tokens - s.num_decode_seqs
                             if s.num_prefill_chunks else 0) for s in self.step_log]
        flagged = slow_steps(durations, shapes)
        if flagged:
            listed = ", ".join(f"{f['step']} ({f['phase']}, {f['ratio']}x)" for f in flagged[:8])
            print(f"warning: {self.system.name}: {len(flagged)} timed steps took more than "
                  f"{SLOW_FACTOR:g}x the median of their shape: step {listed}"
                  + (" ..." if len(flagged) > 8 else ""), file=sys.stderr)
        return {"factor": SLOW_FACTOR, "count": len(flagged), "steps": flagged[:50]}

    def telemetry_rows(self) -> list[dict]:
        """NVML samples of this run (empty without a GPU)."""
        return self.telemetry.rows() if self.telemetry is not None else []

    def close(self) -> None:
        """Free the KV memory now (the next system's executor allocates its own)."""
        if self.telemetry is not None and self.telemetry.running:
            self.telemetry.stop()
        self.kv = self.cpu_kv = None
        self.k_caches = self.v_caches = self.kv_flat = []
        self.attention = self.graphs = None
        self.tables = HostBlockTables()
        if self.cuda:
            torch.cuda.empty_cache()


def seeded_sample(logits: torch.Tensor, seed: int, request_id: int, lineage: int, position: int) -> int:
    """Gumbel-max draw from softmax(logits), seeded by (seed, request, sample, position).

    The same inputs draw the same token on every system, so parallel samples diverge
    identically whichever KV manager ran them.
    """
    mix = (seed * 0x9E3779B1 + request_id * 1_000_003 + lineage * 7_919 + position * 104_729) % (1 << 63)
    gen = torch.Generator().manual_seed(mix)
    uniform = torch.rand(logits.shape[-1], generator=gen, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
    gumbel = -torch.log(-torch.log(uniform))
    return int(torch.argmax(logits.to(torch.float64) + gumbel))


def _stats(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"count": 0}
    return {"count": int(values.size), "mean": round(float(values.mean()), 4),
            "p50": round(float(np.percentile(values, 50)), 4),
            "p90": round(float(np.percentile(values, 90)), 4),
            "max": round(float(values.max()), 4)}


__all__ = ["StepSample", "TorchExecutor", "seeded_sample"]
