#!/usr/bin/env bash
# Regression gate for CI: run a small deterministic smoke sweep on the sim executor
# and compare it with the committed baseline (baselines/smoke.json).
#
#   scripts/ci_gate.sh             # exit 0 pass, 1 regression, 2 bad input / failed sweep
#   scripts/ci_gate.sh --update    # rewrite baselines/smoke.json deliberately (review the diff)
#
# PAGEBENCH_GATE_DIR=DIR keeps the sweep and the gate report (gate.md, gate.json) there;
# by default they go to a temporary directory, printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
BASELINE="${PAGEBENCH_BASELINE:-baselines/smoke.json}"
OUT="${PAGEBENCH_GATE_DIR:-$(mktemp -d -t pagebench-gate.XXXXXX)}"
rm -rf "$OUT/sweep" "$OUT/gate"
mkdir -p "$OUT"

# The smoke sweep: 2 workloads x 2 block sizes, 64 requests each, a small KV pool so that
# preemption and external fragmentation occur. Change it only together with --update.
# slo.ttft_ms: a target inside the smoke's TTFT range, so that goodput and SLO attainment
# are gated too (a gate fixture, not a claim about any system).
SMOKE=(workload=docqa,sharegpt_like block_size=8,32 workload.num_requests=64
       workload.arrival.rate=8 engine.kv_capacity_slots=4096 seed=0 progress=false
       slo.ttft_ms=30000)

update=0
for arg in "$@"; do [[ "$arg" == "--update" ]] && update=1; done
if (( ! update )) && [[ ! -f "$BASELINE" ]]; then  # before the sweep, not after it
    echo "ci_gate: baseline $BASELINE not found; create it with: scripts/ci_gate.sh --update" >&2
    exit 2
fi

start=$(date +%s)
if ! "$PYTHON" -m harness -m "${SMOKE[@]}" hydra.sweep.dir="$OUT/sweep" >"$OUT/sweep.log" 2>&1; then
    cat "$OUT/sweep.log" >&2
    echo "ci_gate: the smoke sweep failed (log above, also in $OUT/sweep.log)" >&2
    exit 2
fi
echo "ci_gate: smoke sweep took $(( $(date +%s) - start )) s ($OUT/sweep)"

status=0
"$PYTHON" -m harness.gate "$OUT/sweep" --baseline "$BASELINE" --out "$OUT/gate" \
    --failures-only "$@" || status=$?
if [[ -f "$OUT/gate/gate.md" ]]; then
    echo "ci_gate: full table in $OUT/gate/gate.md"
fi
exit "$status"
