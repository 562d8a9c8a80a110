"""CPU-side cost of paging: block tables and slot mappings per decode step, vs batch size.

    python -m harness.tools.hostcost [--device auto] [--batch-sizes 1,8,32,128,256,512]
                               [--context-len 2048] [--block-size 16] [--steps 32]

For each batch size, a paged manager holds ``batch`` sequences of ``context`` tokens and
every step appends one token to each (as decoding does). Measured per step, exactly as
the torch executor does it (``harness.engine.block_tables``):

- ``full``: read every sequence's block table and the new token's slot from the manager,
  pad the tables into one int32 array, copy it (with the slots and lengths) to the
  device in one transfer;
- ``resident``: tables stay on the device; only rows that changed since the last step
  (a new block every ``block_size`` tokens) are sent, then gathered on the device.

Beside them: pagebench's own scheduler per step (``scheduler_ms``: schedule +
postprocess on the paged manager, no executor) and the host profile's per-step host time
at that batch (``--host-profile``, vLLM's as Vidur measured it by default).

Both are compared with the step's device time: the sim's roofline decode step for
``--model`` on ``--hardware`` (an estimate; the executor's own per-step share from real
runs is in results.json under ``executor.host_prep_share_pct``). Without CUDA there is no
host-to-device copy; the numbers are the host side only, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from pagebench.allocators.paged import PagedKVCacheManager
from harness.engine.block_tables import HostBlockTables, ResidentBlockTables, Uploader
from harness.config.cli_args import check_device, device_arg, output_file, positive_int, positive_ints

DEFAULT_BATCHES = (1, 8, 32, 128, 256, 512)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(batch_size: int, context_len: int, block_size: int, steps: int, device: torch.device,
            *, resident: bool, seed: int = 0) -> dict:
    """Per-step host cost (ms) of building and uploading the decode step's integer arrays."""
    rng = np.random.default_rng(seed)
    final = context_len + steps + 3  # + the two warm-up steps
    num_blocks = batch_size * -(-final // block_size) + 1
    manager = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
    for seq_id in range(batch_size):
        prompt = rng.integers(0, 1 << 29, context_len, dtype=np.int32)
        if manager.admit(seq_id, prompt, final, context_len) is None:
            raise RuntimeError("pool too small")
    uploader = Uploader(device)
    tables = (ResidentBlockTables(batch_size + 8, -(-final // block_size), device) if resident
              else HostBlockTables())
    seq_ids = list(range(batch_size))
    times, sent_bytes, rows = [], [], []
    for step in range(steps + 2):  # the first two steps warm up (resident: the initial upload)
        for seq_id in seq_ids:
            manager.append(seq_id, (7,))
        _sync(device)
        t0 = time.perf_counter()
        pos = context_len + step
        block_tables = [manager.block_table(s) for s in seq_ids]
        slots = [manager.slot_mapping(s, pos, pos + 1)[0] for s in seq_ids]
        prep = tables.prepare(seq_ids, block_tables)
        arrays = {"slots": np.asarray(slots, dtype=np.int32),
                  "lens": np.full(batch_size, pos + 1, dtype=np.int32),
                  **{f"t_{k}": v for k, v in prep.arrays.items()}}
        dev = uploader.upload(arrays)
        out = tables.finish(prep, {k[2:]: v for k, v in dev.items() if k.startswith("t_")})
        _sync(device)
        elapsed = time.perf_counter() - t0
        if step >= 2:
            times.append(elapsed)
            sent_bytes.append(sum(a.nbytes for a in arrays.values()))
            rows.append(prep.rows_changed)
        assert out.shape[0] == batch_size
    t = np.asarray(times) * 1e3
    return {"batch_size": batch_size, "mode": "resident" if resident else "full",
            "ms_per_step": round(float(np.median(t)), 4), "ms_p90": round(float(np.percentile(t, 90)), 4),
            "bytes_per_step": int(np.mean(sent_bytes)), "rows_uploaded_per_step": float(np.mean(rows))}


def scheduler_ms(batch_size: int, context_len: int, block_size: int, steps: int) -> float:
    """pagebench's own host work per decode step (median ms): the scheduler's step
    (admission, block allocation, the plan) and its postprocessing (appending the sampled
    tokens, finishing), for ``batch_size`` running sequences of ``context_len`` tokens on
    the paged manager: the counterpart of a serving engine's scheduling and output
    processing (the host profile's ``schedule`` and ``process_model_outputs``)."""
    from harness.config.specs import EngineSpec, ModelSpec, SystemSpec
    from harness.engine.scheduler import Scheduler
    from harness.engine.sequence import SequenceGroup
    from harness.config.systems import build_manager
    from harness.workloads.request import Request

    final = context_len + steps + 3
    capacity = batch_size * -(-final // block_size) * block_size + block_size
    engine = EngineSpec(kv_capacity_slots=capacity, max_num_seqs=max(batch_size, 1),
                        max_num_batched_tokens=max(batch_size * context_len, 8192),
                        fast_forward=False)
    model = ModelSpec(name="hostcost", num_layers=1, hidden_size=64, num_heads=1, num_kv_heads=1,
                      head_dim=64, intermediate_size=64, vocab_size=64, max_context=final)
    system = SystemSpec(name="paged", kind="paged", block_size=block_size)
    manager = build_manager(system, capacity, model, engine, final)
    scheduler = Scheduler(manager, engine, seed=0)
    rng = np.random.default_rng(0)
    for i in range(batch_size):
        prompt = rng.integers(0, 1 << 29, context_len, dtype=np.int32)
        prompt.flags.writeable = False
        scheduler.add(SequenceGroup(Request(i, 0.0, prompt, steps + 3)))
    times = []
    for step in range(steps + 2):  # the first step prefills, the second warms up
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        scheduler.postprocess(plan, float(step), None)
        if step >= 2:
            times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1e3, 4)


def vllm_host_ms(batch_size: int, profile: str) -> float:
    """The host profile's per-step host time (ms) at ``batch_size`` (vLLM's, by default)."""
    from harness.engine.cost_profiles import load_host_profile

    host = load_host_profile(profile)
    return round(1e3 * (host.per_step_s + host.per_seq_s * batch_size), 4)


def roofline_decode_ms(model_name: str, hardware_name: str, batch_size: int,
                       context_len: int) -> tuple[float, bool]:
    """The sim's estimate of one decode step of ``batch_size`` sequences at ``context_len``,
    and whether that much KV fits the hardware profile's pool at all."""
    from harness.tools.calibrate import load_spec
    from harness.config.specs import CostSpec, EngineSpec, HardwareSpec, ModelSpec, kv_capacity_slots
    from harness.engine.sim_executor import RooflineCostModel

    model = load_spec(ModelSpec, "model", model_name, "model")
    hardware = load_spec(HardwareSpec, "hardware", hardware_name, "hardware")
    cost = RooflineCostModel(model, hardware, CostSpec())
    kv_read = batch_size * context_len
    seconds = cost.step_cost(batch_size, kv_read + batch_size, kv_read, num_seqs=batch_size).seconds
    return 1e3 * seconds, kv_read <= kv_capacity_slots(model, hardware, EngineSpec())


def run(batch_sizes, context_len: int, block_size: int, steps: int, device: torch.device,
        model: str, hardware: str, host_profile: str = "vidur_a100_llama2_7b_tp1") -> dict:
    rows = []
    for b in batch_sizes:
        step_ms, fits = roofline_decode_ms(model, hardware, b, context_len)
        scheduler = scheduler_ms(b, context_len, block_size, steps)
        for resident in (False, True):
            r = measure(b, context_len, block_size, steps, device, resident=resident)
            r["scheduler_ms_per_step"] = scheduler
            r["host_profile_ms_per_step"] = vllm_host_ms(b, host_profile)
            r["est_device_step_ms"] = round(step_ms, 4)
            r["kv_fits_device"] = fits
            r["share_of_step_pct"] = round(100 * r["ms_per_step"] / step_ms, 2)
            rows.append(r)
    return {"device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
            "host_to_device_copy": device.type == "cuda", "context_len": context_len,
            "block_size": block_size, "steps": steps, "model": model, "hardware": hardware,
            "host_profile": host_profile, "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"CPU-side cost per decode step (context {result['context_len']}, block "
             f"{result['block_size']}, device {result['device']}"
             + ("" if result["host_to_device_copy"] else "; NO GPU: host side only, no copy") + ")",
             "", "| batch | mode | ms/step | p90 | bytes sent | rows sent | scheduler ms/step "
             f"(pagebench) | host ms/step ({result['host_profile']}) | est. step ms "
             f"({result['model']} on {result['hardware']}, roofline) | KV fits | share |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['batch_size']} | {r['mode']} | {r['ms_per_step']} | {r['ms_p90']} | "
                     f"{r['bytes_per_step']} | {r['rows_uploaded_per_step']:.1f} | "
                     f"{r['scheduler_ms_per_step']} | {r['host_profile_ms_per_step']} | "
                     f"{r['est_device_step_ms']} | {'yes' if r['kv_fits_device'] else 'no'} | "
                     f"{r['share_of_step_pct']}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.hostcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument("--batch-sizes", type=positive_ints, default=DEFAULT_BATCHES,
                        help=f"comma list (default {','.join(map(str, DEFAULT_BATCHES))})")
    parser.add_argument("--context-len", type=positive_int, default=2048,
                        help="tokens each sequence holds (default 2048)")
    parser.add_argument("--block-size", type=positive_int, default=16, help="default 16")
    parser.add_argument("--steps", type=positive_int, default=32, help="decode steps timed (default 32)")
    parser.add_argument("--model", default="llama-2-13b",
                        help="conf/model entry for the device step estimate (default llama-2-13b)")
    parser.add_argument("--hardware", default="h200",
                        help="conf/hardware entry for the device step estimate (default h200)")
    parser.add_argument("--host-profile", default="vidur_a100_llama2_7b_tp1",
                        help="conf/host_profile entry to compare with (default vidur_a100_llama2_7b_tp1)")
    parser.add_argument("--cpu-threads", type=positive_int, default=1,
                        help="torch threads without a GPU (default 1)")
    parser.add_argument("--json", type=output_file, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    from harness.engine.torch_device import resolve_device
    from harness.errors import PagebenchError

    try:
        check_device(args.device)
        device = resolve_device(args.device)
        if device.type == "cpu":
            torch.set_num_threads(args.cpu_threads)  # host-side costs: parallel tiny ops only add waits
        result = run(args.batch_sizes, args.context_len, args.block_size, args.steps, device,
                     args.model, args.hardware, args.host_profile)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
