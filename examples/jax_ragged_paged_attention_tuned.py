"""JAX's own ragged paged attention at the block sizes its tuned table gives for v6e: the peer
a user gets without evolving. The table is read from the installed package at run time (its own
lookup asks for a TPU device, so the v6e table is read directly); a problem the table does not
hold gets the module's defaults, clamped as the module clamps them.
"""

from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as _rpa
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as _tuned


def ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale=1.0):
    q_heads_per_blk, kv_heads_per_blk = _rpa.get_min_heads_per_blk(q.shape[1], kv_pages.shape[2], q.dtype,
                                                                    kv_pages.dtype)
    pages_per_seq = page_indices.shape[1]
    key = _tuned.simplify_key((q.dtype, kv_pages.dtype, q_heads_per_blk, kv_heads_per_blk // 2, q.shape[2],
                               kv_pages.shape[1], q.shape[0], pages_per_seq))
    kv_blk, q_blk = _tuned.TUNED_BLOCK_SIZES["TPU v6"].get(key, (128, 32))
    return _rpa.ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
                                       num_kv_pages_per_block=min(pages_per_seq, kv_blk),
                                       num_queries_per_block=min(q.shape[0], q_blk))
