"""pagebench's paged manager under the peers' driver (../shared/peers/common/workload.py).

The same seeded 2,000-request workload and continuous-batching driver that drive vLLM's
``KVCacheManager`` and SGLang's ``RadixCache`` there (block 16, 256 sequences); one call
is one whole ``run_sim``. ``extra_info["ops"]`` / the median gives ops/s comparable with
the peers' ``ops_per_sec_wall`` (their side-by-side run: benchmarks/peers/run_side_by_side.sh).
Skipped when the peers' driver is not beside the repository.
"""

from __future__ import annotations

import sys

import pytest

from _setup import ROOT

PEERS = ROOT.parent / "shared" / "peers"
if not (PEERS / "common" / "workload.py").exists():
    pytest.skip(f"no peers driver at {PEERS}", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
from bench_pagebench import PagebenchAdapter  # noqa: E402  (puts the driver on sys.path)
from workload import make_workload, run_sim  # noqa: E402

REQUESTS = make_workload(n_requests=2000, seed=0)


@pytest.mark.parametrize("num_blocks", [8192, 4096])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefix_cache"])
def bench_peers_driver_pagebench(benchmark, prefix_caching, num_blocks):
    """One call: the peers' 2,000-request simulation on a fresh PagedKVCacheManager."""
    def one_run():
        return run_sim(PagebenchAdapter(num_blocks, 16, prefix_caching), REQUESTS, max_num_seqs=256)

    stats = benchmark.pedantic(one_run, rounds=5, iterations=1, warmup_rounds=1)
    result = stats.as_dict()
    assert result["blocks_in_use_after_run"] == 0
    benchmark.extra_info.update({k: result[k] for k in ("ops", "steps", "preemptions",
                                                        "peak_used_blocks", "prefix_hit_rate")})
