"""KV-cache managers (pure Python, no torch): paged blocks or contiguous reservations.

``make_manager("paged", num_blocks=..., block_size=16)`` or
``make_manager("contiguous", capacity_slots=..., policy="pow2", max_model_len=4096)``.
"""

from __future__ import annotations

import inspect
from typing import Any

from allocators.arena import ARENAS, make_arena
from allocators.base import Admission, KVCacheManager, ManagerStats, MemoryBreakdown
from allocators.contiguous import POLICIES, ContiguousKVCacheManager
from allocators.paged import PagedKVCacheManager

MANAGERS: dict[str, type] = {
    "paged": PagedKVCacheManager,
    "contiguous": ContiguousKVCacheManager,
}


def make_manager(kind: str, **kwargs: Any) -> KVCacheManager:
    """Build the manager registered as ``kind`` (one of ``MANAGERS``) from keyword args."""
    cls = MANAGERS.get(kind)
    if cls is None:
        raise ValueError(f"unknown allocator kind {kind!r}; choose one of {sorted(MANAGERS)}")
    params = inspect.signature(cls).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"allocator {kind!r} does not take {unknown}; it takes {list(params)}")
    missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs]
    if missing:
        raise ValueError(f"allocator {kind!r} needs {missing}")
    return cls(**kwargs)


__all__ = [
    "ARENAS", "Admission", "ContiguousKVCacheManager", "KVCacheManager", "MANAGERS",
    "ManagerStats", "MemoryBreakdown", "POLICIES", "PagedKVCacheManager", "make_arena",
    "make_manager",
]
