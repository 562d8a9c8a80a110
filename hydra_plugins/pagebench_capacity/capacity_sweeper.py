"""A Hydra sweeper that runs pagebench's capacity search (``harness.studies.capacity``).

``python -m harness -m experiment=capacity`` selects it (``hydra/sweeper: capacity``,
conf/hydra/sweeper/capacity.yaml). It opens one rate search per system and per point of
the swept parameters (command-line sweeps such as ``block_size=8,16,32`` or
``engine.kv_capacity_slots=20000,40000``, and ``hydra.sweeper.params``), then runs
rounds: each round launches the next probe of every open search at once through the
configured launcher (basic: one after the other; ``hydra/launcher=local_parallel``:
joblib processes; Ray, SLURM), reads each probe's SLO attainment and feeds it back.
Every probe is an ordinary run in its own numbered directory under the sweep dir
(kept); a probe whose inputs equal an earlier one's is skipped or reuses its tables
(``harness.run.reuse``). At the end: ``capacity.json`` and ``capacity_report.html`` at the
top of the sweep dir, and the headline on the console.

(Hydra instantiates sweepers only from the ``hydra_plugins`` package: hence this home.)
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.errors import CompactHydraException
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf


class CapacitySearchError(CompactHydraException):
    """A capacity search that cannot run (no SLO, a bad setting, a failed probe): Hydra
    prints the message without a traceback (exit status 1)."""


class CapacitySweeper(Sweeper):
    """Bracketing then bisection on ``rate_key``, per system and swept point, in rounds."""

    def __init__(self, systems: list[str] | None = None, params: dict[str, str] | None = None,
                 rate_key: str = "workload.arrival.rate", start_rate: float = 1.0,
                 target_attainment: float = 0.9, rel_tol: float = 0.05, min_rate: float = 0.01,
                 max_rate: float = 1000.0, max_probes: int = 20) -> None:
        self.settings = {"systems": list(systems) if systems else None,
                         "params": dict(params or {}), "rate_key": rate_key,
                         "start_rate": start_rate, "target_attainment": target_attainment,
                         "rel_tol": rel_tol, "min_rate": min_rate, "max_rate": max_rate,
                         "max_probes": max_probes}
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def _check(self) -> tuple[list[str], dict]:
        """The systems searched and the SLO; raises ``CapacitySearchError``."""
        s = self.settings
        for key in ("start_rate", "rel_tol", "min_rate", "max_rate"):
            value = s[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise CapacitySearchError(f"hydra.sweeper.{key}: must be a positive number, "
                                          f"got {value!r}")
        if not 0 < s["target_attainment"] <= 1:
            raise CapacitySearchError("hydra.sweeper.target_attainment: must be in (0, 1], got "
                                      f"{s['target_attainment']!r}")
        if not s["min_rate"] <= s["start_rate"] <= s["max_rate"]:
            raise CapacitySearchError("hydra.sweeper: need min_rate <= start_rate <= max_rate")
        if isinstance(s["max_probes"], bool) or not isinstance(s["max_probes"], int) \
                or s["max_probes"] < 2:
            raise CapacitySearchError(f"hydra.sweeper.max_probes: must be an integer >= 2, got "
                                      f"{s['max_probes']!r}")
        slo = OmegaConf.to_container(self.config.get("slo") or {}, resolve=True)
        targets = {k: v for k, v in slo.items() if k.endswith("_ms") and v is not None}
        if not targets:
            raise CapacitySearchError("slo: a capacity search needs an SLO: set slo.ttft_ms, "
                                      "slo.tpot_ms and/or slo.e2el_ms (milliseconds)")
        systems = s["systems"] or list(self.config.get("systems") or [])
        if not systems:
            raise CapacitySearchError("systems: name at least one system to search")
        return systems, targets

    def _split(self, arguments: list[str], systems_key: str = "systems") -> tuple[list[str], dict]:
        """The fixed overrides every probe gets, and the swept ones (key -> values)."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        extra = [f"{k}={v}" for k, v in self.settings["params"].items()]
        fixed, swept = [], {}
        for override in parser.parse_overrides(list(arguments) + extra):
            key = override.get_key_element()
            if key.lstrip("+~") in (systems_key, self.settings["rate_key"]):
                if override.is_sweep_override() or key.lstrip("+~") == self.settings["rate_key"]:
                    raise CapacitySearchError(
                        f"{key.lstrip('+~')}: the capacity search sets it per probe; list the "
                        "systems as systems=[a,b] (or hydra.sweeper.systems) and leave the rate")
                continue  # systems=[...]: read from the composed config
            if override.is_sweep_override():
                swept[key] = list(override.sweep_string_iterator())
            else:
                fixed.append(f"{key}={override.get_value_element_as_str()}")
        return fixed, swept

    def sweep(self, arguments: list[str]) -> Any:
        from harness.studies.capacity import Probe, RateSearch, capacity_result
        from pagebench.reports.capacity_section import render_capacity_report

        systems, slo = self._check()
        fixed, swept = self._split(arguments)
        s = self.settings
        points = [dict(zip(swept, values)) for values in itertools.product(*swept.values())] or [{}]
        searches = [RateSearch(system, point, s["start_rate"], s["target_attainment"],
                               s["rel_tol"], s["min_rate"], s["max_rate"], s["max_probes"])
                    for point in points for system in systems]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        print(f"capacity search: {len(searches)} searches ({len(systems)} systems x "
              f"{len(points)} points), SLO {slo}, target attainment {s['target_attainment']:g}, "
              f"rel_tol {s['rel_tol']:g}; probes in {sweep_dir}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        kinds: dict[str, str] = {}
        job_idx = rounds = 0
        while True:
            batch = []
            for search in searches:
                rate = search.next_rate()
                if rate is not None:
                    batch.append((search, rate))
            if not batch:
                break
            rounds += 1
            overrides = [fixed + [f"systems=[{search.system}]"]
                         + [f"{k}={v}" for k, v in search.point.items()]
                         + [f"{s['rate_key']}={rate!r}"] for search, rate in batch]
            returns = self.launcher.launch(overrides, initial_job_idx=job_idx)
            job_idx += len(batch)
            for (search, rate), ret in zip(batch, returns):
                results, run_dir = _probe_results(ret)
                summary = (results.get("systems") or {}).get(search.system) or {}
                kinds[search.system] = (summary.get("allocator") or {}).get("kind", "")
                serving = summary.get("serving") or {}
                search.record(Probe(rate, serving.get("slo_attainment"),
                                    serving.get("request_goodput"),
                                    serving.get("request_throughput"), run_dir))
                requests = summary.get("requests") or {}
                if requests.get("rejected") and not requests.get("finished") \
                        and not requests.get("unfinished"):  # at any rate: nothing to search
                    reasons = ", ".join(summary.get("rejected_reasons") or {}) or "see results.json"
                    search.stop_reason = f"it rejects every request ({reasons})"
            print(f"capacity search: round {rounds}: {len(batch)} probes "
                  f"({time.perf_counter() - started:.0f} s elapsed)", file=sys.stderr, flush=True)
            _write(sweep_dir, capacity_result(searches, s, kinds, slo,
                                              time.perf_counter() - started, rounds))
        result = capacity_result(searches, s, kinds, slo, time.perf_counter() - started, rounds)
        _write(sweep_dir, result)
        report = render_capacity_report(sweep_dir, result)
        for line in result["headline"]:
            print(line, file=sys.stderr)
        print(f"capacity search: {result['probes']} probes in {rounds} rounds, "
              f"{result['wall_time_s']:.1f} s; {sweep_dir / 'capacity.json'}, {report}",
              file=sys.stderr, flush=True)
        return result


def _write(sweep_dir: Path, result: dict) -> None:
    from harness.fileio import write_json

    write_json(sweep_dir / "capacity.json", result)


def _probe_results(ret) -> tuple[dict, str]:
    """A probe's results.json content and its run directory. A probe that returned no
    results (skipped: the directory held them already; or it served nothing, which the
    run reports as an error after writing them) is read from its directory."""
    run_dir = str(ret.hydra_cfg.hydra.runtime.output_dir)  # (the job's hydra node, under "hydra")
    if ret.status == JobStatus.COMPLETED and isinstance(ret.return_value, dict) \
            and "systems" in ret.return_value:
        return ret.return_value, run_dir
    path = Path(run_dir) / "results.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8")), run_dir
    error = ret._return_value if ret.status == JobStatus.FAILED else "no results.json"
    raise CapacitySearchError(f"capacity search: the probe in {run_dir} failed: {error}")
