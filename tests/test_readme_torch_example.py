"""The README's torch example sizes its pool so that paging matters (issue 26, item 4)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_command(prefix: str) -> list[str]:
    """The overrides of the README's (one-line) command that starts with ``prefix``."""
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith(prefix):
            return shlex.split(re.sub(r"\s+#.*", "", line))[3:]
    raise AssertionError(f"the README has no command starting {prefix!r}")


def test_the_torch_example_pool_holds_a_few_max_length_requests_not_all():
    from hydra import compose, initialize_config_dir

    from harness.run.run_setup import run_setup
    from harness.config.specs import kv_capacity_slots

    overrides = readme_command("python -m harness engine=torch")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    setup = run_setup(cfg)
    capacity = kv_capacity_slots(setup.model, setup.hardware, setup.engine)
    num_requests = cfg.workload.num_requests
    # contiguous max reserves max_model_len per request: the pool must hold at least one such
    # reservation, and far fewer than the run's requests, or every system runs them all at once
    assert setup.max_model_len <= capacity <= num_requests * setup.max_model_len / 4
    # paged needs only each request's tokens (docqa: ~1,570-token prompts): several times more fit
    assert capacity // 1600 >= 2 * (capacity // setup.max_model_len)
