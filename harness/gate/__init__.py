"""Regression gate: compare result files with a committed baseline, metric by metric.

    python -m harness.gate RESULTS... --baseline baselines/smoke.json [--out DIR]
    python -m harness.gate RESULTS... --baseline baselines/smoke.json --update
    python -m harness.gate --show-rules            # the rules below, as JSON

RESULTS are ``results.json`` files (serving runs), ``kernel_results.json`` files
(``run=kernels``), run directories, or sweep directories (searched for both). Each
run is a *job*, identified by its workload, size, model, hardware, block size and
seed and executor (kernel runs: by device); the baseline holds one entry per job.

Every gated number is matched by the first rule in ``RULES`` whose pattern fits its
name: ``<system>.<path in results.json>``, ``ratio.<paged>/<contiguous>.<path>`` for
within-run ratios, ``kernel.<head>/<dtype>/b<batch>/ctx<context>/bs<block>.<ratio>``
for kernel sweep points. A rule says which direction is better and how much change
is tolerated:

- on the ``sim`` executor every figure is deterministic for a seed, so the tolerance
  is tight (``abs_tol``, or ``rel_tol`` times the baseline value, whichever is larger);
- on a measured executor (``torch``) only rules with a ``noise_band`` are gated, as a
  relative band; absolute timings have none (they depend on the machine) and are
  reported as ``info``, while ratios measured within one run (paged vs contiguous
  throughput, kernel time, kernel vs copy bandwidth) are gated;
- kernel results timed on a CPU (torch's reference paths, not the Triton kernels) are
  reported as ``info``: their ratios move by tens of percent between identical runs.

Verdicts: ``pass``, ``improved`` (better beyond tolerance: passes; refresh the
baseline with ``--update``), ``REGRESSION`` (worse beyond tolerance), ``CHANGED`` (a
figure with no better direction moved), ``MISSING`` (in the baseline, not in the
results), ``new`` (not in the baseline), ``info`` (reported, not gated). Any
REGRESSION / CHANGED / MISSING, an incomplete run, or a job with no baseline makes
the exit status 1; a bad input file exits with 2 and names the file, and so does a
gate that would check nothing (no rule matches a metric). ``--update`` refuses (2) to
overwrite a baseline it cannot read, since it keeps that baseline's other jobs.

Use your own rules with ``--rules FILE`` (a JSON list in the format ``--show-rules``
prints).

The package: ``rules`` (the rules), ``metrics`` (the gated numbers of a results file),
``compare`` (verdicts, baselines), ``files`` (reading and checking the inputs), ``output``
(tables, gate.json / gate.md) and ``cli`` (``python -m harness.gate``).
"""

from __future__ import annotations

from harness.gate.cli import main
from harness.gate.compare import (BASELINE_FORMAT, FAILING, Row, compare, compare_value,
                                  make_baseline)
from harness.gate.files import (find_results, load_baseline, load_current, load_rules,
                                read_any_results)
from harness.gate.metrics import (KERNEL_RATIOS, KERNEL_SCHEMA, RATIO_PATHS, SYSTEM_PATHS,
                                  extract_metrics, is_complete, job_key)
from harness.gate.rules import RULES, Rule, rule_for

__all__ = ["BASELINE_FORMAT", "FAILING", "KERNEL_RATIOS", "KERNEL_SCHEMA", "RATIO_PATHS", "RULES",
           "Row", "Rule", "SYSTEM_PATHS", "compare", "compare_value", "extract_metrics",
           "find_results", "is_complete", "job_key", "load_baseline", "load_current",
           "load_rules", "main", "make_baseline", "read_any_results", "rule_for"]
