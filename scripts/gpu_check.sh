#!/usr/bin/env bash
# The whole GPU check in ONE device call (benchmarks/gpu/README.md): kernels, the real engine,
# calibration, the GPU tests, within one time budget on an H200 that reaches no registry.
#
#   bash scripts/gpu_check.sh [--budget S] [OUT_DIR]              on the GPU (OUT_DIR default: $OUT)
#   bash scripts/gpu_check.sh --rehearse [--budget S] [OUT_DIR]   on a CPU machine (CI): the same
#        stages, the same install and import path; CUDA-only stages say "no CUDA", the kernel
#        benchmark runs its CPU sweep, the engine a tiny model on the CPU, and the kernels are
#        compiled for sm_90 with the image's Triton instead of being run
#   --budget S (default 540, GPU_CHECK_BUDGET_S): the whole call, in seconds; give the device
#        tool the same timeout_s. PYTHON picks the interpreter.
#
# Stages in order of value; each one's limit and reserve (kept for the later stages) are
# percentages of the budget (gpu_common.sh), so they scale with it:
#   stage          limit  reserve
#   pydeps            8%      0%   the carried wheels (.whl/): never skipped, runs first (>= 20 s)
#   imports           6%     80%   every module the stages import, torch/triton/device versions
#   kernel-bench     38%     45%   targets, block sweep, rest, repeat, then flex (pagebench.kernels.benchmark;
#                                  no new point 15 s before its SIGINT; SIGINT keeps every point)
#   docqa            16%     27%   the torch executor, llama-2-13b dims, paged vs max vs oracle
#   calibrate         8%     18%   python -m harness.tools.calibrate (fit of the sim on this GPU)
#   gpu-tests        10%      8%   pytest -m gpu (rehearsal: collect-only)
#   sharegpt_like    10%      4%   the torch executor, second workload
#   hostcost          3%      2%   python -m harness.tools.hostcost
#   compile-check    20%      2%   rehearsal only: the decode kernels compiled for sm_90 (fails on a spill)
#   summary + pack: the last 2%: OUT_DIR gets gpu_check.tar.gz (everything) and up to 7 summaries
#                   (gpu_check.md/json/log, kernel_results.json/md, engine.md), no folders
set -uo pipefail

REHEARSE=0
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) REHEARSE=1; shift ;;
    --budget) BUDGET_S="$2"; shift 2 ;;
    --budget=*) BUDGET_S="${1#*=}"; shift ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
OUT_DIR="${1:-${OUT:-outputs/gpu_check}}"
NAME=gpu_check
source "$(dirname "$0")/gpu_common.sh"

if [ "$REHEARSE" = 1 ]; then
  rehearsal_python || exit 1   # sets PY to a venv that sees none of the missing packages
  START=$(date +%s)             # the budget is for the stages (on the GPU there is no venv to build)
fi

# ---- setup: wheels, import path, versions ----------------------------------------------------
install_pydeps 8
make_importable
stage imports 6 80 "$PY" -c "import hydra, omegaconf, pydantic, torch, triton, pytest, harness.__main__, harness.tools.calibrate, \
harness.tools.hostcost, hydra_plugins.pagebench_capacity, pagebench.kernels.benchmark, pagebench.kernels.compile_check, pagebench.reports.render, \
pagebench.reports.kernel_figures; print('imports ok: hydra', hydra.__version__, 'omegaconf', omegaconf.__version__, 'pydantic', pydantic.VERSION, \
'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); \
print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')"
[ "$HAS_CUDA" = 1 ] && nvidia-smi >>"$LOG" 2>&1

# ---- kernels: targets, block sweep, rest, repeat, flex ----------------------------------------
mkdir -p "$WORK/kernels"
if [ "$HAS_CUDA" = 1 ]; then
  stage kernel-bench 38 45 bash -c "$PY -m pagebench.kernels.benchmark --device cuda --out '$WORK/kernels' \
    --set time_budget_s=\$(( STAGE_LIMIT - 15 ))"
else
  stage kernel-bench 38 45 "$PY" -m pagebench.kernels.benchmark --device cpu --out "$WORK/kernels" \
    --set cpu_repeats=1 --set "context_lens=[64]"
fi
if [ -f "$WORK/kernels/kernel_points.jsonl" ] && [ ! -f "$WORK/kernels/kernel_results.json" ]; then
  "$PY" -m pagebench.kernels.benchmark --summarize "$WORK/kernels" >>"$LOG" 2>&1   # a killed run
fi

# ---- the real engine, calibration, GPU tests ----------------------------------------------------
if [ "$HAS_CUDA" = 1 ]; then
  ENGINE_MODEL=llama-2-13b ENGINE_HARDWARE=h200 ENGINE_DEVICE=cuda ENGINE_REQUESTS=100 ENGINE_WALL_S=25
else  # the same path on the CPU: a tiny model, a few requests
  ENGINE_MODEL=tiny ENGINE_HARDWARE=cpu ENGINE_DEVICE=cpu ENGINE_REQUESTS=4 ENGINE_WALL_S=20
fi
ENGINE_MODEL_ARGS=(model="$ENGINE_MODEL")
mkdir -p "$WORK/engine"
engine_stage docqa docqa 16 27
stage calibrate 8 18 "$PY" -m harness.tools.calibrate --model "$ENGINE_MODEL" --hardware "$ENGINE_HARDWARE" \
  --device "$ENGINE_DEVICE" --name "$ENGINE_HARDWARE-$ENGINE_MODEL-fit" \
  --out "$WORK/engine/$ENGINE_HARDWARE-$ENGINE_MODEL-fit.yaml" --json "$WORK/engine/calibration.json"
if [ "$HAS_CUDA" = 1 ]; then
  stage gpu-tests 10 8 "$PY" -m pytest -m gpu -q -p no:cacheprovider --durations=10
else
  stage collect 10 8 "$PY" -m pytest --collect-only -q -p no:cacheprovider -m gpu
fi
engine_stage sharegpt_like sharegpt_like 10 4
stage hostcost 3 2 "$PY" -m harness.tools.hostcost --device "$ENGINE_DEVICE" --json "$WORK/engine/hostcost.json"
if [ "$REHEARSE" = 1 ]; then   # no GPU: compile for sm_90 with the image's Triton instead
  stage compile-check 20 2 "$PY" -m pagebench.kernels.compile_check --arch 90 --case mha-13b-bs16 \
    --case gqa-8b-bs1 --case gqa-8b-bs16-split --case read-bandwidth-probe
fi

# ---- summary and pack (the last 2% of the budget) -----------------------------------------------
"$PY" scripts/gpu_report.py figures "$WORK/kernels" >>"$LOG" 2>&1
"$PY" scripts/gpu_report.py engine-md "$WORK/engine" >"$WORK/engine.md" 2>>"$LOG"
summary "GPU check (one call: kernels, engine, calibration, tests)"
cp "$WORK/kernels/kernel_results.json" "$WORK/kernels/kernel_results.md" "$WORK/" 2>/dev/null
pack_outputs gpu_check.md gpu_check.json gpu_check.log kernel_results.json kernel_results.md engine.md
ELAPSED=$(( $(date +%s) - START ))
echo "total ${ELAPSED}s of a ${BUDGET_S}s budget"

# exit status: 1 when a stage failed (its rc is in the table) or the budget was overrun
if [ "$ELAPSED" -gt "$BUDGET_S" ]; then echo "over budget"; exit 1; fi
[ "$(failed_stages)" = 0 ] || exit 1
