#!/usr/bin/env bash
# Call 1 of the GPU runbook (benchmarks/gpu/README.md): tests + kernels, under 8 minutes
# on an H200 that reaches no package registry.
#
#   bash scripts/gpu_check.sh [OUT_DIR]              on the GPU (default: $OUT, else outputs/gpu_check)
#   bash scripts/gpu_check.sh --rehearse [OUT_DIR]   on a CPU machine (CI): every stage up to its
#                                                    first CUDA call; CUDA stages say "no CUDA"
#   GPU_CHECK_BUDGET_S (450) caps the whole script; PYTHON picks the interpreter.
#
# Stages (each time-limited; a failing stage is recorded and the next one still runs):
#   pydeps        the carried wheels (wheels/, scripts/gpu_wheels.sh) into build/gpu_pydeps with
#                 `pip install --no-index --no-deps --target`, on PYTHONPATH: the image's own
#                 packages stay as they are; the project runs from the checkout (no install)
#   imports       every module the later stages import
#   device        nvidia-smi, torch / triton versions                                   (CUDA)
#   collect       pytest --collect-only -m gpu: collects without errors
#   gpu-tests     pytest -m gpu at real sizes                                           (CUDA)
#   kernel-plan   the benchmark's points in measuring order and its time estimate
#   kernel-bench  the benchmark (CUDA; the rehearsal runs the CPU sweep instead): each point
#                 lands in kernels/kernel_points.jsonl as measured; the stage timeout's SIGINT
#                 keeps them all and the summary is rebuilt from the log if the run was killed
#   kernel-figures  kernel_results.json -> PNGs
#   kernel-suite-cuda  the CI kernel tests compiled on CUDA, with the time left     (CUDA)
#   compile-check (rehearsal only) the decode kernel compiled for sm_90 with the image's Triton:
#                 fails on a spill (pagebench.kernels.compile_check)
#   summary       gpu_check.json + gpu_check.md: date, device, commit, stages, files to commit
set -uo pipefail

REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
OUT_DIR="${1:-${OUT:-outputs/gpu_check}}"
source "$(dirname "$0")/gpu_common.sh"
LOG="$OUT_DIR/gpu_check.log"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"   # the whole script (the device tool's timeout_s: 480)
: >"$LOG"

if [ "$REHEARSE" = 1 ]; then
  rehearsal_python || exit 1   # sets PY to a venv that sees none of the missing packages
  START=$(date +%s)             # the budget is for the stages (on the GPU there is no venv to build)
fi

# ---- setup -------------------------------------------------------------------------------
install_pydeps 380
stage imports 60 360 "$PY" -c "import hydra, omegaconf, torch, triton, pytest, harness.__main__, harness.tools.calibrate, \
harness.tools.hostcost, pagebench.kernels.benchmark, pagebench.kernels.compile_check, pagebench.reports.render, pagebench.reports.kernel_figures; \
print('imports ok: hydra', hydra.__version__, 'omegaconf', omegaconf.__version__, 'torch', torch.__version__, \
'triton', triton.__version__)"

# ---- device and tests -------------------------------------------------------------------------
GPU_NAME="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
cuda_stage device 30 350 bash -c "nvidia-smi; $PY -c 'import torch, triton; print(\"torch\", torch.__version__, \
\"cuda\", torch.version.cuda, \"triton\", triton.__version__); print(torch.cuda.get_device_name(0))'"
stage collect 90 320 "$PY" -m pytest --collect-only -q -p no:cacheprovider -m gpu
cuda_stage gpu-tests 100 260 "$PY" -m pytest -m gpu -q -p no:cacheprovider --durations=10

# ---- kernel benchmark ----------------------------------------------------------------------
mkdir -p "$OUT_DIR/kernels"
stage kernel-plan 30 250 "$PY" -m pagebench.kernels.benchmark --plan --device cuda
if [ "$HAS_CUDA" = 1 ]; then
  # the benchmark starts no new point 15 s before its limit; SIGINT at the limit keeps every point
  stage kernel-bench 240 40 bash -c "$PY -m pagebench.kernels.benchmark --device cuda --out '$OUT_DIR/kernels' \
    --set time_budget_s=\$(( STAGE_LIMIT - 15 ))"
else
  stage kernel-bench 120 40 "$PY" -m pagebench.kernels.benchmark --device cpu --out "$OUT_DIR/kernels" \
    --set cpu_repeats=1 --set "context_lens=[64]"
fi
if [ -f "$OUT_DIR/kernels/kernel_points.jsonl" ] && [ ! -f "$OUT_DIR/kernels/kernel_results.json" ]; then
  stage kernel-summary 20 30 "$PY" -m pagebench.kernels.benchmark --summarize "$OUT_DIR/kernels"   # killed run
fi
stage kernel-figures 30 10 "$PY" - "$OUT_DIR/kernels" <<'EOF'
import json, sys
from pathlib import Path
from pagebench.reports.kernel_figures import kernel_figures
out = Path(sys.argv[1])
results = json.loads((out / "kernel_results.json").read_text())
names = ["latency_vs_context", "bandwidth_vs_block_size", "paged_over_contiguous_vs_block_size"]
for name, (fig, _caption) in zip(names, kernel_figures(results)):
    fig.savefig(out / f"{name}.png", dpi=120)
print("targets:", json.dumps(results.get("targets"), indent=1))
EOF
if [ "$REHEARSE" = 1 ]; then   # no GPU: compile for sm_90 with the image's Triton instead
  stage compile-check 120 5 "$PY" -m pagebench.kernels.compile_check --arch 90 --case mha-13b-bs16 --case gqa-8b-bs1 \
    --case gqa-8b-bs16-split --case read-bandwidth-probe
fi
cuda_stage kernel-suite-cuda 150 5 "$PY" -m pytest -q -p no:cacheprovider -m "not gpu" \
  tests/test_kernel_decode.py tests/test_kernel_cache_write.py

# ---- summary -------------------------------------------------------------------------------
write_summary gpu_check "GPU check (call 1: tests + kernels)" kernels/kernel_results.md \
  kernels/kernel_results.json kernels/kernel_results.csv kernels/kernel_results.md \
  kernels/kernel_points.jsonl kernels/latency_vs_context.png kernels/bandwidth_vs_block_size.png \
  kernels/paged_over_contiguous_vs_block_size.png

# exit status: 1 when a stage failed (its rc is in the table; "no CUDA" and skipped count as passed)
for row in "${RESULTS[@]}"; do
  rc="$(echo "$row" | cut -d'|' -f3 | tr -d ' ')"
  case "$rc" in 0|noCUDA|nowheels/|skipped*) ;; *) exit 1 ;; esac
done
