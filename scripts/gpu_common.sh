# Shared setup of scripts/gpu_check.sh (the one-call GPU check) and scripts/gpu_engine.sh.
# Set NAME (the summary's name), OUT_DIR and BUDGET_S, then
#   source "$(dirname "$0")/gpu_common.sh"
# It moves to the repository root (REPO), makes WORK (build/gpu_work/$NAME, emptied: every
# stage writes there; only pack_outputs writes to OUT_DIR), selects compiled Triton kernels,
# sets PY ($PYTHON, else python3), HAS_CUDA, START and LOG, and defines `stage` / `cuda_stage`,
# `install_pydeps`, `make_importable`, `rehearsal_python`, `engine_stage` and `pack_outputs`.
#
# Budget: every stage's limit and reserve are PERCENT of BUDGET_S (the whole call), so the
# plan scales with the budget and no reserve can exceed it; a stage gets
# min(its limit, time left - its reserve) and is skipped below MIN_STAGE_S.

if ! [[ "$BUDGET_S" =~ ^[0-9]+$ ]] || [ "$BUDGET_S" -lt 60 ]; then
  echo "$NAME.sh: --budget must be a whole number of seconds >= 60, got '$BUDGET_S'" >&2; exit 2
fi
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
WORK="$REPO/build/gpu_work/$NAME"
rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$WORK/$NAME.log"
STAGES="$WORK/stages.tsv"
: >"$LOG"
: >"$STAGES"
unset TRITON_INTERPRET            # compiled kernels, never the interpreter
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
START=$(date +%s)
MIN_STAGE_S=10
HAS_CUDA=0
if nvidia-smi -L >/dev/null 2>&1; then HAS_CUDA=1; fi
GPU_NAME="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

pct() { echo $(( BUDGET_S * $1 / 100 )); }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STAGES"; }

# stage NAME LIMIT_PCT RESERVE_PCT COMMAND...: run COMMAND (output appended to $LOG) for at most
# LIMIT_PCT of the budget, capped so that RESERVE_PCT of it stays for the later stages; the
# command sees its limit as $STAGE_LIMIT. Returns the command's status.
stage() {
  local name="$1" limit reserve; limit=$(pct "$2"); reserve=$(pct "$3"); shift 3
  local left=$(( START + BUDGET_S - $(date +%s) - reserve ))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt "$MIN_STAGE_S" ]; then
    echo "=== [$name] skipped: out of time budget" | tee -a "$LOG"
    record "$name" "skipped (time budget)" 0 0
    return 0
  fi
  run_stage "$name" "$limit" "$@"
}

# run_stage NAME LIMIT_S COMMAND...: COMMAND under `timeout`, recorded: SIGINT (a clean stop:
# the benchmark keeps its points, the engine marks runs incomplete) at LIMIT_S minus a grace of
# a fifth of it (at most 10 s), SIGKILL at LIMIT_S, so no stage outlasts its limit. The command
# sees the SIGINT time as $STAGE_LIMIT.
run_stage() {
  local name="$1" limit="$2"; shift 2
  local grace=$(( limit / 5 )); if [ "$grace" -gt 10 ]; then grace=10; fi; if [ "$grace" -lt 1 ]; then grace=1; fi
  local t0; t0=$(date +%s)
  echo "=== [$name] $(date -u +%H:%M:%S) (limit ${limit}s): $*" | tee -a "$LOG"
  STAGE_LIMIT=$(( limit - grace )) timeout --signal=INT --kill-after="$grace" "$(( limit - grace ))" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "=== [$name] rc=$rc after ${dt}s (limit ${limit}s)" | tee -a "$LOG"
  record "$name" "$rc" "$limit" "$dt"
  return $rc
}

# cuda_stage: a stage that needs CUDA; without it the stage says "no CUDA" and succeeds.
cuda_stage() {
  if [ "$HAS_CUDA" = 1 ]; then stage "$@"; return $?; fi
  echo "=== [$1] no CUDA: skipped" | tee -a "$LOG"
  record "$1" "no CUDA" 0 0
  return 0
}

