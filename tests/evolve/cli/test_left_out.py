"""`eval` and `run` name the blocks the search cannot move, and why (discovery's ``unfollowed``);
a whole dimension of an input, which is not a tunable, goes unsaid."""

from __future__ import annotations

from evolve.cli.eval import left_out
from seeds import load_seed


def test_a_block_computed_by_a_call_is_named_with_its_blockspec_and_why():
    seed = load_seed("matmul")
    task = seed.task("M=256,K=256,N=256")
    assert left_out(seed.kernel_source, task) is None          # every block followed
    source = seed.kernel_source.replace(
        "bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), min(BLOCK_K, k)",
        "bm, bn, bk = _pick(m), min(BLOCK_N, n), min(BLOCK_K, k)").replace(
        "@jax.jit", "def _pick(m):\n    if m >= 128:\n        return 128\n    return m\n\n\n@jax.jit")
    note = left_out(source, task)
    assert note is not None and note.startswith("note: blocks the search cannot move:")
    assert "pl.BlockSpec((bm, bk), ...)` in matmul()" in note and "`bm` is `_pick(m)`, a call" in note
    assert "whole dimension" not in note
