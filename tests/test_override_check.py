"""Overrides of keys the config cannot have: refused before Hydra, naming the closest key."""

from __future__ import annotations

import copy
import functools

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config.conf_tree import CONF_DIR, option_keys
from harness.config.override_check import check_overrides, refused_deletion, unknown_override
from harness.config.specs import REQUIRED_KEYS

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
WORKLOADS = sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml"))


def _composed(*overrides: str) -> dict:
    """The composed config as a plain dict (a fresh copy: callers may change it)."""
    return copy.deepcopy(_compose_once(overrides))


@functools.lru_cache(maxsize=None)
def _compose_once(overrides: tuple[str, ...]) -> dict:
    """Hydra composes each choice once per session: several tests check the same ones."""
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
    ("allocator.paged.block_size=8", "allocator.paged.block_size: allocator.paged does not set "
                                     "it (every paged system takes the top-level block_size: "
                                     "block_size=8); to set it for paged alone, add it: "
                                     "+allocator.paged.block_size=8."),
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
                                                    "workload=docqa, longdoc)"),
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


def _leaf_paths(node: dict, prefix: str = "") -> list[str]:
    """Every key path of ``node``, at every depth (mappings and their keys alike)."""
    paths = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        paths.append(path)
        if isinstance(value, dict):
            paths += _leaf_paths(value, path + ".")
    return paths


@pytest.mark.parametrize("choice", [f"experiment={e}" for e in EXPERIMENTS]
                         + [f"workload={w}" for w in WORKLOADS] + ["engine=torch"])
def test_every_key_a_composition_holds_at_any_depth_passes(choice):
    """No false alarm at any depth: each key path of the composed config may be set (to a
    scalar where Hydra holds a scalar, so the shape check has nothing to say)."""
    composed = _composed(choice)
    composed.pop("hydra", None)
    paths = [path for path in _leaf_paths(composed) if "." in path]
    assert paths
    found = unknown_override([choice, *(f"{path}=null" for path in paths)])
    assert found is None, found


@pytest.mark.parametrize("overrides, message", [
    (["engine.cost.step_overhead=0.1"],
     "engine.cost.step_overhead: unknown key. Did you mean 'step_overhead_s'? Keys of "
     "engine.cost (engine=sim): bandwidth_efficiency, compute_efficiency, host_profile, kernel_profile, kernel_results, model, step_overhead_s"),
    (["workload.arrival.rat=2"],
     "workload.arrival.rat: unknown key. Did you mean 'rate'? Keys of workload.arrival "
     "(workload=docqa): "),
    (["allocator.paged.prefix_cachin=false"],
     "allocator.paged.prefix_cachin: unknown key. Did you mean 'prefix_caching'?"),
    (["allocator.max.arean=best_fit"], "allocator.max.arean: unknown key. Did you mean 'arena'?"),
    (["workload=sharegpt_like", "workload.input.meen=5"],
     "workload.input.meen: unknown key. Did you mean 'mean'? Keys of workload.input "
     "(workload=sharegpt_like): max, mean, min, sigma"),
    (["workload=docqa,sharegpt_like", "workload.input.mean=5"],
     "workload.input: workload=docqa has no such key (it is a key of workload="),
    (["experiment=vllm_fig2", "study.workloads.sharegpt.input.meen=5"],
     "study.workloads.sharegpt.input.meen: unknown key. Did you mean 'mean'?"),
    (["allocator.paged.blok_size=8"], "allocator.paged.blok_size: unknown key. Did you mean "
                                      "'block_size'?"),
    (["model.num_layers_override=2"], "model.num_layers_override: model=llama-2-13b does not set "
                                      "it: add it with +model.num_layers_override=2."),
    # what the + form of a deeper key lists is what the spec takes: keys set, and the rest
    (["allocator.paged.prefix_cachin=false"], "Keys of allocator.paged (allocator=standard): "
                                              "kind, prefix_caching; it also takes, added with +: "
                                              "arena, block_size, policy"),
    (["systems={a:paged}"], "systems: must be a list, e.g. systems=[paged,max,pow2,oracle]; got "
                            "a mapping"),
    (["engine.cost=[1]"], "engine.cost: must be a mapping of its keys"),
    # not ours to refuse
    (["experiment=vllm_fig2", "study.workloads.sharegpt.input.mean=5"], None),
    (["workload=mooncake", "engine.chunked_prefill=false"], None),  # its engine=sim_long_context
    (["+allocator.mine={kind:paged}", "allocator.mine.kind=contiguous"], None),  # added first
    (["workload=mixture", "workload.components.0.weight=1"], None),  # into a list: Hydra's
    (["hydra.job.chdir=false"], None),
    (["systems=[paged]", "engine.cost={step_overhead_s:0.1}"], None),
])
def test_deeper_keys(overrides, message):
    found = unknown_override(overrides)
    if message is None:
        assert found is None, found
    else:
        assert found is not None and message in found, found


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_deleting_a_key_every_run_reads_is_refused(key):
    found = check_overrides([f"~{key}"])
    assert found is not None and found.startswith(f"{key}: required (every run reads it), so it "
                                                  "cannot be deleted;"), found
    assert refused_deletion([f"~{key}=x"]) is not None


@pytest.mark.parametrize("override", ["~engine.cost", "~report", "~progress", "~jobs",
                                      "~workload.num_requests"])
def test_deleting_an_optional_key_is_left_to_hydra(override):
    assert check_overrides([override]) is None


def _shape(node):
    """The key structure of a nested mapping (values aside)."""
    return {key: _shape(value) for key, value in node.items()} if isinstance(node, dict) else None


@pytest.mark.parametrize("group, option", [("workload", w) for w in WORKLOADS]
                         + [(g, p.stem) for g in ("engine", "model", "hardware", "allocator")
                            for p in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_the_tree_of_each_option_is_what_hydra_composes_at_every_depth(group, option):
    from harness.config.conf_tree import option_trees

    assert _shape(option_trees()[group][option]) == _shape(_composed(f"{group}={option}")[group])


def test_a_sweep_experiment_without_multirun_gets_a_note():
    from harness.config.override_check import sweep_without_multirun

    note = sweep_without_multirun(["experiment=block_size_sweep", "workload.num_requests=5"])
    assert note.startswith("experiment=block_size_sweep is a sweep (block_size=1,2,4,8,16,32,64,"
                           "128,256")
    assert "without -m this runs one job" in note and "add -m" in note
    assert sweep_without_multirun(["experiment=vllm_fig2"]) is None  # not a sweep
    assert sweep_without_multirun(["block_size=16"]) is None
