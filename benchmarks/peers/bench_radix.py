"""Drive pagebench's ``RadixKVCacheManager`` under the peers' shared driver, beside
SGLang's real RadixCache (``../shared/peers/sglang/bench.py``) on the same workload.

Same mapping as ``bench_pagebench.py`` (admit / append_decode / free through the manager
protocol); the tree's page is the driver's block size, as the SGLang adapter sets
``page_size=block_size``. Prefix caching is always on (a radix tree is a prefix cache).

    python3 benchmarks/peers/bench_radix.py --repeat 3 [--num-blocks 4096]
"""

from __future__ import annotations

import json
import platform

from bench_pagebench import IMPORT_SECONDS, _H, _version  # noqa: F401 (sets the driver's path)
from workload import common_argparser, make_workload, run_sim, warmup, workload_summary

from pagebench.allocators.radix import RadixKVCacheManager


class RadixAdapter:
    """The run_sim protocol over one ``RadixKVCacheManager`` (no logic of its own)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.mgr = RadixKVCacheManager(num_blocks, block_size)
        self.next_id = 0  # a preempted request restarts under a fresh seq id
        self.copies: list = []
        self.decoded: dict[int, int] = {}  # seq id -> tokens appended by decode

    def admit(self, spec):
        seq_id = self.next_id
        self.next_id += 1
        prompt_len = len(spec.prompt)
        admission = self.mgr.admit(seq_id, spec.prompt, prompt_len + spec.output_len, prompt_len)
        if admission is None:
            return None
        self.decoded[seq_id] = 0
        return _H(seq_id, spec, admission.num_cached_tokens)

    def decode(self, handles):
        decoded = self.decoded
        tokens = [h.spec.output[decoded[h.seq_id]] for h in handles]
        done = self.mgr.append_decode([h.seq_id for h in handles], tokens, self.copies)
        for h in handles[:done]:
            decoded[h.seq_id] += 1
        return done

    def free(self, handle, finished):
        self.mgr.free(handle.seq_id)
        del self.decoded[handle.seq_id]

    def used_blocks(self):
        return self.mgr.breakdown(False).allocated_slots // self.block_size

    def total_blocks(self):
        return self.num_blocks


def main():
    a = common_argparser(__doc__.splitlines()[0]).parse_args()
    reqs = make_workload(n_requests=a.requests, seed=a.seed)
    warmup(lambda: RadixAdapter(a.num_blocks, a.block_size), a.warmup, a.max_num_seqs)
    best = None
    for _ in range(a.repeat):
        st = run_sim(RadixAdapter(a.num_blocks, a.block_size), reqs, max_num_seqs=a.max_num_seqs)
        if best is None or st.wall_seconds < best.wall_seconds:
            best = st
    print(json.dumps({
        "peer": "pagebench.RadixKVCacheManager", "version": _version(),
        "python": platform.python_version(), "prefix_caching": True, "hash_algo": None,
        "block_size": a.block_size, "num_blocks": a.num_blocks, "max_num_seqs": a.max_num_seqs,
        "seed": a.seed, "import_seconds": round(IMPORT_SECONDS, 2),
        **workload_summary(reqs), **best.as_dict(),
    }), flush=True)


if __name__ == "__main__":
    main()
