"""Where a kernel call runs: compiled Triton, the Triton interpreter, or the torch reference.

Every public wrapper in ``kernels`` takes ``backend="auto" | "triton" | "torch"``:

* ``"auto"`` (default): CUDA tensors run the compiled Triton kernel. CPU tensors run the
  Triton interpreter when it is active (see below), and the torch reference (float32
  math, output in the input dtype) otherwise -- the CPU execution path of the engine.
* ``"triton"``: always the Triton kernel; on CPU tensors this needs the interpreter.
* ``"torch"``: always the torch reference.

NOTE: ``triton.jit`` decides between compiling and interpreting when the decorator runs,
so the interpreter is active only if ``TRITON_INTERPRET=1`` was in the environment when
``triton`` was first imported (Triton's own library functions, ``tl.max`` & co., are
decorated at that moment too) and is still set when the kernel is called. Test suites
set it at the top of ``tests/conftest.py`` (or of the test module) on machines without CUDA.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
import triton

Backend = Literal["auto", "triton", "torch"]
BACKENDS = ("auto", "triton", "torch")

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)

def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET`` is set to a true value in the environment now."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def resolve_backend(backend: str, device: torch.device) -> Literal["triton", "torch"]:
    """The backend a call on ``device`` uses, given the caller's choice (see module doc)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    if device.type != "cpu":
        return "triton"
    if interpreter_active():
        return "triton"
    if backend == "triton":
        raise ValueError("backend='triton' on CPU tensors needs the Triton interpreter: set "
                         "TRITON_INTERPRET=1 before triton is first imported, or use CUDA tensors")
    return "torch"


def interpreter_active() -> bool:
    """True when jit kernels are interpreted: TRITON_INTERPRET=1 now and at triton's import."""
    from triton.runtime.interpreter import InterpretedFunction

    return interpreter_requested() and isinstance(triton.language.standard.cdiv, InterpretedFunction)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (no split-K on CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """The one device of all given tensors; ValueError naming the odd one out."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {first}; "
                             "move all inputs to one device")
    return first


def check_float_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")


def check_index_tensor(name: str, t: torch.Tensor, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}; use .to(torch.int32)")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
