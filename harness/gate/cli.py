"""``python -m harness.gate``: gate results against a baseline, or (``--update``) write it."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from harness.errors import InputError, PagebenchError
from harness.gate.compare import FAILING, Row, compare, make_baseline
from harness.gate.files import load_baseline, load_current, load_rules
from harness.gate.metrics import is_complete
from harness.gate.output import table_lines, write_report
from harness.gate.rules import RULES, Rule
from harness.fileio import write_json


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.gate",
        description="Gate pagebench results against a committed baseline (exit 0 pass, 1 a "
                    "regression, 2 a bad input file).")
    parser.add_argument("results", nargs="*", help="results.json files, run or sweep directories")
    parser.add_argument("--baseline", help="baseline JSON file (e.g. baselines/smoke.json)")
    parser.add_argument("--update", action="store_true",
                        help="write (or rewrite) the baseline from these results")
    parser.add_argument("--out", default="gate-report",
                        help="directory for gate.json and gate.md (default: gate-report)")
    parser.add_argument("--rules", help="JSON rules file replacing the defaults (see --show-rules)")
    parser.add_argument("--show-rules", action="store_true", help="print the rules as JSON")
    parser.add_argument("--failures-only", action="store_true",
                        help="print only failing and improved rows (the files keep all)")
    return parser


def update_baseline(current: dict[str, dict], path: Path, rules: tuple[Rule, ...],
                    failures_only: bool) -> None:
    """Write the baseline from ``current`` (complete results). Against an existing one:
    print what changes, say how many failing checks it accepts, and keep its jobs that
    ``current`` does not cover."""
    new = make_baseline(current, rules)
    try:
        old = load_baseline(path) if path.exists() else None
    except InputError as exc:  # replacing it would lose its other jobs
        raise InputError(f"{exc}; --update keeps a baseline's other jobs, so it does not "
                         "overwrite one it cannot read: fix it, or delete it to start afresh"
                         ) from None
    if old is not None:
        rows = [r for r in compare(current, old, rules) if r.metric != "(job)"]
        for line in table_lines(_shown(rows, failures_only)):
            print(line)
        accepted = sum(r.verdict in FAILING for r in rows)
        if accepted:
            print(f"gate: the new baseline accepts {accepted} failing checks (above)")
        kept = sorted(set(old.get("jobs", {})) - set(new["jobs"]))
        if kept:
            new["jobs"] = dict(sorted({**new["jobs"], **{k: old["jobs"][k] for k in kept}}.items()))
            print(f"gate: kept {len(kept)} baseline jobs these results do not cover: "
                  f"{', '.join(kept)} (delete the file to start afresh)")
    write_json(path, new)
    print(f"gate: wrote baseline {path} ({len(new['jobs'])} jobs, "
          f"{sum(len(j['metrics']) for j in new['jobs'].values())} metrics)")


def _shown(rows: list[Row], failures_only: bool) -> list[Row]:
    """The rows to print: all, or (``--failures-only``) those neither passing nor info."""
    return [r for r in rows if not failures_only or r.verdict not in ("pass", "info")]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rules = load_rules(Path(args.rules)) if args.rules else RULES
        if args.show_rules:
            print(json.dumps([asdict(r) for r in rules], indent=2))
            return 0
        if not args.results or not args.baseline:
            print("error: give RESULTS... and --baseline FILE (see --help)", file=sys.stderr)
            return 2
        current = load_current(args.results)
        baseline_path = Path(args.baseline)
        if args.update:
            incomplete = [k for k, r in current.items() if not is_complete(r)]
            if incomplete:
                print(f"error: refusing to write a baseline from incomplete results: "
                      f"{', '.join(incomplete)}", file=sys.stderr)
                return 2
            update_baseline(current, baseline_path, rules, args.failures_only)
            return 0
        base = load_baseline(baseline_path)
        if base["jobs"] and not set(current) & set(base["jobs"]):
            raise InputError(
                f"no job of these results is in the baseline ({', '.join(sorted(current))}; it "
                f"holds {', '.join(sorted(base['jobs']))}): run the baseline's config, or write "
                "a baseline for these results with --update", path=str(baseline_path))
        rows = compare(current, base, rules)
        if not rows:  # (a missing or incomplete job gives a row)
            raise InputError("0 checks made: no rule matches a metric of these results or of "
                             "the baseline, and a gate that checks nothing does not pass",
                             path=args.rules)
        passed = not any(r.verdict in FAILING for r in rows)
        for line in table_lines(_shown(rows, args.failures_only)) or [
                "(every check passed; see the report for the table)"]:
            print(line)
        write_report(rows, passed, Path(args.out))  # (a crash here would read as exit 1)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failing = sum(r.verdict in FAILING for r in rows)
    print(f"gate: {'PASS' if passed else 'FAIL'}: {len(rows)} checks over {len(current)} jobs, "
          f"{failing} failing, {sum(r.verdict == 'improved' for r in rows)} improved "
          f"(report: {Path(args.out) / 'gate.md'})")
    return 0 if passed else 1
