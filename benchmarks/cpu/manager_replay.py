"""How much of a simulated run is the paged KV manager: record its calls, replay them alone.

    python benchmarks/cpu/manager_replay.py record calls.pkl workload=azure_conv \\
        workload.path=../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
    python benchmarks/cpu/manager_replay.py replay calls.pkl --rounds 3 [--out figures.json]
    python benchmarks/cpu/manager_replay.py shares workload=azure_conv workload.path=...

``record`` runs the ``paged`` system (or ``--system``) through the real engine on the sim
executor, in this process, twice: once as it is, timed (CPU seconds), and once with every
call the engine makes to its ``PagedKVCacheManager``'s methods recorded (admissions,
appends, frees, forks, swaps, prefix queries, breakdowns, token sources with the ids
each gave, replayed in order; not attribute reads such as ``num_free_blocks``), each with
its arguments and its result. ``replay`` makes a fresh manager, makes the same calls in the same order,
checks every result against the recorded one and reports the CPU seconds per method
(medians over ``--rounds``) beside the whole run's: the manager's share of the run.

``shares`` runs the system once with the manager's and its block pool's methods timed (the
outermost calls): how much of the run a faster pool, or a faster manager, could save at
most. These are wall seconds (``perf_counter``, ~0.1 us a reading, where this machine's
CPU clock takes ~1 us a reading): run it on a quiet machine.

A faster manager (a compiled block pool, say) must give the same results on the same
calls: ``--manager module:Class`` replays against it. NOTE: prefix-cache key values use
Python's per-process ``hash()``, so calls that return keys are compared by what does not
depend on them (how many, or whether there is one).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pickle
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "bench")]

# method -> which positional arguments are token ids (recorded once per distinct array)
TOKEN_ARGS = {"admit": (1,), "append": (1,), "cached_prefix_tokens": (0,),
              "prefix_frontier_key": (0,), "filled_block_keys": (1,), "can_admit": (0,)}
OTHER_METHODS = ("append_decode", "append_batch", "free", "fork", "swap_out", "swap_in",
                 "can_append_without_copy", "breakdown", "set_token_source")


def outcome(name: str, result, out: list | None):
    """What a call returned, comparable across processes (see the module's NOTE)."""
    if name == "admit":
        return None if result is None else result.num_cached_tokens
    if name == "prefix_frontier_key":
        return result is None
    if name == "filled_block_keys":
        return len(result)
    if name in ("append_decode", "append_batch"):
        return result, out
    return result


class OutermostCalls:
    """Patches some of a class's methods for the duration of a ``with`` block; ``outermost``
    sees each call that no other patched call made (``append_batch``'s own ``append``s
    pass straight through)."""

    def __init__(self, cls: type, names: tuple[str, ...]) -> None:
        self.cls, self.names = cls, names
        self._saved: dict = {}
        self._depth = 0

    def __enter__(self):
        for name in self.names:
            self._saved[name] = getattr(self.cls, name)
            setattr(self.cls, name, self._wrap(name, self._saved[name]))
        return self

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            setattr(self.cls, name, method)

    def _wrap(self, name: str, method):
        patch = self

        def patched(obj, *args):
            if patch._depth:
                return method(obj, *args)
            patch._depth += 1
            try:
                return patch.outermost(name, method, obj, args)
            finally:
                patch._depth -= 1

        return patched

    def outermost(self, name: str, method, obj, args: tuple):
        raise NotImplementedError


class Recorder(OutermostCalls):
    """Keeps the manager's outermost calls: arguments and outcome, token arrays once each."""

    def __init__(self, cls: type) -> None:
        super().__init__(cls, (*TOKEN_ARGS, *OTHER_METHODS))
        self.calls: list[tuple] = []  # (method, args, outcome)
        self.arrays: list[tuple[bytes, bool]] = []  # token arrays: int32 bytes, writeable
        self._index: dict[tuple[bytes, bool], int] = {}

    def _token_ref(self, ids):
        if isinstance(ids, np.ndarray):
            key = (ids.astype(np.int32, copy=False).tobytes(), bool(ids.flags.writeable))
            if key not in self._index:
                self._index[key] = len(self.arrays)
                self.arrays.append(key)
            return ("array", self._index[key])
        return ("seq", ids if isinstance(ids, range) else list(ids))

    def __enter__(self) -> "Recorder":
        cls, calls = self.cls, self.calls
        init = self._saved["__init__"] = cls.__init__  # restored by __exit__ with the rest

        def record_init(manager, *args, **kwargs):
            calls.append(("__init__", (args, kwargs), None))
            init(manager, *args, **kwargs)

        cls.__init__ = record_init
        return super().__enter__()

    def outermost(self, name: str, method, manager, args: tuple):
        args = list(args)
        if name == "append_decode" and args[1] is not None:
            args[1] = list(args[1])  # consumed in step with the ids: materialise it
        kept = list(args)
        if name == "set_token_source":  # kept: the ids its source gives, as it gives them
            kept[1] = reads = []
            args[1] = _recording(args[1], reads)
        for i in TOKEN_ARGS.get(name, ()):
            kept[i] = self._token_ref(args[i])
        if name == "append_batch":
            kept[1] = [self._token_ref(tokens) for tokens in args[1]]
        out = args[2] if name in ("append_decode", "append_batch") else None
        before = len(out) if out is not None else 0
        if out is not None:
            kept[2] = None  # the copies list is filled by the call
        result = method(manager, *args)
        new = list(out[before:]) if out is not None else None
        self.calls.append((name, tuple(kept), outcome(name, result, new)))
        return result


class Timer(OutermostCalls):
    """Times the outermost calls of some of a class's methods (wall seconds per method)."""

    def __init__(self, cls: type, names: tuple[str, ...]) -> None:
        super().__init__(cls, names)
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()

    def outermost(self, name: str, method, obj, args: tuple):
        start = time.perf_counter()
        try:
            return method(obj, *args)
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1

    def figures(self, run_s: float) -> dict:
        total = sum(self.seconds.values())
        return {"seconds": round(total, 3), "share_of_run": round(total / run_s, 3),
                "by_method": {name: {"calls": self.calls[name],
                                     "seconds": round(self.seconds[name], 3)}
                              for name, _ in self.seconds.most_common()}}


POOL_METHODS = ("allocate", "free", "touch", "touch_many", "register", "register_many",
                "lookup", "evicted_since")


def shares(overrides: list[str], system: str) -> dict:
    """Run ``system`` once with its manager's and block pool's calls timed: their wall
    seconds beside the whole run's."""
    from _setup import PreparedRun

    from pagebench.allocators.block_pool import BlockPool
    from pagebench.allocators.paged import PagedKVCacheManager

    prepared = PreparedRun(*overrides)
    with Timer(PagedKVCacheManager, (*TOKEN_ARGS, *OTHER_METHODS)) as manager, \
            Timer(BlockPool, POOL_METHODS) as pool:
        start = time.perf_counter()
        prepared.run(system)
        run_s = time.perf_counter() - start
    return {"overrides": overrides, "system": system, "run_s": round(run_s, 3),
            "manager": manager.figures(run_s), "block_pool": pool.figures(run_s)}


def record(path: Path, overrides: list[str], system: str) -> dict:
    """Run ``system`` twice (timed, then recorded) and pickle the calls to ``path``."""
    from _setup import PreparedRun

    from pagebench.allocators.paged import PagedKVCacheManager

    prepared = PreparedRun(*overrides)
    start = time.process_time()
    prepared.run(system)
    run_cpu_s = time.process_time() - start
    with Recorder(PagedKVCacheManager) as recorder:
        prepared.run(system)
    data = {"overrides": overrides, "system": system, "run_cpu_s": run_cpu_s,
            "calls": recorder.calls, "arrays": recorder.arrays}
    with open(path, "wb") as handle:
        pickle.dump(data, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return {"calls": len(recorder.calls), "arrays": len(recorder.arrays),
            "run_cpu_s": round(run_cpu_s, 3)}


def _recording(source, reads: list):
    """``source``, keeping each answer in ``reads`` (for ``_replaying``)."""
    def recorded(start: int, end: int):
        ids = source(start, end)
        reads.append(ids)  # packed 4-byte ints
        return ids
    return recorded


def _replaying(reads: list):
    """A token source giving the recorded answers, in order."""
    answers = iter(reads)
    return lambda start, end: next(answers)


def _arguments(args: tuple, name: str, arrays: list[np.ndarray]) -> tuple:
    def tokens(ref):
        kind, value = ref
        return arrays[value] if kind == "array" else value

    args = list(args)
    for i in TOKEN_ARGS.get(name, ()):
        args[i] = tokens(args[i])
    if name == "append_batch":
        args[1] = [tokens(ref) for ref in args[1]]
    if name in ("append_decode", "append_batch"):
        args[2] = []
    if name == "set_token_source":
        args[1] = _replaying(args[1])
    return tuple(args)


def replay_once(data: dict, manager_cls: type) -> tuple[dict[str, float], Counter, list[str]]:
    """One replay: CPU seconds per method, calls per method, and the first mismatches."""
    arrays = []
    for raw, writeable in data["arrays"]:
        array = np.frombuffer(raw, dtype=np.int32).copy()
        array.setflags(write=writeable)
        arrays.append(array)
    calls = [(name, _arguments(args, name, arrays) if name != "__init__" else args, expected)
             for name, args, expected in data["calls"]]
    seconds: dict[str, float] = Counter()
    counts: Counter = Counter()
    mismatches: list[str] = []
    manager = None
    clock = time.process_time
    for index, (name, args, expected) in enumerate(calls):
        if name == "__init__":
            manager = manager_cls(*args[0], **args[1])
            continue
        start = clock()
        result = getattr(manager, name)(*args)
        seconds[name] += clock() - start
        counts[name] += 1
        out = args[2] if name in ("append_decode", "append_batch") else None
        got = outcome(name, result, out)
        if got != expected and len(mismatches) < 10:
            mismatches.append(f"call {index} {name}: got {got!r}, recorded {expected!r}")
    return dict(seconds), counts, mismatches


def replay(path: Path, rounds: int, manager: str | None) -> dict:
    """Replay ``rounds`` times; medians of the CPU seconds, and the recorded run's."""
    with open(path, "rb") as handle:
        data = pickle.load(handle)
    if manager:
        module, _, name = manager.partition(":")
        manager_cls = getattr(importlib.import_module(module), name)
    else:
        from pagebench.allocators.paged import PagedKVCacheManager as manager_cls
    runs = [replay_once(data, manager_cls) for _ in range(rounds)]
    totals = [sum(seconds.values()) for seconds, _, _ in runs]
    counts = runs[0][1]
    by_method = {name: {"calls": counts[name],
                        "cpu_s": round(statistics.median(r[0].get(name, 0.0) for r in runs), 3)}
                 for name, _ in counts.most_common()}
    total = statistics.median(totals)
    return {"recorded": {"overrides": data["overrides"], "system": data["system"],
                         "run_cpu_s": round(data["run_cpu_s"], 3)},
            "manager": f"{manager_cls.__module__}.{manager_cls.__qualname__}",
            "calls": sum(counts.values()), "rounds": rounds,
            "replay_cpu_s": round(total, 3), "replay_cpu_s_runs": [round(t, 3) for t in totals],
            "share_of_run": round(total / data["run_cpu_s"], 3) if data["run_cpu_s"] else None,
            "by_method": by_method, "mismatches": runs[0][2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="run a system and record its manager's calls")
    rec.add_argument("calls", type=Path, help="where to write the recording (pickle)")
    rec.add_argument("overrides", nargs="*", help="config overrides, as for python -m harness")
    rec.add_argument("--system", default="paged", help="a paged system of the config")
    rep = commands.add_parser("replay", help="replay a recording against a fresh manager")
    rep.add_argument("calls", type=Path)
    rep.add_argument("--rounds", type=int, default=1)
    rep.add_argument("--manager", help="module:Class to replay against (default: ours)")
    rep.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    share = commands.add_parser("shares", help="time a run's manager and block pool calls")
    share.add_argument("overrides", nargs="*", help="config overrides, as for python -m harness")
    share.add_argument("--system", default="paged", help="a paged system of the config")
    args = parser.parse_args(argv)
    if args.command == "shares":
        print(json.dumps(shares(args.overrides, args.system), indent=1))
        return 0
    if args.command == "record":
        print(json.dumps(record(args.calls, args.overrides, args.system)))
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    figures = replay(args.calls, args.rounds, args.manager)
    text = json.dumps(figures, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 1 if figures["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
