# Shared setup of scripts/gpu_check.sh and scripts/gpu_engine.sh. Set OUT_DIR, then
#   source "$(dirname "$0")/gpu_common.sh"
# It makes OUT_DIR (an absolute path afterwards), moves to the repository root, selects
# compiled Triton kernels, sets PY ($PYTHON, else python3), START and RESULTS, and
# defines `stage`, which logs to $LOG within $BUDGET_S (set both before the first stage).

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
unset TRITON_INTERPRET            # compiled kernels, never the interpreter
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
START=$(date +%s)
declare -a RESULTS=()

# stage NAME LIMIT_S RESERVE_S COMMAND...: run COMMAND (output appended to $LOG) for at most
# LIMIT_S, capped so that RESERVE_S stay for the later stages; the command sees its limit as
# $STAGE_LIMIT. Records "| name | rc | time |" in RESULTS and returns the command's status.
stage() {
  local name="$1" limit="$2" reserve="$3"; shift 3
  local left=$(( START + BUDGET_S - $(date +%s) - reserve ))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then
    echo "=== [$name] skipped: out of time budget" | tee -a "$LOG"
    RESULTS+=("| $name | skipped (time budget) | 0s |")
    return 0
  fi
  local t0=$(date +%s)
  echo "=== [$name] $(date -u +%H:%M:%S) (limit ${limit}s): $*" | tee -a "$LOG"
  STAGE_LIMIT=$limit timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "=== [$name] rc=$rc after ${dt}s" | tee -a "$LOG"
  RESULTS+=("| $name | $rc | ${dt}s |")
  return $rc
}
