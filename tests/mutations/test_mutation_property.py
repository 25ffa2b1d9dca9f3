"""Property: random sequences of applicable exact operators keep the seed correct — as the judge sees it
(interpret mode on the CPU, the parent's comparison, the real compiler for lowering)."""

from __future__ import annotations

import os
import random

import pytest

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from mutations import Edit, all_operators, replay
from seeds.flash_attention.task import AttentionTask

from .kernel_check import seed_source

SMALL = {causal: AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=causal)
         for causal in (True, False)}


@pytest.fixture(scope="module")
def judge(tmp_path_factory) -> Judge:
    return Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("cache")),
                             workers=min(2, os.cpu_count() or 1)))


def correct(result) -> bool:
    """Correctness passed: PASS, or no timing figure for a kernel that was already proven right."""
    return result.status is Status.PASS or (result.status is Status.FAIL_TIMING
                                            and result.stage == "performance")


def random_sequence(task, rng: random.Random, length: int):
    """Apply ``length`` operators chosen at random among those that apply at each step."""
    source, edits = seed_source(), []
    for _ in range(length):
        candidates = [op for op in all_operators() if op.exact and op.check(source, task).ok]
        if not candidates:
            break
        op = rng.choice(candidates)
        result = op.apply(source, task, rng)
        assert result.status == "applied", (op.name, result.reason)
        source, edits = result.source, edits + [result.edit]
    return source, edits


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_random_sequences_of_up_to_three_operators_stay_correct(judge, causal):
    task = SMALL[causal]
    cases = []
    for rng_seed in range(6):
        rng = random.Random(1000 * rng_seed + causal)
        source, edits = random_sequence(task, rng, length=1 + rng_seed % 3)
        assert edits
        assert replay(seed_source(), edits, task).source == source
        cases.append((source, edits))
    results = judge.evaluate_many([s for s, _ in cases], task)
    for (_, edits), result in zip(cases, results):
        assert correct(result), f"{[e.to_dict() for e in edits]}: {result.status.value} {result.error}"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_all_operators_composed_stay_correct_in_both_block_orders(judge, causal):
    # Unequal blocks both ways (BQ < BKV, then BQ > BKV) and 2 heads per program.
    task = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=causal)
    edits = [Edit("head_coarsening", {"heads_per_program": 2}), Edit("compact_scratch"),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 256}), Edit("deferred_norm"),
             Edit("vmem_limit", {"mib": 64}), Edit("exp2_softmax")]
    if causal:
        edits.insert(2, Edit("causal_skip"))   # after head_coarsening: it clamps the per-head specs
    result = replay(seed_source(), edits, task)
    assert result.status == "applied", result.reason
    swapped = replay(result.source, [Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 128}),
                                     Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 256})], task)
    assert swapped.status == "applied", swapped.reason
    for r in judge.evaluate_many([result.source, swapped.source], task):
        assert correct(r), (r.status, r.error)


@pytest.mark.parametrize("strip, heads", [(128, 1), (256, 2)])
def test_diagonal_strips_that_really_split_a_block_stay_correct(judge, strip, heads):
    # Square 512-row blocks at N=1024: a diagonal block in 4 (or 2) strips, and one block below it;
    # one head per program, or two (per-head ref tuples).
    task = AttentionTask(batch=1, heads=2, seq_len=1024, head_dim=128, causal=True)
    coarse = [Edit("head_coarsening", {"heads_per_program": heads})] if heads > 1 else []
    edits = coarse + [Edit("causal_skip"), Edit("compact_scratch"), Edit("diagonal_strips", {"strip": strip}),
             Edit("deferred_norm"), Edit("exp2_softmax"),
             Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 512}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 512})]
    result = replay(seed_source(), edits, task)
    assert result.status == "applied", result.reason
    assert f"DIAGONAL_STRIP = {strip}" in result.source
    r = judge.evaluate(result.source, task)
    assert correct(r), (r.status, r.error)


def test_an_approximate_reciprocal_is_the_judges_call(judge):
    # Exact in the causal task's tolerance, too coarse on full attention with outliers: the
    # operator applies to both, and the judge's precision bar decides.
    verdicts = {}
    for causal in (True, False):
        task = SMALL[causal]
        result = replay(seed_source(), [Edit("deferred_norm"), Edit("approx_reciprocal")], task)
        assert result.status == "applied", result.reason
        verdicts[causal] = judge.evaluate(result.source, task)
    assert correct(verdicts[True]), (verdicts[True].status, verdicts[True].error)
    assert verdicts[False].status is Status.FAIL_CORRECTNESS and "less precise" in verdicts[False].error