# install_pydeps: the carried wheels (.whl/, else wheels/; scripts/gpu_wheels.sh) into
# build/gpu_pydeps with `pip install --no-index --no-deps --target`, on PYTHONPATH: the image's
# own packages stay as they are. Never skipped: it runs first, for LIMIT_PCT of the budget but
# at least PYDEPS_MIN_S (it took 1-2 s on the H200 and here; every later stage needs it).
PYDEPS_MIN_S=20
install_pydeps() {
  local limit; limit=$(pct "$1")
  if [ "$limit" -lt "$PYDEPS_MIN_S" ]; then limit=$PYDEPS_MIN_S; fi
  export GPU_PYDEPS="$REPO/build/gpu_pydeps"
  export PYTHONPATH="$GPU_PYDEPS${PYTHONPATH:+:$PYTHONPATH}"
  local dir
  for dir in .whl wheels; do
    if ls "$dir"/*.whl >/dev/null 2>&1; then
      rm -rf "$GPU_PYDEPS"
      local wheels=("$dir"/*.whl)
      if [ "${REHEARSE:-0}" = 1 ]; then
        # The wheels are built for the image's Python (3.12): a compiled one (pydantic-core,
        # cp312) cannot install on another Python. The rehearsal installs the others and
        # takes that one's import from this machine's site-packages (the same version:
        # constraints.txt); gpu_wheels.sh has already checked that the image's wheel exists.
        local tag; tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
        local kept=() wheel
        for wheel in "${wheels[@]}"; do
          case "$(basename "$wheel")" in
            *-cp3[0-9]*-*) if [[ "$(basename "$wheel")" == *"-$tag-"* ]]; then kept+=("$wheel"); else
                             echo "=== [pydeps] rehearsal: $(basename "$wheel") is for the image's Python, not $tag: skipped" | tee -a "$LOG"; fi ;;
            *) kept+=("$wheel") ;;
          esac
        done
        wheels=("${kept[@]}")
      fi
      run_stage pydeps "$limit" "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$GPU_PYDEPS" \
        "${wheels[@]}"
      return $?
    fi
  done
  echo "=== [pydeps] no .whl/ folder: bash scripts/gpu_wheels.sh, then carry [\".whl\"]" | tee -a "$LOG"
  record pydeps "no wheels" 0 0
  return 1
}

# make_importable: the repository is a plain copy there (no install): build/gpu_pkgs holds
# harness -> harness/, pagebench/{allocators,kernels,reports} -> those folders and
# hydra_plugins/<plugin> -> hydra_plugins/<plugin> (as pyproject.toml's packages and
# package-dir map them), first on PYTHONPATH.
make_importable() {
  export GPU_PKGS="$REPO/build/gpu_pkgs"
  rm -rf "$GPU_PKGS" && mkdir -p "$GPU_PKGS/pagebench" "$GPU_PKGS/hydra_plugins"
  ln -s "$REPO/harness" "$GPU_PKGS/harness"
  local p
  for p in allocators kernels reports; do ln -s "$REPO/$p" "$GPU_PKGS/pagebench/$p"; done
  for p in "$REPO"/hydra_plugins/*/; do [ -d "$p" ] && ln -s "${p%/}" "$GPU_PKGS/hydra_plugins/$(basename "$p")"; done
  export PYTHONPATH="$GPU_PKGS:$PYTHONPATH"
  echo "=== [importable] harness and pagebench.* from $GPU_PKGS (symlinks to the checkout)" | tee -a "$LOG"
}

