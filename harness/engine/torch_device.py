"""The torch executor's device: which one, the model built on it, and the KV it can hold.

- ``resolve_device``: ``engine.device`` (``auto``, ``cpu``, ``cuda[:n]``) as a device, or a
  clear error when CUDA is asked for and absent.
- ``get_model``: the model for a run, built once per process (its systems share it).
- ``torch_kv_capacity_slots``: the KV slots a torch run gets, measured on the real device
  (CUDA: after profiling one forward pass) or capped by the host's memory (CPU).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

from harness.config.specs import EngineSpec, ModelSpec
from harness.engine.model import DecoderModel, dense_causal_attention
from harness.errors import ConfigError

_MODEL_CACHE: dict[tuple, DecoderModel] = {}


def set_cpu_threads(threads: int) -> None:
    """torch's thread count for CPU runs; more threads than cores only adds waits: say so once."""
    cores = os.cpu_count() or 1
    if threads > cores:
        _warn_once(f"warning: engine.cpu_threads={threads} is more than this host's {cores} cores: "
                   "the threads wait for each other and the run is slower (use at most "
                   f"{cores})")
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    print(message, file=sys.stderr)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"engine.device={name} but no CUDA device is available: use "
                          "engine.device=cpu (or auto)")
    return device


def resolve_batch_invariant(engine: EngineSpec, device: torch.device) -> bool:
    return device.type == "cpu" if engine.batch_invariant is None else bool(engine.batch_invariant)


def get_model(spec: ModelSpec, device: torch.device, seed: int, batch_invariant: bool) -> DecoderModel:
    """The model for these settings, built once per process (systems of a run share it).

    Only the latest model is kept, so a different model frees the previous one's memory.
    """
    key = (spec, str(device), int(seed), bool(batch_invariant))
    model = _MODEL_CACHE.get(key)
    if model is None:
        _MODEL_CACHE.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        model = DecoderModel(spec, device=device, seed=seed, batch_invariant=batch_invariant)
        _MODEL_CACHE[key] = model
    return model


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def torch_kv_capacity_slots(model_spec: ModelSpec, hardware, engine: EngineSpec, *,
                            max_model_len: int, seed: int = 0) -> int:
    """KV slots for the torch executor, from the real device.

    Explicit ``engine.kv_capacity_slots`` wins. On CUDA: load the model, profile one
    forward of ``profile_activation_tokens`` (default max_num_batched_tokens) tokens, then
    ``total * gpu_memory_utilization - weights - activation peak - non-torch memory``.
    On CPU: the hardware profile's formula, capped by the host's available memory.
    """
    from harness.config.specs import GIB, kv_capacity_slots

    device = resolve_device(engine.device)
    if engine.kv_capacity_slots is not None:
        if device.type != "cuda":  # the weights are built in host memory: check them first
            available = _host_available_bytes()
            need = model_spec.weight_bytes + engine.kv_capacity_slots * model_spec.bytes_per_slot
            if available is not None and need > available:
                raise ConfigError(
                    f"model={model_spec.name}'s weights ({model_spec.weight_bytes / GIB:.1f} GiB) and "
                    f"engine.kv_capacity_slots={engine.kv_capacity_slots} "
                    f"({engine.kv_capacity_slots * model_spec.bytes_per_slot / GIB:.1f} GiB) need "
                    f"more than this host's {available / GIB:.1f} GiB of available memory: use a "
                    "smaller model (e.g. model=tiny) or fewer slots")
        return engine.kv_capacity_slots
    if device.type == "cpu" and engine.cpu_threads is not None:
        set_cpu_threads(engine.cpu_threads)
    bytes_per_slot = model_spec.bytes_per_slot
    if device.type != "cuda":
        slots = kv_capacity_slots(model_spec, hardware, engine)
        available = _host_available_bytes()
        if available is not None:
            host = (available * engine.gpu_memory_utilization - model_spec.weight_bytes
                    - engine.activation_reserve_gib * GIB) // bytes_per_slot
            slots = min(slots, int(host))
        if slots <= 0:
            raise ConfigError("no host memory left for the KV cache: set engine.kv_capacity_slots")
        return slots
    model = get_model(model_spec, device, seed, resolve_batch_invariant(engine, device))
    tokens = engine.profile_activation_tokens or min(engine.max_num_batched_tokens, max_model_len)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        ids = torch.zeros(tokens, dtype=torch.long, device=device)
        hidden = model.forward(ids, torch.arange(tokens, device=device) % model_spec.max_context,
                               lambda _l, q, k, v: dense_causal_attention(q, k, v, 0))
        model.logits(hidden[:min(tokens, engine.max_num_seqs)])
        del hidden, ids
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    margin = 512 * 2**20  # prefill gathers, fragmentation, block tables, staging buffers
    kv_bytes = total * engine.gpu_memory_utilization - base - peak - non_torch - margin
    slots = int(kv_bytes // bytes_per_slot)
    print(f"torch capacity on {device_name(device)}: total {total / GIB:.1f} GiB x "
          f"{engine.gpu_memory_utilization} - weights {base / GIB:.1f} GiB - activation peak "
          f"{peak / GIB:.2f} GiB ({tokens} tokens) - non-torch {non_torch / GIB:.2f} GiB "
          f"-> {slots} KV slots", file=sys.stderr)
    if slots <= 0:
        raise ConfigError(f"model={model_spec.name} leaves no GPU memory for the KV cache: lower "
                          "engine.profile_activation_tokens / max_num_batched_tokens, raise "
                          "engine.gpu_memory_utilization, or use model.num_layers_override")
    return slots


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
