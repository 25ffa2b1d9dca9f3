"""JAX's own Pallas TPU flash attention at its best block sizes for the default task: the peer a
user gets by sweeping JAX's block sizes (what tune-jax and tokamax do) instead of evolving.

1024 for block_q, block_k_major and block_k is the best of the sweep
`.venv/bin/python scripts/sweep_jax_blocks.py` (default task, v5e, compiler estimate); blocks
are clamped to the sequence length so the same file runs on small test shapes.
`evolve run` judges this file side by side with its champion.
"""

from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes
from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention as _jax_flash_attention

BEST = 1024


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    b = min(BEST, q.shape[2])
    sizes = BlockSizes(block_q=b, block_k_major=b, block_k=b, block_b=1)
    return _jax_flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, block_sizes=sizes)
