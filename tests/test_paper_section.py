"""The paper comparison: published values file, differences, causes, and the configs."""

from __future__ import annotations

import json

import pytest

from harness.studies.paper import STUDIES, check_study_keys
from paper_helpers import compose_experiment
from pagebench.reports.paper_section import (FIGURES, cause_for, compare, comparison_rows,
                                   load_paper_values, render_study_report)

EXPERIMENTS = ("vllm_fig2", "vllm_fig13", "vllm_fig12", "vllm_fig15", "vllm_fig18b", "shared_prefix")


def test_every_experiment_has_a_study_a_figure_and_published_values():
    values = load_paper_values()["experiments"]
    for name in EXPERIMENTS:
        assert name in STUDIES and name in FIGURES and name in values, name
        spec = values[name]
        assert spec["figure"].startswith("Fig.") and spec["values"], name
        ids = [v["id"] for v in spec["values"]]
        assert len(ids) == len(set(ids)), name
        for v in spec["values"]:
            assert v["how"] in ("label", "text", "range", "set"), v
            if v["how"] in ("text", "range"):
                assert v.get("quote"), v  # prose values carry their quotation


def test_published_fig2_bars_sum_to_100():
    values = {v["id"]: v["published"] for v in load_paper_values()["experiments"]["vllm_fig2"]["values"]}
    for system in ("orca_max", "orca_pow2", "orca_oracle"):
        total = sum(values[f"{system}.{c}"] for c in ("token_states", "reservation",
                                                       "internal_fragmentation", "external_and_others"))
        assert total == pytest.approx(100.0, abs=0.15), system
    assert values["vllm.token_states"] + values["vllm.waste"] == pytest.approx(100.0)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_configs_use_the_papers_setup(name):
    cfg = compose_experiment(name)
    assert cfg.run == "study" and cfg.study.name == name
    assert cfg.engine.kv_capacity_slots == 15728  # 12 GiB / 800 KiB (Table 1: "15.7K")
    assert cfg.engine.max_model_len == 2048
    assert cfg.hardware.name == "a100-40gb"
    assert cfg.model.name == ("llama-2-13b" if name == "shared_prefix" else "opt-13b")
    assert cfg.block_size == 16
    for system in cfg.study.systems.values():
        spec = cfg.allocator[system]
        assert spec.kind == "paged" or spec.arena == "buddy"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_study_values_pass_the_checks(name):
    from omegaconf import OmegaConf

    check_study_keys(OmegaConf.to_container(compose_experiment(name).study, resolve=True))


@pytest.mark.parametrize("key, value, message", [
    ("scale", "abc", "study.scale: must be a positive number, got 'abc'"),
    ("scale", -1, "study.scale: must be a positive number"),
    ("min_requests", 2.5, "study.min_requests: must be a positive integer"),
    ("saturated", 3, "study.saturated: must be true or false"),
    ("rates", {"sharegpt": "x"}, "study.rates.sharegpt: must be a positive number"),
    ("widths", {"beam": [2, 0]}, "study.widths.beam[1]: must be a positive integer"),
    ("rat", 4, "study.rat: unknown key for study"),
])
def test_bad_study_values_are_named_before_any_job_runs(key, value, message):
    from harness.errors import ConfigError

    name = "vllm_fig15" if key == "widths" else "vllm_fig13"
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_study_keys({"name": name, key: value})


def test_an_unknown_system_in_a_study_fails_before_any_job_runs(tmp_path, capsys):
    from harness.errors import ConfigError
    from harness.studies import run_study

    cfg = compose_experiment("vllm_fig2", ["study.systems.vllm=foo"])
    with pytest.raises(ConfigError, match="systems: unknown system 'foo'"):
        run_study(cfg, tmp_path)
    assert "[1/" not in capsys.readouterr().err  # no job started
    assert not list(tmp_path.iterdir())


def test_a_count_raised_to_min_requests_is_said(capsys):
    from harness.studies.paper import _count

    assert _count({"min_requests": 23, "scale": 0.5}, 14) == 23
    assert "note: study: 7 requests raised to study.min_requests=23" in capsys.readouterr().err
    assert _count({"min_requests": 23}, 40) == 40


def test_compare_label_range_and_set_values():
    material = {"abs": 2.0, "rel": 0.1}
    row = compare({"published": 10.0, "how": "label"}, 13.0, material)
    assert row["diff"] == pytest.approx(3.0) and row["material"]
    assert not compare({"published": 10.0, "how": "label"}, 11.5, material)["material"]
    inside = compare({"published": [1.7, 2.7], "how": "range"}, 2.0, {"rel": 0.2})
    assert inside["diff"] == 0.0 and not inside["material"]
    above = compare({"published": [1.7, 2.7], "how": "range"}, 4.0, {"rel": 0.2})
    assert above["diff"] == pytest.approx(1.3) and above["material"]
    assert not compare({"published": [16, 32], "how": "set"}, [32, 16], {})["material"]
    assert compare({"published": [16, 32], "how": "set"}, [16], {})["material"]
    assert compare({"published": 1.0, "how": "label"}, None, material)["material"] is None


def test_cause_lookup_prefers_the_most_specific_id():
    causes = {"alpaca": "general", "alpaca.vllm": "specific"}
    assert cause_for("alpaca.vllm", causes) == "specific"
    assert cause_for("alpaca.orca_max", causes) == "general"
    assert cause_for("sharegpt.vllm", causes) is None


def test_report_renders_a_table_and_flags_material_differences(tmp_path):
    study = {"study": "vllm_fig15", "kind": "study", "params": {"systems": {"vllm": "paged_noprefix"},
                                                                "widths": {"parallel": [2], "beam": [2]}},
             "measured": {"parallel.2": 6.0, "beam.2": 80.0}, "jobs": [], "complete": True,
             "setup": {}, "timing": {}}
    (tmp_path / "study.json").write_text(json.dumps(study))
    html = render_study_report(tmp_path).read_text()
    spec = load_paper_values()["experiments"]["vllm_fig15"]
    rows = {r["id"]: r for r in comparison_rows(study, spec)}
    assert rows["beam.2"]["material"] and not rows["parallel.2"]["material"]
    assert rows["beam.4"]["material"] is None  # not measured
    assert "Published vs measured" in html and "37.56" in html and "data:image/png" in html
    assert "This run is scaled" not in html
    study["params"]["scale"] = 0.2  # the causes quote the full-size study's figures: say so
    (tmp_path / "study.json").write_text(json.dumps(study))
    assert "This run is scaled (study.scale=0.2)" in render_study_report(tmp_path).read_text()
