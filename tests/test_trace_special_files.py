"""A trace path that exists but is not a regular file (a FIFO, /dev/zero) is named as what
it is, in one line, never "no such file" and never a hang reading it."""

from __future__ import annotations

import os

import pytest

from harness.errors import ConfigError
from harness.workloads.tables import resolve_path


def test_a_device_is_named_as_one():
    with pytest.raises(ConfigError, match=r"^workload\.path: /dev/zero is a character device, "
                                          r"not a regular file"):
        resolve_path("/dev/zero")


def test_a_fifo_is_refused_by_the_cli_without_reading_it(tmp_path, run_cli):
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    done = run_cli(tmp_path / "run", "workload=azure_conv", f"workload.path={fifo}",
                   "progress=false", "report=false")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (f"error: workload.path: {fifo} is a named pipe (FIFO), not a regular "
                           "file: a trace is read whole, from a file (copy it into one)\n")
