"""JAX's own Pallas TPU flash attention at the block sizes Autocomp's paper starts its v6e
flash-attention run from (block_q = block_k_major = 2048, block_k = 512): the peer of Autocomp's
published 1.41x, judged side by side in the suite (`evolve bench --suite`). Blocks are clamped to
the sequence length so the same file runs on small test shapes."""

from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes
from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention as _jax_flash_attention

MAJOR, MINOR = 2048, 512


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    n = q.shape[2]
    major, minor = min(MAJOR, n), min(MINOR, n)
    sizes = BlockSizes(block_q=major, block_k_major=major, block_k=minor, block_b=1)
    return _jax_flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, block_sizes=sizes)
