#!/usr/bin/env bash
# Fetch, on a machine with a package registry, the wheels the H200 image lacks, so that
# scripts/gpu_check.sh can install them there without one.
#
#   bash scripts/gpu_wheels.sh [DIR]          (default: .whl/, git-ignored; the device tool's folder)
#
# The H200 image (benchmarks/gpu/README.md) has CPython 3.12, torch 2.11, triton 3.6 and
# IMAGE_HAS below. pagebench's dependencies that it lacks: hydra-core, omegaconf and
# hydra-core's antlr4-python3-runtime; pydantic with pydantic-core (a compiled wheel, for
# CPython 3.12 on manylinux x86_64), annotated-types and typing-inspection. Their
# requirements (checked below from each wheel's METADATA): PyYAML (in the image), packaging
# (in the image: pytest and transformers require it), typing-extensions >= 4.16 (the image
# has one of unknown version: it travels too, a newer one serves older users), and
# importlib-resources only on Python < 3.9. So exactly eight wheels travel.
#
# hydra-core 1.3 pins antlr4-python3-runtime==4.9.*, and PyPI has 4.9.3 only as an sdist
# (no wheel for any 4.9 release), so `pip download --only-binary=:all:` cannot fetch it.
# The runtime is pure Python: `pip wheel --no-deps` builds its py3-none-any wheel here
# (setuptools), the same file on any CPython 3 and any platform.
#
# The folder travels with the working tree only when the device tool's `carry` names it:
# carry [".whl"] (about 3.2 MB of the 64 MiB allowed). gpu_check.sh then installs the
# wheels with `pip install --no-index --no-deps --target build/gpu_pydeps` and puts that
# folder on PYTHONPATH, leaving the image's own packages as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PY="${PYTHON:-python3}"
mkdir -p "$DIR"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# What the image holds (distribution names, as pip normalises them), and what travels.
IMAGE_HAS="torch triton numpy pandas pyarrow matplotlib scipy tqdm pyyaml jinja2 nvidia-ml-py pytest
pytest-benchmark hypothesis safetensors transformers numba packaging"
# the versions CI tests; all py3-none-any but pydantic-core (cp312 manylinux x86_64)
BINARY_WHEELS=("hydra-core==1.3.8" "omegaconf==2.3.1" "pydantic==2.14.4" "pydantic-core==2.50.5"
               "annotated-types==0.8.0" "typing-inspection==0.4.5" "typing-extensions==4.16.0")
SDIST_ONLY=("antlr4-python3-runtime==4.9.3")              # built here, see above

rm -f "$DIR"/*.whl
for req in "${BINARY_WHEELS[@]}"; do
  echo "missing in the image: $req -> pip download"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --dest "$DIR" "$req"
done
for req in "${SDIST_ONLY[@]}"; do
  echo "missing in the image: $req (required by hydra-core; PyPI has only an sdist) -> pip wheel"
  "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$DIR" "$req"
done

# Every requirement of every wheel is either another wheel here or in the image (markers
# evaluated for CPython 3.12 on Linux); anything else stops the script.
"$PY" - "$DIR" "$IMAGE_HAS" <<'EOF'
import re, sys, zipfile
from pathlib import Path
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

folder, image = Path(sys.argv[1]), {canonicalize_name(n) for n in sys.argv[2].split()}
env = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.0",
                               "implementation_name": "cpython", "sys_platform": "linux",
                               "platform_system": "Linux", "platform_machine": "x86_64"}
wheels = sorted(folder.glob("*.whl"))
here = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env | {"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        where = "travels" if name in here else "in the image" if name in image else "MISSING"
        print(f"  {wheel.name.split('-')[0]} requires {req}: {where}")
        if where == "MISSING":
            missing.append(str(req))
if missing:
    sys.exit(f"error: requirements neither in the image nor downloaded: {', '.join(missing)}")
EOF

echo "wheels for the H200 image in $DIR/:"
ls -l "$DIR"/*.whl | awk '{printf "  %8.1f KB  %s\n", $5 / 1024, $NF}'
du -ch "$DIR"/*.whl | tail -1 | awk '{print "  total " $1 " (carry [\"'"$DIR"'\"])"}'
