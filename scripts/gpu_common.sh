# Shared setup of scripts/gpu_check.sh and scripts/gpu_engine.sh. Set OUT_DIR, then
#   source "$(dirname "$0")/gpu_common.sh"
# It makes OUT_DIR (an absolute path afterwards), moves to the repository root (REPO),
# selects compiled Triton kernels, sets PY ($PYTHON, else python3), HAS_CUDA, START and
# RESULTS, and defines `stage` / `cuda_stage` (log to $LOG within $BUDGET_S: set both
# before the first stage), `rehearsal_python` and `write_summary`.

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
unset TRITON_INTERPRET            # compiled kernels, never the interpreter
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
START=$(date +%s)
declare -a RESULTS=()
HAS_CUDA=0
if nvidia-smi -L >/dev/null 2>&1; then HAS_CUDA=1; fi

# stage NAME LIMIT_S RESERVE_S COMMAND...: run COMMAND (output appended to $LOG) for at most
# LIMIT_S, capped so that RESERVE_S stay for the later stages; the command sees its limit as
# $STAGE_LIMIT. Records "| name | rc | limit | time |" in RESULTS and returns the command's status.
stage() {
  local name="$1" limit="$2" reserve="$3"; shift 3
  local left=$(( START + BUDGET_S - $(date +%s) - reserve ))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then
    echo "=== [$name] skipped: out of time budget" | tee -a "$LOG"
    RESULTS+=("| $name | skipped (time budget) | 0s | 0s |")
    return 0
  fi
  local t0=$(date +%s)
  echo "=== [$name] $(date -u +%H:%M:%S) (limit ${limit}s): $*" | tee -a "$LOG"
  STAGE_LIMIT=$limit timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "=== [$name] rc=$rc after ${dt}s (limit ${limit}s)" | tee -a "$LOG"
  RESULTS+=("| $name | $rc | ${limit}s | ${dt}s |")
  return $rc
}

# install_pydeps: the carried wheels (wheels/, scripts/gpu_wheels.sh) into build/gpu_pydeps
# with `pip install --no-index --no-deps --target`, on PYTHONPATH with the checkout: the
# image's own packages stay as they are and the project runs from the checkout (no install).
install_pydeps() {
  export GPU_PYDEPS="$REPO/build/gpu_pydeps"
  export PYTHONPATH="$REPO:$GPU_PYDEPS${PYTHONPATH:+:$PYTHONPATH}"
  if ls wheels/*.whl >/dev/null 2>&1; then
    rm -rf "$GPU_PYDEPS"
    stage pydeps 60 "$1" "$PY" -m pip install --quiet --no-index --no-deps --target "$GPU_PYDEPS" wheels/*.whl
  else
    echo "=== [pydeps] no wheels/ folder: carry it (bash scripts/gpu_wheels.sh; carry [\"wheels\"])" | tee -a "$LOG"
    RESULTS+=("| pydeps | no wheels/ | 0s | 0s |")
  fi
}

# cuda_stage: a stage that needs CUDA; without it the stage says "no CUDA" and succeeds.
cuda_stage() {
  if [ "$HAS_CUDA" = 1 ]; then stage "$@"; return $?; fi
  echo "=== [$1] no CUDA: skipped" | tee -a "$LOG"
  RESULTS+=("| $1 | no CUDA | $2s | 0s |")
  return 0
}

# rehearsal_python: PY becomes a venv that looks like the H200 image to the project: it
# sees this machine's packages (torch, numpy, ...: the image has them) but not hydra-core,
# omegaconf, antlr4 or Hydra plugins, which then come from the carried wheels only
# (scripts/gpu_image_guard.py), and it holds the image's Triton (3.6.0). GPU_REHEARSE_CLEAN=1 builds a clean venv with the image's
# package list instead (minutes: see benchmarks/gpu/README.md).
rehearsal_python() {
  local venv="$REPO/build/gpu_rehearse/venv"
  local base="${PYTHON:-python3}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "=== [rehearsal] venv $venv from $base" | tee -a "$LOG"
    if [ "${GPU_REHEARSE_CLEAN:-0}" = 1 ]; then
      "$base" -m venv "$venv" && "$venv/bin/pip" install --quiet torch==2.13.0 triton==3.6.0 numpy pandas \
        pyarrow matplotlib scipy tqdm pyyaml jinja2 nvidia-ml-py pytest pytest-benchmark hypothesis \
        safetensors transformers numba >>"$LOG" 2>&1 || { echo "rehearsal venv failed (see $LOG)"; return 1; }
    else
      "$base" -m venv --system-site-packages "$venv" || return 1
    fi
  fi
  # the image's Triton (the compile check below compiles with it: its analyses differ)
  local triton="${GPU_REHEARSE_TRITON:-3.6.0}"
  if [ "$("$venv/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null)" != "$triton" ]; then
    "$venv/bin/pip" install --quiet "triton==$triton" >>"$LOG" 2>&1 || { echo "triton $triton: install failed"; return 1; }
  fi
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cp scripts/gpu_image_guard.py "$site/_gpu_image_guard.py"
  echo "import _gpu_image_guard" >"$site/_gpu_image_guard.pth"
  PY="$venv/bin/python"
  echo "=== [rehearsal] $("$PY" --version) in $venv; hydra/omegaconf/antlr4 only from the wheels" | tee -a "$LOG"
}

# write_summary NAME TITLE INCLUDED_MD FILES...: $OUT_DIR/NAME.json and NAME.md with date,
# device, commit, the stage table, INCLUDED_MD (relative to OUT_DIR) and the files to commit
# under benchmarks/gpu/ (those of FILES that exist, plus the summary itself).
write_summary() {
  local name="$1" title="$2" included="$3"; shift 3
  "$PY" - "$OUT_DIR" "$name" "$title" "$included" "${GPU_NAME:-}" "$(( $(date +%s) - START ))" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo none)" "${REHEARSE:-0}" "$#" "$@" "${RESULTS[@]}" <<'EOF'
import datetime, json, sys
from pathlib import Path
out, name, title, included, device, total, commit, rehearse, nfiles = sys.argv[1:10]
files = sys.argv[10:10 + int(nfiles)]
stages = [[c.strip() for c in line.strip("|").split("|")] for line in sys.argv[10 + int(nfiles):]]
out = Path(out)
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
kept = [f for f in files if (out / f).is_file()] + [f"{name}.json", f"{name}.md"]
doc = {"name": name, "date": date, "device": device or "no CUDA device", "commit": commit,
       "rehearsal": rehearse == "1", "total_s": int(total),
       "stages": [dict(zip(("stage", "rc", "limit", "time"), s)) for s in stages],
       "files_to_commit": kept}
(out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
lines = [f"# {title}{' -- rehearsal, no GPU' if doc['rehearsal'] else ''}", "",
         f"- date: {date}", f"- device: {doc['device']}", f"- commit: {commit}", f"- total: {total} s", "",
         "| stage | rc | limit | time |", "|---|---|---|---|", *[f"| {' | '.join(s)} |" for s in stages], ""]
if included and (out / included).is_file():
    lines += [l.replace("# ", "## ", 1) if l.startswith("# ") else l for l in (out / included).read_text().splitlines()]
lines += ["", "## Files to commit (under benchmarks/gpu/, see its README)", ""] + [f"- {f}" for f in kept]
(out / f"{name}.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:12 + len(stages)]))
print(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")
EOF
}
