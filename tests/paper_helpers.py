"""Run shortened PagedAttention-paper studies in-process for the test_paper_* tests."""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT


def compose_experiment(name: str, overrides: list[str] | None = None):
    """The composed config of ``experiment=<name>`` plus ``overrides`` (as the CLI would)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"experiment={name}", *(overrides or [])])


def run_short_study(name: str, out_dir: Path, overrides: list[str]) -> dict:
    """Run the study of ``experiment=<name>`` shortened by ``overrides``; return study.json's data."""
    from harness.studies import run_study

    cfg = compose_experiment(name, overrides)
    return run_study(cfg, out_dir)
