"""Shared test setup: the repo root on sys.path, the Triton interpreter on CPU, the
``run_cli`` fixture (the CLI in a subprocess) and the re-run of a kernel test module in a
fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Without a GPU, Triton kernels run under its interpreter. NOTE: this must be set
# before triton is first imported; the kernel tests also check and re-run themselves
# in a subprocess when it was not.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a dependency
    pass

# CI runs property tests with a fixed seed sequence, so a landing is never decided by a
# lucky draw; locally each run explores new examples.
try:
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Unit tests never time anything: with pytest-benchmark loaded, a ``benchmark``
    fixture runs its function once (``--benchmark-disable``) unless the command line
    asks for timing (``--benchmark-enable`` / ``--benchmark-only``). Set here rather
    than in ``addopts`` so that pytest runs where the plugin is not installed; this
    hook runs before the plugin's own ``pytest_configure`` reads the option."""
    if not config.pluginmanager.hasplugin("benchmark"):
        return
    if not (config.getoption("benchmark_enable") or config.getoption("benchmark_only")):
        config.option.benchmark_disable = True


class CliResult(subprocess.CompletedProcess):
    """A finished CLI run; ``output`` is its stdout then its stderr."""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class HarnessCli:
    """``python -m harness`` (or another ``module``) in a subprocess, as a user runs it: from
    the repository root, without a parent run's ``HYDRA_*`` variables or ``PAGEBENCH_RERUN``
    in its environment; ``run_dir`` (unless None) becomes ``hydra.run.dir``."""

    @staticmethod
    def command(run_dir: Path | None, *args: str, module: str = "harness") -> list[str]:
        tail = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
        return [sys.executable, "-m", module, *args, *tail]

    @staticmethod
    def env(extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("HYDRA_") and k != "PAGEBENCH_RERUN"}
        env.update(extra or {})
        return env

    def start(self, run_dir: Path | None, *args: str, module: str = "harness", cwd: Path = ROOT,
              env: dict[str, str] | None = None, stdout=subprocess.PIPE) -> subprocess.Popen:
        """Start it and return at once (several runs at once: ``start`` each, then ``wait``)."""
        return subprocess.Popen(self.command(run_dir, *args, module=module), cwd=cwd,
                                env=self.env(env), stdout=stdout, stderr=subprocess.PIPE,
                                text=True)

    @staticmethod
    def wait(proc: subprocess.Popen, timeout: float = 300) -> CliResult:
        stdout, stderr = proc.communicate(timeout=timeout)
        return CliResult(proc.args, proc.returncode, stdout, stderr)

    def __call__(self, run_dir: Path | None, *args: str, module: str = "harness",
                 cwd: Path = ROOT, env: dict[str, str] | None = None,
                 timeout: float = 300) -> CliResult:
        """Run it to the end."""
        return self.wait(self.start(run_dir, *args, module=module, cwd=cwd, env=env), timeout)


@pytest.fixture(scope="session")
def run_cli() -> HarnessCli:
    """``run_cli(run_dir, *overrides)`` runs ``python -m harness`` (see ``HarnessCli``)."""
    return HarnessCli()


def rerun_in_triton_interpreter(test_file: str, in_process: bool) -> tuple[Callable, Callable]:
    """The autouse fixture and the test of a Triton kernel test module, for when its kernels
    cannot run in this process (no CUDA, and triton was imported before TRITON_INTERPRET=1
    was set): every test of the module skips, and ``..._in_subprocess`` runs the module in a
    fresh interpreter with TRITON_INTERPRET=1 instead. Assign both at module level."""

    @pytest.fixture(autouse=True)
    def needs_triton(request):
        if not in_process and "in_subprocess" not in request.node.name:
            pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; the module's "
                        "..._in_subprocess test runs it in a fresh interpreter")

    @pytest.mark.skipif(in_process, reason="the kernels run in this process")
    def suite_in_subprocess():
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               test_file], env={**os.environ, "TRITON_INTERPRET": "1"},
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    return needs_triton, suite_in_subprocess
