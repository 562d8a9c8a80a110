"""pagebench: measure what paged KV-cache management buys and what it costs."""

from pathlib import Path

__version__ = "0.1.0"

# The Hydra config tree: conf/ beside harness/ in a checkout (and an editable install); in
# a wheel, pyproject.toml ships conf/ as harness/conf/ (package ``harness.conf``).
_PACKAGED_CONF = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED_CONF if _PACKAGED_CONF.is_dir() else Path(__file__).resolve().parents[1] / "conf"
