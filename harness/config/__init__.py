"""The config room: what a run may be told and how it is checked, once, at the edge.

Hydra composes ``conf/``; ``override_check`` (over ``conf_tree``) refuses keys the config
cannot take before composing; ``specs`` (with ``hardware_spec`` and ``offload``; the model's
in ``harness.models``) are the frozen specs the code reads, each built from its config node
in one pass by the schema of ``harness.spec_schema`` (pydantic); ``systems`` builds a
system's KV manager; ``memory_estimate`` refuses a run that cannot fit before it starts;
``cli_args`` are the small tools' argument types. The run plan that builds every spec of a
run is ``harness.run.run_setup``. Nothing above this room re-checks a config value."""
