"""A weighted mix of workloads.

Each component is a workload node plus a ``weight``; ``preset: <name>`` starts
from ``conf/workload/<name>.yaml`` and the component's other keys override it
(deep merge). Component i gets round(N * w_i) requests (largest remainder).
With a generative arrival process (poisson, gamma, offline) the mixture draws N
arrival times and deals them to the components in a seeded random order; each
component keeps its own request order. With ``process: trace`` each component
keeps its own arrival times (the streams are superposed). All components share
one token space, so their ids never collide.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import ConfigError
from harness.workloads.arrivals import generate_arrivals
from harness.workloads.presets import PRESET_DIR, load_preset as read_preset
from harness.workloads.registry import BuildContext, Draft, register
from harness.workloads.spec import SyntheticSpec, check


@dataclass(frozen=True, kw_only=True)
class MixtureSpec(SyntheticSpec):
    components: tuple[dict, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        check(len(self.components) >= 1, "components", "must list at least one component")
        for key in ("time_scale", "target_rate"):  # trace keeps each component's own times
            check(getattr(self.arrival, key) is None, f"arrival.{key}",
                  "a mixture with process=trace superposes its components' own arrival times "
                  f"and does not rescale them: set arrival.{key} on each trace component instead")


def load_preset(name: str, where: str) -> dict:
    path = PRESET_DIR / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        known = sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) if PRESET_DIR.is_dir() else []
        raise ConfigError(f"{where}.preset: no workload preset {name!r} in {PRESET_DIR}; known: "
                          f"{', '.join(known) or 'none'}. Or give the component's keys inline (kind: ...).")
    return read_preset(path)  # (of a global preset, such as mooncake: its workload node)


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def component_nodes(spec: MixtureSpec, where: str) -> list[tuple[float, dict]]:
    nodes = []
    for i, raw in enumerate(spec.components):
        at = f"{where}.components[{i}]"
        node: dict[str, Any] = dict(raw)
        weight = node.pop("weight", None)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise ConfigError(f"{at}.weight: every component needs a weight > 0, got {weight!r}")
        preset = node.pop("preset", None)
        if preset is not None:
            node = _merge(load_preset(preset, at), node)
        if node.get("kind") == "mixture":
            raise ConfigError(f"{at}.kind: a mixture cannot contain a mixture; list its components directly")
        nodes.append((float(weight), node))
    return nodes


def split_counts(total: int, weights: np.ndarray) -> np.ndarray:
    """Largest-remainder apportionment of ``total`` by ``weights``."""
    share = total * weights / weights.sum()
    counts = np.floor(share).astype(np.int64)
    remainder = total - int(counts.sum())
    order = np.argsort(-(share - counts), kind="stable")
    counts[order[:remainder]] += 1
    return counts


@register("mixture", MixtureSpec)
def build_mixture(spec: MixtureSpec, ctx: BuildContext) -> list[Draft]:
    """A weighted mix of other workloads sharing one token space."""
    from harness.workloads.build import build_drafts  # the pipeline builds each component

    nodes = component_nodes(spec, ctx.where)
    counts = split_counts(spec.num_requests, np.array([w for w, _ in nodes]))
    per_component: list[list[Draft]] = []
    for i, ((_, node), count) in enumerate(zip(nodes, counts.tolist())):
        if count == 0:
            per_component.append([])
            continue
        node["num_requests"] = count
        child = ctx.child(i, f"{ctx.where}.components[{i}]")
        sub_spec, drafts = build_drafts(node, child)
        label = sub_spec.name or sub_spec.kind
        for d in drafts:
            d.component = f"{i}:{label}"
        ctx.tally.merge(child.tally)
        drafts.sort(key=lambda d: d.arrival_time)
        per_component.append(drafts)
    if spec.arrival.process == "trace":
        return [d for drafts in per_component for d in drafts]
    total = sum(len(d) for d in per_component)
    labels = np.concatenate([np.full(len(d), i) for i, d in enumerate(per_component)]).astype(np.int64)
    labels = ctx.rng.permutation(labels)
    times = generate_arrivals(spec.arrival, total, ctx.rng, f"{ctx.where}.arrival")
    cursor = [0] * len(per_component)
    result = []
    for label, time in zip(labels.tolist(), times.tolist()):
        draft = per_component[label][cursor[label]]
        cursor[label] += 1
        draft.arrival_time = time
        result.append(draft)
    return result
