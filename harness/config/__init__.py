"""The config room: what a run may be told and how it is checked, once, at the edge.

Hydra composes ``conf/``; ``override_check`` refuses keys the config cannot take before
composing; ``specs`` (with ``spec_checks``, ``hardware_spec``, ``offload``, ``systems``)
turns the composed config into frozen, validated specs; ``run_setup`` is the run plan built
from them; ``memory_estimate`` refuses a run that cannot fit before it starts. Nothing below
this room re-checks a config value."""
