"""Drive pagebench's own ``PagedKVCacheManager`` under the peers' shared driver.

The workload and the continuous-batching driver are the peers' own
(``../shared/peers/common/workload.py``, found beside this repository or at
``$PEERS_DIR``), so the figures compare with ``vllm/bench.py`` and
``sglang/bench.py`` there key for key. This file only maps the driver's
protocol onto the manager's public API, the calls the engine's scheduler makes:

  admit : PagedKVCacheManager.admit(seq_id, prompt, final_len=prompt+output, num_tokens=prompt)
          (prefix-cache lookup, hit blocks reused, the rest allocated; None when short)
  decode: PagedKVCacheManager.append_decode(seq_ids, tokens) -- one token per sequence,
          in order, stopping at the first that does not fit (= append(seq_id, [token])
          for each; the batch form saves a Python call per sequence)
  free  : PagedKVCacheManager.free(seq_id) (tail block first; full blocks stay cached)

Token ``k`` appended by decode is ``spec.output[k]``: the KV slot at position
``prompt_len + k`` holds the k-th output token, as in the vLLM adapter, so cached
decode blocks key on the same tokens.

Prints one JSON object per configuration (the keys of the peers' bench.py).
    python3 benchmarks/peers/bench_pagebench.py --repeat 3 [--num-blocks 4096] [--prefix-caching on|off|both]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = Path(os.environ.get("PEERS_DIR", ROOT.parent / "shared" / "peers"))
sys.path.insert(0, str(PEERS_DIR / "common"))
sys.path.insert(0, str(ROOT))
from workload import common_argparser, make_workload, run_sim, warmup, workload_summary  # noqa: E402

t_imp = time.perf_counter()
from pagebench.allocators.paged import PagedKVCacheManager  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - t_imp


class _H:
    __slots__ = ("seq_id", "spec", "hit_tokens", "out")

    def __init__(self, seq_id: int, spec, hit_tokens: int) -> None:
        self.seq_id = seq_id
        self.spec = spec
        self.hit_tokens = hit_tokens
        self.out = iter(spec.output)  # the token whose KV the next decode step writes


class PagebenchAdapter:
    """The run_sim protocol over one ``PagedKVCacheManager`` (no logic of its own)."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.mgr = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.next_id = 0  # a preempted request restarts under a fresh seq id
        self.copies: list = []  # copy-on-write copies (never any here: no forks)

    def admit(self, spec):
        seq_id = self.next_id
        self.next_id += 1
        prompt_len = len(spec.prompt)
        admission = self.mgr.admit(seq_id, spec.prompt, prompt_len + spec.output_len, prompt_len)
        if admission is None:
            return None
        return _H(seq_id, spec, admission.num_cached_tokens)

    def decode(self, handles):
        mgr = self.mgr
        # the token generator is consumed in step with the ids: one token per handle tried
        done = mgr.append_decode([h.seq_id for h in handles], (next(h.out) for h in handles),
                                 self.copies)
        if done < len(handles):  # out of memory: handles[done] gave a token it did not keep
            h = handles[done]
            h.out = iter(h.spec.output[mgr.num_tokens(h.seq_id) - len(h.spec.prompt):])
        return done

    def free(self, handle, finished):
        self.mgr.free(handle.seq_id)

    def used_blocks(self):
        return self.num_blocks - self.mgr.num_free_blocks

    def total_blocks(self):
        return self.num_blocks


def main():
    a = common_argparser(__doc__.splitlines()[0]).parse_args()
    reqs = make_workload(n_requests=a.requests, seed=a.seed)
    modes = {"on": [True], "off": [False], "both": [False, True]}[a.prefix_caching]
    for caching in modes:
        warmup(lambda: PagebenchAdapter(a.num_blocks, a.block_size, caching), a.warmup, a.max_num_seqs)
        best = None
        for _ in range(a.repeat):
            st = run_sim(PagebenchAdapter(a.num_blocks, a.block_size, caching), reqs,
                         max_num_seqs=a.max_num_seqs)
            if best is None or st.wall_seconds < best.wall_seconds:
                best = st
        print(json.dumps({
            "peer": "pagebench.PagedKVCacheManager",
            "version": _version(),
            "python": platform.python_version(),
            "prefix_caching": caching,
            "hash_algo": "python-hash-chain-64" if caching else None,
            "block_size": a.block_size,
            "num_blocks": a.num_blocks,
            "max_num_seqs": a.max_num_seqs,
            "seed": a.seed,
            "import_seconds": round(IMPORT_SECONDS, 2),
            **workload_summary(reqs),
            **best.as_dict(),
        }), flush=True)


def _version() -> str:
    try:
        from harness import __version__
        return __version__
    except Exception:  # noqa: BLE001 - the version is informational
        return "unknown"


if __name__ == "__main__":
    main()
