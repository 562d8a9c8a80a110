"""The unit of work every workload produces and every engine consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One inference request as the engine sees it.

    NOTE: ``prompt_token_ids`` is a read-only 1-D ``np.int32`` array. Token ids
    matter: prefix caching matches on them, so workloads that share a prefix
    must produce equal ids for it, and workloads that do not must produce ids
    that do not collide (see ``harness.workloads.tokens``).

    The KV cache of a request holds ``kv_len = prompt_len + output_len - 1``
    tokens when it finishes: the prefill writes the prompt and yields the first
    output token; each decode step writes the KV of the previous output token
    and yields the next one; the last token's KV is never written.
    """

    request_id: int
    arrival_time: float  # seconds since the start of the workload
    prompt_token_ids: np.ndarray  # [prompt_len] int32
    output_len: int  # true number of generated tokens (>= 1)
    num_samples: int = 1  # parallel samples sharing the prompt (n)
    beam_width: int = 1  # beam search width (k); 1 = no beam search
    name: str = ""
    # Token ids the sim executor "generates" ([output_len] int32), so that a
    # later request (the next chat turn) can contain them. None: unique ids.
    output_token_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.prompt_token_ids.ndim != 1 or len(self.prompt_token_ids) < 1:
            raise ValueError(f"request {self.request_id}: prompt must be a non-empty 1-D array")
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1, got {self.output_len}")
        if self.num_samples < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: num_samples and beam_width must be >= 1")
        if self.arrival_time < 0:
            raise ValueError(f"request {self.request_id}: arrival_time must be >= 0, got {self.arrival_time}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def kv_len(self) -> int:
        """KV slots the request's (each) sequence holds when it finishes."""
        return self.prompt_len + self.output_len - 1
