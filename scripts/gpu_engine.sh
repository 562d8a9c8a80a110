#!/usr/bin/env bash
# The real-engine part of the GPU check on its own (scripts/gpu_check.sh runs the same stages
# in its one call): llama-2-13b dimensions (random weights, or a local checkpoint:
# GPU_ENGINE_CHECKPOINT), fp16, through the torch executor: Triton kernels, CUDA graphs,
# measured step times, NVML.
#
#   bash scripts/gpu_engine.sh [--budget S] [OUT_DIR]     (default: $OUT, else outputs/gpu_engine)
#   GPU_ENGINE_REQUESTS=100 PYTHON=python3 override the defaults; GPU_ENGINE_MODEL / _HARDWARE /
#   _DEVICE (llama-2-13b / h200 / cuda) allow a CPU dry run:
#   GPU_ENGINE_MODEL=tiny GPU_ENGINE_HARDWARE=cpu GPU_ENGINE_DEVICE=cpu GPU_ENGINE_REQUESTS=4
#   GPU_ENGINE_CHECKPOINT=DIR: the serving runs use that local Hugging Face checkpoint
#   (model=hf model.path=DIR; nothing is downloaded); calibration and hostcost use GPU_ENGINE_MODEL.
#
# Stages (limit% / reserve% of the budget, gpu_common.sh): pydeps 8/0, docqa 35/40,
# sharegpt_like 25/20, calibrate 15/5, hostcost 4/2; then engine.md and the pack: OUT_DIR gets
# gpu_engine.tar.gz and gpu_engine.md/json/log, engine.md.
set -uo pipefail

BUDGET_S="${GPU_ENGINE_BUDGET_S:-400}"
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET_S="$2"; shift 2 ;;
    --budget=*) BUDGET_S="${1#*=}"; shift ;;
    -*) echo "gpu_engine.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
OUT_DIR="${1:-${OUT:-outputs/gpu_engine}}"
NAME=gpu_engine
source "$(dirname "$0")/gpu_common.sh"
ENGINE_REQUESTS="${GPU_ENGINE_REQUESTS:-100}"
ENGINE_MODEL="${GPU_ENGINE_MODEL:-llama-2-13b}"
ENGINE_HARDWARE="${GPU_ENGINE_HARDWARE:-h200}"
ENGINE_DEVICE="${GPU_ENGINE_DEVICE:-cuda}"
ENGINE_WALL_S="${GPU_ENGINE_WALL_S:-40}"
if [[ -n "${GPU_ENGINE_CHECKPOINT:-}" ]]; then
  ENGINE_MODEL_ARGS=(model=hf model.path="$GPU_ENGINE_CHECKPOINT")
else
  ENGINE_MODEL_ARGS=(model="$ENGINE_MODEL")
fi
echo "weights: ${GPU_ENGINE_CHECKPOINT:-random weights of $ENGINE_MODEL's dimensions}" | tee -a "$LOG"

install_pydeps 8
make_importable
mkdir -p "$WORK/engine"
engine_stage docqa docqa 35 40
engine_stage sharegpt_like sharegpt_like 25 20
stage calibrate 15 5 "$PY" -m harness.tools.calibrate --model "$ENGINE_MODEL" --hardware "$ENGINE_HARDWARE" \
  --device "$ENGINE_DEVICE" --name "$ENGINE_HARDWARE-$ENGINE_MODEL-fit" \
  --out "$WORK/engine/$ENGINE_HARDWARE-$ENGINE_MODEL-fit.yaml" --json "$WORK/engine/calibration.json"
stage hostcost 4 2 "$PY" -m harness.tools.hostcost --device "$ENGINE_DEVICE" --json "$WORK/engine/hostcost.json"

"$PY" scripts/gpu_report.py engine-md "$WORK/engine" >"$WORK/engine.md" 2>>"$LOG"
summary "GPU check (real engine)"
pack_outputs gpu_engine.md gpu_engine.json gpu_engine.log engine.md
[ "$(failed_stages)" = 0 ] || exit 1
