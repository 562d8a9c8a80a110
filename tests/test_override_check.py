"""Overrides of keys the config cannot have: refused before Hydra, naming the closest key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.override_check import CONF_DIR, option_keys, unknown_override

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
WORKLOADS = sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml"))


def _composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("choice", [f"experiment={e}" for e in EXPERIMENTS]
                         + [f"workload={w}" for w in WORKLOADS] + ["engine=torch"])
def test_every_key_a_composition_holds_passes(choice):
    """No false alarm: each key of the composed config, two levels deep, may be overridden."""
    paths = [choice]
    for key, value in _composed(choice).items():
        paths.append(f"{key}=1")
        if isinstance(value, dict):
            paths += [f"{key}.{sub}=1" for sub in value]
    assert unknown_override(paths) is None


@pytest.mark.parametrize("override, message", [
    ("blok_size=16", "blok_size: unknown top-level key. Did you mean 'block_size'?"),
    ("block_size=8,blok_size=16", None),  # one value list: a sweep of block_size
    ("engine.max_num_seq=3", "engine.max_num_seq: unknown key. Did you mean 'max_num_seqs'?"),
    ("workload.num_request=5", "workload.num_request: unknown key. Did you mean 'num_requests'?"),
    ("kernel_bnch.device=cpu", "Did you mean 'kernel_bench'?"),
    ("+blok_size=16", None),  # adding a key: the harness names it after composing
    ("~seed", None),
    ("hydra.run.dir=out", None),
    ("hydra/launcher=local_parallel", None),
    ("allocator.paged.block_size=8", None),  # deeper than two levels: Hydra checks
    ("workload=docqa,chat", None),
    ("engine.max_num_seqs=[", None),  # a syntax error: Hydra names it
])
def test_overrides(override, message):
    found = unknown_override([override])
    if message is None:
        assert found is None
    else:
        assert found is not None and message in found and repr(override) in found


def test_the_first_unknown_key_is_named():
    found = unknown_override(["block_size=8", "sede=1", "blok_size=16"])
    assert found.startswith("sede: unknown top-level key. Did you mean 'seed'?")


@pytest.mark.parametrize("group, option", [("workload", w) for w in WORKLOADS]
                         + [("engine", e.stem) for e in sorted((CONF_DIR / "engine").glob("*.yaml"))])
def test_the_keys_of_each_option_are_those_hydra_composes(group, option):
    assert option_keys()[group][option] == set(_composed(f"{group}={option}")[group])


@pytest.mark.parametrize("overrides, message", [
    (["workload.input_column=x"], "workload.input_column: workload=docqa has no such key (it is a "
                                  "key of workload=sharegpt_lengths, table). Keys of workload=docqa: "),
    (["workload=chat", "workload.num_documents=3"], "workload=chat has no such key (it is a key of "
                                                    "workload=docqa)"),
    (["workload=chat", "workload.turn=3"], "workload.turn: unknown key. Did you mean 'turns'? Keys "
                                           "of workload=chat: "),
    (["workload=docqa,table", "workload.input_column=x"], "workload=docqa has no such key"),
    (["engine.device=cpu"], "engine.device: engine=sim has no such key (it is a key of engine=torch)"),
    (["workload=table", "workload.input_column=x"], None),
    (["engine=torch", "engine.device=cpu"], None),
    (["experiment=rate_sweep", "workload.input_column=x"], None),  # an experiment may add keys
    (["workload=nosuch", "workload.input_column=x"], None),  # Hydra names the unknown option
])
def test_a_key_of_another_option_names_the_options_that_have_it(overrides, message):
    found = unknown_override(overrides)
    if message is None:
        assert found is None
    else:
        assert found is not None and message in found, found
