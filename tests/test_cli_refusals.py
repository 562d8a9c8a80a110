"""The CLI refuses bad config before anything runs: misspelt keys at any depth, deleted
required keys, ill-shaped values and bad seeds exit 2 with one line naming the key, never a
traceback; and a refused run leaves an earlier run's outputs where they were."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.config.cli_args import check_seed
from harness.errors import ConfigError
from conftest import ROOT
from harness.config.conf_tree import CONF_DIR

SMALL = ["workload=docqa", "workload.num_requests=20", "report=false", "progress=false"]
STUDY = ["experiment=vllm_fig2", "study.scale=0.05", "study.workers=1"]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: ")]


# ------------------------------------------------------------------ refused before anything runs
DATA = ROOT / "tests" / "data"
REFUSED = {
    # cost profiles: read and checked before the run directory is touched
    "kernel_profile_missing": (["engine.cost.kernel_profile=nope"],
                               "engine.cost.kernel_profile: no profile"),
    "kernel_results_nan": (["engine.cost.kernel_profile=measured",
                            f"engine.cost.kernel_results={DATA / 'kernel_results_nan.json'}"],
                           "kernel_results_nan.json: rows[0].paged_frac_copy_bw: must be a finite"),
    "kernel_results_heads": (["engine.cost.kernel_profile=measured",
                              f"engine.cost.kernel_results={DATA / 'kernel_results_small.json'}"],
                             "nearest measured: group 1 head_dim 16 float16"),
    # misspelt keys three or more levels deep: named with the closest valid key
    "cost_key": (["engine.cost.step_overhead=0.1"],
                 "engine.cost.step_overhead: unknown key. Did you mean 'step_overhead_s'?"),
    "arrival_key": (["workload.arrival.rat=2"],
                    "workload.arrival.rat: unknown key. Did you mean 'rate'?"),
    "catalog_key": (["allocator.paged.prefix_cachin=false"],
                    "allocator.paged.prefix_cachin: unknown key. Did you mean 'prefix_caching'?"),
    "arena_key": (["allocator.max.arean=best_fit"],
                  "allocator.max.arean: unknown key. Did you mean 'arena'?"),
    "length_key": (["workload=sharegpt_like", "workload.input.meen=5"],
                   "workload.input.meen: unknown key. Did you mean 'mean'?"),
    "paged_block_size": (["allocator.paged.block_size=8"],
                         "every paged system takes the top-level block_size: block_size=8"),
    # deleting a key every run reads
    "delete_block_size": (["~block_size"], "block_size: required (every run reads it)"),
    "delete_seed": (["~seed"], "seed: required (every run reads it)"),
    "delete_systems": (["~systems"], "systems: required (every run reads it)"),
    "delete_model": (["~model"], "model: required (every run reads it)"),
    # values of the wrong shape
    "nested_systems": (["systems=[[paged]]"], "systems: must be a list of system names"),
    "mapping_systems": (["systems={a:paged}"], "systems: must be a list"),
    "catalog_entry": (["allocator.paged=3"], "allocator.paged: must be a mapping"),
    # more than the machine holds: refused before a request is generated, not OOM-killed
    "too_many_requests": (["workload=fixed", "workload.num_requests=1000000000000"],
                          "workload.num_requests: 1,000,000,000,000 requests need at least "
                          "931,322.6 GiB (1000 bytes each), more than the"),
    "swap_overflow": (["engine.swap_space_gib=1e30"],
                      "engine.swap_space_gib: at most 1,638,400 GiB for llama-2-13b"),
    # a system's name names its tables (steps_<name>.csv): never a path out of the run directory
    "system_name_path": (["systems=[x/../../../escaped]",
                          "+allocator={x/../../../escaped:{kind:contiguous,policy:max}}"],
                         "allocator.x/../../../escaped: system name 'x/../../../escaped' must "
                         "be a plain name (letters, digits, '_', '-', '.')"),
    # engine=torch lays KV out as each manager declares: vattention has no tensor layout
    "torch_vattention": (["engine=torch", "model=tiny", "systems=[paged,vattention]"],
                         "systems: vattention (vattention) has no KV tensor layout for engine=torch"),
    # seeds: the serving run's check, also in studies
    "seed_float": (["seed=1.5"], "seed: must be a non-negative integer, got 1.5"),
    "study_seed_negative": ([*STUDY, "seed=-3"], "seed: must be a non-negative integer, got -3"),
    "study_seed_text": ([*STUDY, "seed=abc"], "seed: must be a non-negative integer, got 'abc'"),
    "study_seed_float": ([*STUDY, "seed=1.5"], "seed: must be a non-negative integer, got 1.5"),
    "study_workers_zero": ([*STUDY[:2], "study.workers=0"],
                           "study.workers: must be a positive integer or null"),
}


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory, run_cli):
    """Every refused command as a subprocess, all started at once (each is mostly imports)."""
    base = tmp_path_factory.mktemp("refused")
    procs = {name: run_cli.start(base / name, *SMALL[2:], *args)
             for name, (args, _) in REFUSED.items()}
    out = {}
    for name, proc in procs.items():
        result = run_cli.wait(proc)
        out[name] = (result.returncode, result.output, base / name)
    return out


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_exit_2_and_one_line_naming_the_key(refused_runs, case):
    code, output, run_dir = refused_runs[case]
    assert code == 2, output
    assert "Traceback" not in output and "To append to your config" not in output, output
    errors = _error_lines(output)
    assert len(errors) == 1 and REFUSED[case][1] in errors[0], output
    # nothing ran: no results, no study, not even the resolved config
    written = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    assert not written & {"results.json", "study.json", "config_resolved.yaml"}, written


# ------------------------------------------------------------- earlier outputs stay where they are
@pytest.fixture(scope="module")
def good_run(tmp_path_factory, run_cli):
    """A complete run, copied afresh by each test that tries to displace it."""
    run_dir = tmp_path_factory.mktemp("good") / "run"
    result = run_cli(run_dir, *SMALL)
    assert result.returncode == 0, result.output
    return run_dir


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"
            and p.name != ".pagebench.lock"}  # (the directory's lock stays where it is)


@pytest.mark.parametrize("bad", [["engine.gpu_memory_utilization=0"], ['block_size="16"'],
                                 ["workload.arrival.rate=-1"], ["seed=1.5"],
                                 ["workload=azure_conv", "workload.path=BAD_TRACE"]])
def test_a_config_error_leaves_the_earlier_outputs_in_place(good_run, tmp_path, bad, run_cli):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    before = _snapshot(run_dir)
    trace = tmp_path / "bad.csv"  # found only when the workload is built
    trace.write_text("a,b\n1,2\n")
    args = [arg.replace("BAD_TRACE", str(trace)) for arg in bad]
    args = [*args, *SMALL[2:]] if args[0].startswith("workload=") else [*SMALL, *args]
    refused = run_cli(run_dir, *args)
    assert refused.returncode == 2, refused.output
    assert "Traceback" not in refused.output, refused.output
    assert _snapshot(run_dir) == before, refused.output
    assert not (run_dir / "previous").exists(), refused.output
    again = run_cli(run_dir, *SMALL)  # the earlier run is still complete: skipped
    assert again.returncode == 0 and "skipped:" in again.output, again.output


# --------------------------------------------------------------------------------- in process
@pytest.mark.parametrize("value", [-3, "abc", 1.5, True, None, "1"])
def test_check_seed_refuses_what_is_not_a_non_negative_integer(value):
    with pytest.raises(ConfigError, match=r"^seed: must be a non-negative integer"):
        check_seed(value)


@pytest.mark.parametrize("value", [0, 7, 2**40])
def test_check_seed_takes_non_negative_integers(value):
    assert check_seed(value) == value


def _study_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["experiment=vllm_fig2", *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["seed=-3"], "seed: must be a non-negative integer, got -3"),
    (["seed=1.5"], "seed: must be a non-negative integer, got 1.5"),
    (["study.workers=0"], "study.workers: must be a positive integer or null"),
    (["study.workers=true"], "study.workers: must be a positive integer or null"),
    (["engine.gpu_memory_utilization=0"], "engine.gpu_memory_utilization"),
])
def test_prepare_study_refuses_before_any_job_runs(overrides, message):
    from harness.studies import prepare_study

    with pytest.raises(ConfigError) as err:
        prepare_study(_study_cfg("study.scale=0.05", *overrides))
    assert message in str(err.value)


def test_prepare_study_plans_a_valid_study():
    from harness.studies import prepare_study

    prepared = prepare_study(_study_cfg("study.scale=0.05", "study.workers=3"))
    assert prepared.name == "vllm_fig2" and prepared.workers == 3
    assert sum(len(chain.jobs) for chain in prepared.plan.chains) == 4


def test_a_valid_run_still_moves_the_earlier_outputs_aside_never_over_them(good_run, tmp_path,
                                                                            run_cli):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    before = _snapshot(run_dir)
    refused = run_cli(run_dir, *SMALL, "block_size=0")  # refused: nothing moves
    assert refused.returncode == 2 and _snapshot(run_dir) == before, refused.output
    valid = run_cli(run_dir, *SMALL, "systems=[paged]")
    assert valid.returncode == 0, valid.output
    assert f"moved them to {run_dir / 'previous' / '1'}" in valid.output
    moved = {name.removeprefix("previous/1/"): data for name, data in _snapshot(run_dir).items()
             if name.startswith("previous/1/")}
    assert moved == before  # byte for byte
    assert not (run_dir / "steps_max.csv").exists()  # no table of a system it did not run


@pytest.mark.parametrize("overrides, message", [
    (["~seed"], "seed: missing from the config, and every run reads it"),
    (["~model"], "model: missing from the config, and every run reads it"),
    (["systems=[[paged]]"], "systems: must be a list of system names"),
    (["seed=1.5"], "seed: must be a non-negative integer, got 1.5"),
    (["workload.arrival.rate=-1"], "workload.arrival.rate"),
    (["experiment=vllm_fig2", "seed=abc"], "seed: must be a non-negative integer, got 'abc'"),
])
def test_check_config_refuses_what_reaches_it_past_the_command_line_check(overrides, message):
    """check_config (called before the run directory changes) also catches what Hydra's
    compose API or another config directory lets through."""
    from harness.__main__ import check_config
    from harness.errors import PagebenchError

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with pytest.raises(PagebenchError, match="^" + re.escape(message)):
        check_config(cfg)


def test_check_config_passes_the_default_config_and_prepares_a_study():
    from harness.__main__ import check_config

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        setup, jobs = check_config(compose(config_name="config"))  # the serving run's specs
        assert [s.name for s in setup.systems] == ["paged", "max", "pow2", "oracle"] and jobs >= 1
        prepared = check_config(compose(config_name="config",
                                        overrides=["experiment=vllm_fig2", "study.scale=0.05"]))
    assert prepared.name == "vllm_fig2"


@pytest.mark.parametrize("name", ["..", ".", "a/b", "a\\b", "", "a b", "x\n"])
def test_system_names_are_plain_names(name):
    from harness.config.specs import select_systems

    catalog = {"paged": {"kind": "paged"}, name: {"kind": "contiguous", "policy": "max"}}
    with pytest.raises(ConfigError, match=rf"^allocator\.{re.escape(name)}: system name "):
        select_systems(["paged"], catalog, 16)  # every catalog entry, selected or not
    with pytest.raises(ConfigError, match=r"^systems: system name "):
        select_systems([name], {"paged": {"kind": "paged"}}, 16)
    assert [s.name for s in select_systems(["v1.2_x-y"], {"v1.2_x-y": {"kind": "paged"}}, 16)] \
        == ["v1.2_x-y"]
