"""A manager that declares ``Capabilities.reads_decode_tokens=False`` gets None for the
token ids of ``append_decode`` (the scheduler builds none): every catalog system that does
runs exactly as when it is given the real ids. A manager that starts reading them fails
here (it gets None, or its figures move)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import engine_helpers
from engine_helpers import engine_spec, make_requests, run
from harness.config.specs import select_systems

CATALOG = yaml.safe_load((Path(__file__).parents[1] / "conf/allocator/standard.yaml").read_text())
SYSTEMS = select_systems(list(CATALOG), CATALOG, 16)
SPEC = engine_spec(kv_capacity_slots=2048)


def _declares_unread(system) -> bool:
    manager = engine_helpers.build_manager(system, SPEC.kv_capacity_slots, engine_helpers.MODEL,
                                           SPEC, 1024)
    return not manager.capabilities.reads_decode_tokens


UNREAD = [system for system in SYSTEMS if _declares_unread(system)]


def test_the_contiguous_systems_declare_their_decode_tokens_unread():
    assert {"max", "pow2", "oracle"} <= {system.name for system in UNREAD}


def _run(monkeypatch, requests, system, spec, *, reads: bool | None = None,
         advance_all: bool = True):
    """The run, with ``reads_decode_tokens`` set to ``reads`` (None: as declared) and, with
    ``advance_all=False``, a contiguous manager's O(1) ``advance_all`` refused (the
    scheduler and fast-forward take their general paths); and the types of the
    ``token_ids`` its ``append_decode`` got."""
    build = engine_helpers.build_manager
    seen: set[type] = set()

    def build_with(*args, **kwargs):
        manager = build(*args, **kwargs)
        if reads is not None:
            manager.capabilities = dataclasses.replace(manager.capabilities,
                                                       reads_decode_tokens=reads)
        if not advance_all:
            manager.advance_all = lambda count, num_seqs: False
        append_decode = manager.append_decode

        def spy(seq_ids, token_ids, copies):
            seen.add(type(token_ids))
            return append_decode(seq_ids, token_ids, copies)

        manager.append_decode = spy
        return manager

    with monkeypatch.context() as patch:
        patch.setattr(engine_helpers, "build_manager", build_with)
        return run(requests, system, spec, max_model_len=1024), seen


def _assert_same_run(a, b) -> None:
    pd.testing.assert_frame_equal(a.recorder.step_table(), b.recorder.step_table(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(a.recorder.request_table(), b.recorder.request_table(),
                                  check_exact=True)
    assert a.output_digest == b.output_digest


SPECS = {
    "step_by_step": dict(fast_forward=False),
    "fast_forward": dict(fast_forward=True),
    # decode runs that stop before a chunked prefill (not every sequence held)
    "chunked": dict(fast_forward=True, chunked_prefill=True, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("system", UNREAD, ids=lambda s: s.name)
def test_unread_decode_tokens_change_nothing(monkeypatch, system, spec):
    rng = np.random.default_rng(7)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 300, 50), rng.integers(1, 300, 50))]
    # a shared prefix (a keyed manager would hit it), and a pool that makes requests wait
    requests = make_requests(lengths, gap=0.01, prefix=np.arange(32, dtype=np.int32))
    spec = dataclasses.replace(SPEC, **SPECS[spec])
    given, given_types = _run(monkeypatch, requests, system, spec, reads=True, advance_all=False)
    skipped, skipped_types = _run(monkeypatch, requests, system, spec, reads=False,
                                  advance_all=False)
    assert given_types == {list} and skipped_types == {type(None)}  # the scheduler obeys
    _assert_same_run(given, skipped)
    # as declared: a contiguous manager's decode runs of all its sequences take advance_all
    declared, _ = _run(monkeypatch, requests, system, spec)
    _assert_same_run(given, declared)
