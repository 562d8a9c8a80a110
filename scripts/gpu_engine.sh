#!/usr/bin/env bash
# The real-engine GPU check (issue 5): llama-2-13b dimensions (random weights, or a local
# checkpoint: GPU_ENGINE_CHECKPOINT), fp16, on the
# lent GPU (an H200), through the torch executor: Triton kernels, measured step times, NVML.
#
#   bash scripts/gpu_engine.sh [OUT_DIR]     (default: $OUT/engine, else outputs/gpu_engine)
#   GPU_ENGINE_REQUESTS=200 GPU_ENGINE_BUDGET_S=400 PYTHON=python3 override the defaults;
#   GPU_ENGINE_MODEL / _HARDWARE / _DEVICE (llama-2-13b / h200 / cuda) allow a CPU dry run:
#   GPU_ENGINE_MODEL=tiny GPU_ENGINE_HARDWARE=cpu GPU_ENGINE_DEVICE=cpu GPU_ENGINE_REQUESTS=4
#   GPU_ENGINE_CHECKPOINT=DIR: stages 1-2 run that local Hugging Face checkpoint (model=hf
#   model.path=DIR; nothing is downloaded); unset, random weights of GPU_ENGINE_MODEL's
#   dimensions. engine.md says which (calibration and hostcost always use GPU_ENGINE_MODEL).
#
# Stages (each time-limited; a failing stage is recorded and the next still runs):
#   1. docqa, offline, paged vs contiguous max vs oracle   -> docqa/results.json, report.html
#   2. sharegpt_like, offline, same systems                 -> sharegpt_like/...
#   3. calibration fit of the sim (python -m harness.tools.calibrate) -> h200-llama-2-13b-fit.yaml
#   4. CPU-side block-table cost vs batch (python -m harness.tools.hostcost)
#   5. engine.md: throughput, batch sizes, memory breakdown, energy/token, digests, fit error
# Stages 1-2 together are sized for about 3 minutes (each system also stops itself after
# engine.wall_time_limit_s and is then marked incomplete rather than overrunning).
set -uo pipefail

OUT_DIR="${1:-${OUT:+$OUT/engine}}"
OUT_DIR="${OUT_DIR:-outputs/gpu_engine}"
source "$(dirname "$0")/gpu_common.sh"
LOG="$OUT_DIR/engine.log"
BUDGET_S="${GPU_ENGINE_BUDGET_S:-400}"
REQUESTS="${GPU_ENGINE_REQUESTS:-200}"
MODEL="${GPU_ENGINE_MODEL:-llama-2-13b}"
HARDWARE="${GPU_ENGINE_HARDWARE:-h200}"
DEVICE="${GPU_ENGINE_DEVICE:-cuda}"
FIT_NAME="$HARDWARE-$MODEL-fit"

: >"$LOG"
install_pydeps 360   # the carried wheels (gpu_common.sh); a fresh machine needs them again
GPU_NAME="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
CHECKPOINT="${GPU_ENGINE_CHECKPOINT:-}"
if [[ -n "$CHECKPOINT" ]]; then
  MODEL_ARGS=(model=hf model.path="$CHECKPOINT")
  WEIGHTS="checkpoint $CHECKPOINT (model=hf)"
else
  MODEL_ARGS=(model="$MODEL")
  WEIGHTS="random weights of $MODEL's dimensions (no checkpoint given: GPU_ENGINE_CHECKPOINT)"
fi
echo "weights: $WEIGHTS" | tee -a "$LOG"
COMMON=(engine=torch "${MODEL_ARGS[@]}" hardware="$HARDWARE" engine.device="$DEVICE" "systems=[paged,max,oracle]"
        workload.num_requests="$REQUESTS" workload.arrival.process=offline
        engine.wall_time_limit_s=40 progress=false)

stage docqa 140 250 "$PY" -m harness workload=docqa "${COMMON[@]}" hydra.run.dir="$OUT_DIR/docqa"
stage sharegpt_like 140 110 "$PY" -m harness workload=sharegpt_like "${COMMON[@]}" \
  hydra.run.dir="$OUT_DIR/sharegpt_like"
stage calibrate 80 30 "$PY" -m harness.tools.calibrate --model "$MODEL" --hardware "$HARDWARE" \
  --device "$DEVICE" --name "$FIT_NAME" --out "$OUT_DIR/$FIT_NAME.yaml" --json "$OUT_DIR/calibration.json"
stage hostcost 30 0 "$PY" -m harness.tools.hostcost --device "$DEVICE" --json "$OUT_DIR/hostcost.json"

"$PY" - "$OUT_DIR" "$WEIGHTS" "${RESULTS[@]}" >"$OUT_DIR/engine.md" 2>>"$LOG" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"# Real-engine run (torch executor)\n\nweights: {sys.argv[2]}\n")
print("| stage | rc | limit | time |\n|---|---|---|---|")
print("\n".join(sys.argv[3:]))
for name in ("docqa", "sharegpt_like"):
    path = out / name / "results.json"
    if not path.is_file():
        print(f"\n## {name}: no results"); continue
    r = json.loads(path.read_text())
    systems = r["systems"]
    digests = {s.get("output_digest") for s in systems.values()}
    print(f"\n## {name} ({r['workload'].get('num_requests', '?')} requests, capacity "
          f"{r['capacity_slots']} slots, complete={r['complete']})\n")
    print(f"same tokens on every system (output_digest): {len(digests) == 1}\n")
    print("| system | out tok/s | req/s | mean batch | max batch | token_states % | reserved % | "
          "internal frag % | external frag % | preempt | decode step p50 ms | host prep % | "
          "J/token | mean W | SM MHz | complete |")
    print("|---" * 16 + "|")
    for n, s in systems.items():
        m, e = s["memory"], s.get("executor", {})
        print(f"| {n} | {s['throughput']['output_tokens_per_s']} | {s['throughput']['requests_per_s']} | "
              f"{s['batch']['mean_seqs']} | {s['batch']['max_seqs']} | {m.get('token_states_pct')} | "
              f"{m.get('reserved_pct')} | {m.get('internal_fragmentation_pct')} | "
              f"{m.get('external_fragmentation_pct')} | {s['preemptions']} | "
              f"{e.get('decode_step_ms', {}).get('p50')} ({e.get('decode_path')}) | "
              f"{e.get('host_prep_share_pct')} | "
              f"{s.get('energy_per_token_j')} | {s.get('nvml', {}).get('mean_power_w')} | "
              f"{s.get('nvml', {}).get('mean_sm_clock_mhz')} | {s['complete']} |")
cal = out / "calibration.json"
if cal.is_file():
    c = json.loads(cal.read_text())
    print(f"\n## Calibration ({c['device']}, {c['train_steps']} fitted steps)\n")
    for key in ("held_back_error", "held_back_decode_error", "held_back_prefill_error", "train_error"):
        print(f"- {key}: {c[key]}")
    print(f"- coefficients: {c['coefficients']}")
host = out / "hostcost.json"
if host.is_file():
    from harness.tools.hostcost import markdown
    print("\n## CPU-side block-table cost\n")
    print(markdown(json.loads(host.read_text())))
EOF
write_summary gpu_engine "GPU check (call 2: real engine)" engine.md engine.md engine.log calibration.json \
  "$FIT_NAME.yaml" hostcost.json docqa/results.json sharegpt_like/results.json docqa/report.html \
  sharegpt_like/report.html
