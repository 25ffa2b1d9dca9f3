"""Property: random sequences of applicable operators keep the seed correct (TPU interpret mode)."""

from __future__ import annotations

import random

import pytest

from mutations import Edit, all_operators, replay
from seeds.flash_attention.task import AttentionTask

from .kernel_check import check_correct, seed_source

SMALL = {causal: AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=causal)
         for causal in (True, False)}


def random_sequence(task, rng: random.Random, length: int):
    """Apply ``length`` operators chosen at random among those that apply at each step."""
    source, edits = seed_source(), []
    for _ in range(length):
        candidates = [op for op in all_operators() if op.check(source, task).ok]
        if not candidates:
            break
        op = rng.choice(candidates)
        result = op.apply(source, task, rng)
        assert result.status == "applied", (op.name, result.reason)
        source, edits = result.source, edits + [result.edit]
    return source, edits


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("rng_seed", [0, 1, 2, 3, 4])
def test_random_sequences_stay_correct(rng_seed, causal):
    task = SMALL[causal]
    rng = random.Random(1000 * rng_seed + causal)
    source, edits = random_sequence(task, rng, length=1 + rng_seed % 3)
    assert edits
    error = check_correct(source, task)
    assert error is None, f"{[e.to_dict() for e in edits]}: {error}"
    assert replay(seed_source(), edits, task).source == source


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_all_operators_composed_stay_correct(causal):
    # Unequal blocks (BQ=128 < BKV=256 and BQ=256 > BKV=128 via rows) and 2 heads per program.
    task = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=causal)
    edits = [Edit("head_coarsening", {"heads_per_program": 2}), Edit("compact_scratch"),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 256}), Edit("deferred_norm"),
             Edit("vmem_limit", {"mib": 64})]
    if causal:
        edits.insert(2, Edit("causal_skip"))
    result = replay(seed_source(), edits, task)
    assert result.status == "applied", result.reason
    assert check_correct(result.source, task, seeds=(("outliers", 2),)) is None
    swapped = replay(result.source, [Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 128}),
                                     Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 256})], task)
    assert swapped.status == "applied", swapped.reason
    assert check_correct(swapped.source, task, seeds=(("normal", 1),)) is None
