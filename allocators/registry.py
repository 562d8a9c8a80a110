"""The registry of KV-cache managers (pure Python, no torch): paged blocks, contiguous reservations, and
whatever else registers itself (``pagebench.allocators.base.register_manager``).

``make_manager("paged", num_blocks=..., block_size=16)`` or
``make_manager("contiguous", capacity_slots=..., policy="pow2", max_model_len=4096)``.
Every module of this package is imported here, so a manager in a new file is registered
(``MANAGERS``) without a list kept by hand.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

from pagebench.allocators.arena import ARENAS, make_arena
from pagebench.allocators.base import (MANAGERS, Admission, Capabilities, KVCacheManager, ManagerStats,
                             MemoryBreakdown, register_manager)
from pagebench.allocators.contiguous import POLICIES, ContiguousKVCacheManager
from pagebench.allocators.paged import PagedKVCacheManager

_PACKAGE = __name__.rpartition(".")[0]  # pagebench.allocators
for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _module.name != "registry":
        importlib.import_module(f"{_PACKAGE}.{_module.name}")


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
    "ARENAS", "Admission", "Capabilities", "ContiguousKVCacheManager", "KVCacheManager", "MANAGERS",
    "ManagerStats", "MemoryBreakdown", "POLICIES", "PagedKVCacheManager", "make_arena",
    "make_manager", "register_manager",
]
