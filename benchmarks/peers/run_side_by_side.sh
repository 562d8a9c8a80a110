#!/usr/bin/env bash
# pagebench's PagedKVCacheManager beside vLLM's and SGLang's KV-cache managers, on the
# peers' own seeded workload and driver (../shared/peers, or $PEERS_DIR), in one go.
#
#   bash benchmarks/peers/run_side_by_side.sh                  # rounds=3, pools 8192 4096
#   ROUNDS=5 POOLS="8192" bash benchmarks/peers/run_side_by_side.sh --repeat 3
#   SAVE=benchmarks/cpu bash benchmarks/peers/run_side_by_side.sh --repeat 3
#     -> also writes $SAVE/peers-<date>.jsonl (every run), .json (summary) and .md (table)
#
# Each round runs every peer on every pool one after the other (never in parallel),
# prefix caching off and on, so the ratios of a round are measured side by side; the
# summary prints each round's ratios and their median (shared machines drift by 20%+).
# Peers whose venv is missing are skipped (build them with ../shared/peers/*/setup.sh).
# Extra arguments pass through to every bench.py (--repeat, --requests, --seed ...).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$(cd "$ROOT/../shared/peers" 2>/dev/null && pwd)}"
export PEERS_DIR
OUT="${OUT:-/tmp/pagebench-peers-$(date +%Y%m%d-%H%M%S).jsonl}"
ROUNDS="${ROUNDS:-3}"
POOLS="${POOLS:-8192 4096}"
PY="${PYTHON:-python3}"
[ -f "$PEERS_DIR/common/workload.py" ] || { echo "no peers driver at $PEERS_DIR/common/workload.py (set PEERS_DIR)" >&2; exit 2; }
: > "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for pool in $POOLS; do
    echo "round $round/$ROUNDS, $pool blocks" >&2
    "$PY" "$HERE/bench_pagebench.py" --num-blocks "$pool" --prefix-caching both "$@" \
      | sed "s/^{/{\"round\": $round, /" | tee -a "$OUT"
    for peer in vllm sglang; do
      py="/tmp/peers-$peer/bin/python"
      if [ -x "$py" ]; then
        "$py" "$PEERS_DIR/$peer/bench.py" --num-blocks "$pool" --prefix-caching both "$@" \
          2>>"/tmp/peers-$peer.err" | sed "s/^{/{\"round\": $round, /" | tee -a "$OUT"
      else
        echo "skip $peer: run bash $PEERS_DIR/$peer/setup.sh first" >&2
      fi
    done
  done
done
echo "results in $OUT" >&2
if [ -n "${SAVE:-}" ]; then
  mkdir -p "$SAVE"
  stem="$SAVE/peers-$(date -u +%Y-%m-%d)"
  cp "$OUT" "$stem.jsonl"
  "$PY" "$HERE/summarize.py" "$OUT" --json "$stem.json" --markdown "$stem.md"
  echo "saved $stem.{jsonl,json,md}" >&2
else
  "$PY" "$HERE/summarize.py" "$OUT"
fi
