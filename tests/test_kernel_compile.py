"""The kernels compile for sm_90 (H100/H200) without a GPU: no spills, 16-byte K/V loads.

The interpreter proves what the kernels compute; this proves they compile for a real GPU
and keeps an eye on how: ``pagebench.kernels.compile_check`` compiles the launches the wrappers make
with the JIT's own specialisation and Triton's bundled ptxas. It runs in a subprocess
because the test session may have imported Triton in interpreter mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # keep the session's Triton mode consistent with the kernel tests
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
from pagebench.kernels.decode_plan import DECODE_CONFIGS, SM90_DECODE_CTAS_PER_SM  # noqa: E402

CONFIG_CASES = [f"mha-13b-bs16-tile{c.tile_n}-w{c.num_warps}-s{c.num_stages}" for c in DECODE_CONFIGS[1:]]
CASES = ["gqa-8b-bs16-split", "contiguous-gqa-8b", "d80-bf16-window-alibi", "cache-write-and-copy",
         "mha-13b-bs16", "read-bandwidth-probe", *CONFIG_CASES]

SCRIPT = """
import json, sys
from dataclasses import asdict
from pagebench.kernels.compile_check import check
print(json.dumps([asdict(v) for v in check(sys.argv[1:], arch=90)]))
"""


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], dict]:
    if not PTXAS.exists():
        pytest.skip("this Triton build has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *CASES], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ModuleNotFoundError: No module named 'triton.backends.nvidia" in proc.stderr:
        pytest.skip("this Triton build has no NVIDIA backend")
    assert proc.returncode == 0, proc.stderr[-4000:]
    variants = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(v["case"], v["kernel"]): v for v in variants}


def test_every_launch_compiles_without_spilling(compiled):
    kernels = {kernel for _, kernel in compiled}
    assert kernels == {"_decode_kernel", "_reduce_splits_kernel", "_write_kv_kernel", "_copy_blocks_kernel",
                       "_read_kernel"}
    for (case, kernel), v in compiled.items():
        assert v["spill_bytes"] == 0, f"{case}/{kernel} spills {v['spill_bytes']} bytes"
        assert v["registers"] is not None and v["registers"] <= 255


def test_kv_rows_move_in_16_byte_loads(compiled):
    for case in ("gqa-8b-bs16-split", "contiguous-gqa-8b", "d80-bf16-window-alibi"):
        widths = {int(k): n for k, n in compiled[(case, "_decode_kernel")]["load_widths"].items()}
        assert widths.get(16, 0) > 0, f"{case}: no 16-byte loads {widths}"
        assert widths.get(2, 0) == 0, f"{case}: 2-byte (scalar fp16) loads {widths}"


def test_paged_kernel_pipelines_kv_as_deep_as_contiguous(compiled):
    """The block ids are prefetched a tile ahead, so K/V get the same shared-memory buffers."""
    paged = compiled[("gqa-8b-bs16-split", "_decode_kernel")]["shared_bytes"]
    contiguous = compiled[("contiguous-gqa-8b", "_decode_kernel")]["shared_bytes"]
    assert paged == contiguous


def test_every_fixable_config_compiles_and_loads_kv_in_16_bytes(compiled):
    for case in CONFIG_CASES:
        v = compiled[(case, "_decode_kernel")]
        assert v["spill_bytes"] == 0 and v["ctas_per_sm"] >= 1, case
        assert {int(k): n for k, n in v["load_widths"].items()}.get(2, 0) == 0, case


def test_split_heuristic_uses_the_default_configs_sm90_occupancy(compiled):
    """decode_plan.SM90_DECODE_CTAS_PER_SM is what the compiled default kernel allows."""
    for case in ("mha-13b-bs16", "gqa-8b-bs16-split", "contiguous-gqa-8b"):
        assert compiled[(case, "_decode_kernel")]["ctas_per_sm"] == SM90_DECODE_CTAS_PER_SM, case


def test_block_ids_are_loaded_once_per_block(compiled):
    """At block 16 and 64-token tiles a tile needs 4 ids, not 64: the paged kernel issues
    fewer 4-byte loads than it did with one id per token (33 on sm_90 before)."""
    paged = {int(k): n for k, n in compiled[("mha-13b-bs16", "_decode_kernel")]["load_widths"].items()}
    assert paged.get(4, 0) < 33
