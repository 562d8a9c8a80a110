"""The route of a run's config through the code: which project modules (and rooms) see the
composed ``cfg`` (Hydra's DictConfig, or one of its nodes) as an argument or local, in
call order, from ``python -m harness`` until the specs the serving run uses are frozen (the
return of the ``run_setup`` call that builds them), and through the whole run.

    python benchmarks/cpu/cfg_route.py [overrides...]    # from the checkout to measure

A *stay* is a run of consecutive calls in one module; a *return* is a stay in a module the
config had already left. Rooms are harness's folders (a top-level module is its own room).
Prints the route and the counts, and a JSON line of them. Runs in-process (jobs=1) with
``sys.settrace`` on call events only, so the figures count calls, not time.
"""

from __future__ import annotations

import functools
import json
import runpy
import sys
import tempfile
from pathlib import Path

ROOT = Path.cwd().resolve()
PROJECT = tuple(str(ROOT / folder) + "/" for folder in ("harness", "allocators", "kernels", "reports"))


@functools.lru_cache(maxsize=None)
def _module(filename: str) -> str | None:
    """The project file (relative to the checkout) of a code object's file, or None."""
    path = str(Path(filename).resolve())  # (a venv may reach the checkout through links)
    return str(Path(path).relative_to(ROOT)) if path.startswith(PROJECT) else None


def _room(module: str) -> str:
    parts = Path(module).parts
    return "/".join(parts[:2]) if len(parts) > 2 else module


def main() -> None:
    from omegaconf import DictConfig, ListConfig

    route: list[str] = []
    state = {"cfg": None, "setups": 0}

    def holds_cfg(frame) -> bool:
        cfg = state["cfg"]
        for value in frame.f_locals.values():
            if value is cfg:
                return True
            if isinstance(value, (DictConfig, ListConfig)):
                try:
                    if value._get_root() is cfg:
                        return True
                except Exception:  # noqa: BLE001
                    pass
        return False

    def tracer(frame, event, arg):
        module = _module(frame.f_code.co_filename)
        if module is None:
            return None
        if state["cfg"] is None:
            if module.endswith("__main__.py") and isinstance(frame.f_locals.get("cfg"), DictConfig):
                state["cfg"] = frame.f_locals["cfg"]
            else:
                return None
        if holds_cfg(frame):
            route.append(f"{module}:{frame.f_code.co_name}")
        if frame.f_code.co_name == "run_setup":
            return returns
        return None

    def returns(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "run_setup":
            state["setups"] += 1
            serving = "run_serving" in [f.f_code.co_name for f in _stack(frame)]
            route.append(f"-- specs frozen{' (serving run)' if serving else ''}")
        return returns

    out = tempfile.mkdtemp(prefix="cfg_route_")
    sys.argv = ["harness", f"hydra.run.dir={out}", "progress=false", "report=false", "jobs=1",
                *sys.argv[1:]]
    sys.settrace(tracer)
    try:
        runpy.run_module("harness", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        sys.settrace(None)
    marks = [i for i, entry in enumerate(route) if entry.startswith("--")]
    serving = [i for i in marks if "serving" in route[i]]
    frozen = (serving or marks)[0]  # the serving run's own specs, or the ones it was handed
    print(f"== until the specs the serving run uses are frozen ({len(marks)} run_setup calls)")
    report([entry for entry in route[:frozen] if not entry.startswith("--")])
    print("== the whole run")
    report([entry for entry in route if not entry.startswith("--")])


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def report(route: list[str]) -> None:
    for level, key in (("module", lambda e: e.split(":")[0]), ("room", lambda e: _room(e.split(":")[0]))):
        stays, left, returns = [], set(), 0
        for entry in route:
            place = key(entry)
            if stays and stays[-1] == place:
                continue
            if stays:
                left.add(stays[-1])
            returns += place in left
            stays.append(place)
        print(f"{level}s: {len(stays)} stays in {len(set(stays))} {level}s, {returns} returns")
        print("  " + " -> ".join(stays))
        print(json.dumps({"level": level, "calls": len(route), "stays": len(stays),
                          "places": len(set(stays)), "returns": returns}))


if __name__ == "__main__":
    main()
