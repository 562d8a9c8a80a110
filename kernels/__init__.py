"""Attention and KV-cache kernels: Triton kernels, their wrappers and torch references.

Public API (import the submodules; this package imports nothing heavy itself):

* ``kernels.paged_decode.paged_decode_attention`` -- decode attention over a paged cache
* ``kernels.contiguous_decode.contiguous_decode_attention`` -- the same kernel, no block table
* ``kernels.paged_prefill.prefill_attention`` -- prefill chunks over a paged or contiguous
  cache, read in place (and ``prefill_attention_reference``)
* ``kernels.cache_write`` -- ``write_kv_cache``, ``copy_blocks``, ``gather_blocks``,
  ``scatter_blocks``, ``swap_blocks``
* ``kernels.reference`` -- torch implementations (test oracle and CPU execution path)
* ``kernels.benchmark.run_kernel_benchmark`` -- the indirection benchmark
  (``python -m kernels.benchmark``; spec in ``bench_spec``, order and estimate in
  ``bench_plan``, inputs in ``bench_inputs``, point log and outputs in ``bench_results``)
* ``kernels.compile_check`` -- compile every variant for sm_90 without a GPU
* ``kernels.decode_kernel`` / ``decode_plan`` -- the shared Triton kernel; split-K, autotuning
* ``kernels.bandwidth`` -- the copy and read bandwidth ceilings

CUDA tensors run compiled Triton; CPU tensors run the torch reference, or the Triton
interpreter when ``TRITON_INTERPRET=1`` was set before triton was imported (tests).
"""
