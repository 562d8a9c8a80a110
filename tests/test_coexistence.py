"""pagebench lives beside an inference engineer's stack: Hugging Face's ``kernels`` (pulled in
by transformers 5), PyPI's ``reports`` and ``harness``, and whatever else sits in site-packages.

The import names pagebench puts into site-packages are ``harness`` (the app: ``python -m
harness`` is the entry point) and the ``pagebench`` namespace (``pagebench.allocators``,
``pagebench.kernels``, ``pagebench.reports``, mapped from the folders of those names in
pyproject.toml). Those three folders hold no ``__init__.py``: from a checkout (the current
directory first on ``sys.path``) they are at most namespace portions, which never shadow a
regular package of the same name. Each check runs in a fresh interpreter, from the checkout
and from another directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("allocators", "kernels", "reports")  # folder == last part of the import name

# Every kernel module a run or the kernel benchmark imports, beside HF's kernels and
# transformers' hub-kernel integration (which imports ``kernels`` at module level).
PROBE = r"""
import json, sys
import kernels as hf_kernels
import transformers.integrations.hub_kernels as hub
from kernels import get_kernel  # HF's API, not ours
import pagebench.kernels.paged_decode, pagebench.kernels.contiguous_decode
import pagebench.kernels.paged_prefill, pagebench.kernels.cache_write
import pagebench.kernels.reference, pagebench.kernels.benchmark
import pagebench.allocators.registry as registry
import pagebench.reports.render
import harness.run.serve, harness.engine.torch_executor
print(json.dumps({"hf_kernels": hf_kernels.__file__,
                  "ours": pagebench.kernels.paged_decode.__file__,
                  "managers": sorted(registry.MANAGERS)}))
"""


def _probe(cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hf_kernels_installed():
    pytest.importorskip("kernels", reason="Hugging Face's kernels is in the test extra")
    pytest.importorskip("transformers")


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_hf_kernels_transformers_and_pagebench_import_in_one_process(where, tmp_path,
                                                                      hf_kernels_installed):
    found = _probe(ROOT if where == "checkout" else tmp_path)
    assert not Path(found["hf_kernels"]).resolve().is_relative_to(ROOT), found
    assert Path(found["ours"]).resolve() == ROOT / "kernels" / "paged_decode.py"
    assert {"paged", "contiguous", "radix"} <= set(found["managers"])


def test_the_kernel_experiment_runs_from_another_directory(tmp_path, hf_kernels_installed):
    """Issue 31's second failure: ``python -m harness experiment=kernels`` outside the checkout
    once HF's kernels is installed (it died importing ``kernels.benchmark`` from HF's)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "experiment=kernels", "kernel_bench.batch_sizes=[2]",
         "kernel_bench.context_lens=[32]", "kernel_bench.block_sizes=[8]",
         "kernel_bench.cpu_repeats=1", "report=false", f"hydra.run.dir={out}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "kernel_results.json").is_file()


def test_the_library_folders_hold_no_init_so_a_checkout_never_shadows_a_package():
    for folder in LIBRARIES:
        assert not (ROOT / folder / "__init__.py").exists(), (
            f"{folder}/__init__.py would make ./{folder} shadow PyPI's {folder!r} from a checkout")


def test_pyproject_lists_every_package_folder():
    """A package folder missing from pyproject's explicit list would be left out of an install."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    expected = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "harness").rglob("__init__.py")}
    expected |= {f"pagebench.{folder}" for folder in LIBRARIES} | {"harness.conf"}
    # Hydra finds sweepers only in its ``hydra_plugins`` namespace (experiment=capacity's)
    expected |= {"hydra_plugins.pagebench_capacity"}
    assert listed == expected
    assert tool["package-dir"] == {**{f"pagebench.{f}": f for f in LIBRARIES}, "harness.conf": "conf"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("pagebench-*.whl")
    return wheel


def test_the_wheel_puts_only_its_own_import_names_into_site_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    # hydra_plugins is Hydra's plugin namespace (no __init__.py: shared with Hydra's launchers)
    assert top == {"harness", "pagebench", "hydra_plugins"}
    assert not any(n.startswith("hydra_plugins/__init__") for n in names)
    for module in ("pagebench/kernels/paged_decode.py", "pagebench/allocators/registry.py",
                   "pagebench/reports/claims.yaml", "harness/run/serve.py", "harness/__main__.py",
                   "harness/conf/config.yaml", "harness/conf/workload/docqa.yaml"):
        assert module in names
    assert not any(n.startswith("pagebench/kernels/__init__") for n in names)


def test_a_wheel_install_runs_the_main_job_from_another_directory(wheel, tmp_path):
    """Not only the editable install: the wheel carries conf/ (as harness/conf), so a plain
    ``pip install .`` runs ``python -m harness`` anywhere (checked on a small docqa run)."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # -I would drop the environment's site-packages too; instead the wheel's folder goes first
    # and the checkout is not on the path (cwd is elsewhere)
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-m", "harness", "workload=docqa", "workload.num_requests=20",
                           "report=false", "progress=false", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").is_file()
    probe = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__, harness.CONF_DIR)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == [str(site / "harness" / "__init__.py"), str(site / "harness" / "conf")]


@pytest.mark.parametrize("old, new", [("harness.calibrate", "harness.tools.calibrate"),
                                      ("harness.hostcost", "harness.tools.hostcost"),
                                      ("harness.traces", "harness.tools.traces")])
def test_the_old_tool_paths_still_run_the_tools(old, new, tmp_path):
    """``python -m harness.calibrate`` (and hostcost, traces) forward to harness/tools/ for
    one release: the same usage line as the new path's."""
    def usage(module: str) -> str:
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    assert usage(old) == usage(new) and "usage:" in usage(new)