# rehearsal_python: PY becomes a venv that looks like the H200 image to the project: it
# sees this machine's packages (torch, numpy, ...: the image has them) but not hydra-core,
# omegaconf, antlr4, Hydra plugins, nor an installed harness / pagebench: those come from
# the carried wheels and build/gpu_pkgs only (scripts/gpu_image_guard.py), as there; and it
# holds the image's Triton (3.6.0). GPU_REHEARSE_CLEAN=1 builds a clean venv with the image's
# package list instead (minutes: see benchmarks/gpu/README.md).
rehearsal_python() {
  local venv="$REPO/build/gpu_rehearse/venv"
  local base="${PYTHON:-python3}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "=== [rehearsal] venv $venv from $base" | tee -a "$LOG"
    if [ "${GPU_REHEARSE_CLEAN:-0}" = 1 ]; then
      "$base" -m venv "$venv" && env -u PIP_CONSTRAINT "$venv/bin/pip" install --quiet torch==2.13.0 triton==3.6.0 numpy pandas \
        pyarrow matplotlib scipy tqdm pyyaml jinja2 nvidia-ml-py pytest pytest-benchmark hypothesis \
        safetensors transformers numba >>"$LOG" 2>&1 || { echo "rehearsal venv failed (see $LOG)"; return 1; }
    else
      "$base" -m venv --system-site-packages "$venv" || return 1
    fi
  fi
  local triton="${GPU_REHEARSE_TRITON:-3.6.0}"
  if [ "$("$venv/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null)" != "$triton" ]; then
    # (not under CI's PIP_CONSTRAINT: constraints.txt pins this machine's Triton, not the image's)
    env -u PIP_CONSTRAINT "$venv/bin/pip" install --quiet "triton==$triton" >>"$LOG" 2>&1 \
      || { echo "triton $triton: install failed (see $LOG)"; return 1; }
  fi
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # --system-site-packages sees the BASE interpreter's site-packages: when $base is itself a
  # venv (CI's fresh venv), its own site-packages (torch & co.) is added by a .pth, after the
  # rehearsal venv's (whose Triton wins); GPU_REHEARSE_SITE=DIR names another such folder.
  local extra="${GPU_REHEARSE_SITE:-$("$base" -c 'import sys, sysconfig
print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")')}"
  if [ -n "$extra" ]; then echo "$extra" >"$site/zz_gpu_rehearse_site.pth"; else rm -f "$site/zz_gpu_rehearse_site.pth"; fi
  cp scripts/gpu_image_guard.py "$site/_gpu_image_guard.py"
  echo "import _gpu_image_guard" >"$site/_gpu_image_guard.pth"
  PY="$venv/bin/python"
  echo "=== [rehearsal] $("$PY" --version) in $venv; hydra/omegaconf/antlr4 only from the wheels, harness and" \
       "pagebench only from build/gpu_pkgs" | tee -a "$LOG"
}

# engine_stage NAME WORKLOAD LIMIT_PCT RESERVE_PCT: one serving run on the torch executor
# (paged vs contiguous max vs oracle, offline) into $WORK/engine/WORKLOAD. Reads ENGINE_MODEL,
# ENGINE_HARDWARE, ENGINE_DEVICE, ENGINE_REQUESTS, ENGINE_WALL_S, ENGINE_MODEL_ARGS (array).
engine_stage() {
  local name="$1" workload="$2"; shift 2
  stage "$name" "$1" "$2" "$PY" -m harness workload="$workload" engine=torch "${ENGINE_MODEL_ARGS[@]}" \
    hardware="$ENGINE_HARDWARE" engine.device="$ENGINE_DEVICE" "systems=[paged,max,oracle]" \
    workload.num_requests="$ENGINE_REQUESTS" workload.arrival.process=offline \
    engine.wall_time_limit_s="$ENGINE_WALL_S" progress=false hydra.run.dir="$WORK/engine/$workload"
}

# pack_outputs FILE...: OUT_DIR receives $NAME.tar.gz (all of WORK) and the FILES (paths in WORK)
# beside it, at most 8 files in all, none in a folder: what the device tool brings back.
pack_outputs() {
  local kept=0 f
  for f in "$@"; do
    if [ -f "$WORK/$f" ] && [ "$kept" -lt 7 ]; then cp "$WORK/$f" "$OUT_DIR/$(basename "$f")"; kept=$((kept + 1)); fi
  done
  tar -czf "$OUT_DIR/$NAME.tar.gz" -C "$WORK" . 2>>"$LOG" || echo "pack: tar failed" >>"$LOG"
  echo "=== [pack] $OUT_DIR: $NAME.tar.gz + $kept summaries ($(du -sh "$OUT_DIR/$NAME.tar.gz" | cut -f1))"
}

# summary TITLE: $WORK/$NAME.json and $NAME.md (date, device, commit, budget, stage table,
# kernel targets, engine table) by scripts/gpu_report.py.
summary() {
  "$PY" scripts/gpu_report.py summary "$WORK" "$NAME" "$1" --device "${GPU_NAME:-}" \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo none)" --budget "$BUDGET_S" \
    --elapsed "$(( $(date +%s) - START ))" --rehearsal "${REHEARSE:-0}" 2>>"$LOG" \
    || echo "summary failed (see $LOG)" | tee -a "$LOG"
}

# failed_stages: the number of stages whose rc is neither 0 nor "no CUDA" / skipped.
failed_stages() {
  awk -F'\t' '$2 != "0" && $2 != "no CUDA" && $2 !~ /^skipped/ {n++} END {print n + 0}' "$STAGES"
}
