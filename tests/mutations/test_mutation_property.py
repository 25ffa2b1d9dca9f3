"""Property: random sequences of applicable exact operators keep a seed correct — as the judge sees it
(interpret mode on the CPU, the parent's comparison, the real compiler for lowering).

Parametrised over every built-in seed at its small tasks (tests/mutations/seed_cases.py); the
operators are drawn from the registry (exact ones whose check() passes), so a new operator or a
new seed joins without editing this file. The judge compiles real kernels: the default selection
judges a few sequences per seed, each long enough that together they use every operator that
applies; heavier variants are marked slow.
"""

from __future__ import annotations

import os
import dataclasses
import random

import pytest

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from mutations import Edit, all_operators, replay
from seeds.flash_attention.task import AttentionTask

from .kernel_check import seed_source
from .seed_cases import SeedCase, seed_case, seed_cases
from tests.judging import judge_all

SMALL = {causal: AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128, causal=causal)
         for causal in (True, False)}
# Every built-in seed at each of its small tasks (flash_attention causal and full, flash_decoding
# with grouped heads at N=2048).
# Not yet two of the JAXBench seeds of issue 58 (open). mla: a block_sizes draw such as
# BLOCK_Q=512, BLOCK_K=1024, HEADS_PER_BLOCK=8 at SMALL kills libtpu's compile (SIGSEGV);
# sparse_moe: on v6e, draws such as COMBINE_COLS=256 at SMALL have XLA place a gather of the
# wrapper in VMEM, which libtpu's static profiler cannot estimate ("Unsupported DMA direction").
# retnet and mamba2_ssd are in.
NOT_YET = {"mla", "sparse_moe"}
PROPERTY_CASES = [pytest.param(c, id=c.id) for c in seed_cases()
                  if c.builtin and c.label != "default" and c.id.rsplit("-", 1)[0] not in NOT_YET]


@pytest.fixture(scope="module")
def judge(tmp_path_factory) -> Judge:
    return Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("cache")),
                             workers=min(2, os.cpu_count() or 1)))


def correct(result) -> bool:
    """Correctness passed: PASS, or no timing figure for a kernel that was already proven right
    (a data-dependent branch, or libtpu's static profiler failing at some decode shapes)."""
    return result.status is Status.PASS or (result.status is Status.FAIL_TIMING
                                            and result.stage == "performance")


def exact_applicable(source: str, task) -> list:
    return [op for op in all_operators() if op.exact and op.check(source, task).ok]


def random_sequence(case: SeedCase, rng: random.Random, length: int, unused: set[str]):
    """Apply ``length`` operators chosen at random among the exact ones that apply at each step,
    preferring those no sequence of this case has used yet (``unused``, updated)."""
    source, edits = case.source, []
    for _ in range(length):
        candidates = exact_applicable(source, case.task)
        if not candidates:
            break
        op = rng.choice([op for op in candidates if op.name in unused] or candidates)
        unused.discard(op.name)
        result = op.apply(source, case.task, rng)
        assert result.status == "applied", (op.name, result.reason)
        source, edits = result.source, edits + [result.edit]
    return source, edits


def judge_sequences(judge: Judge, case: SeedCase, rng_seeds, lengths) -> set[str]:
    """Judge one random sequence per rng seed (on the seed's own chip); every one must stay
    correct. Returns the operators that applied to the seed but no sequence used."""
    if case.task.default_chip != judge.config.chip:
        judge = Judge(dataclasses.replace(judge.config, chip=case.task.default_chip))
    unused = {op.name for op in exact_applicable(case.source, case.task)}
    assert unused, f"no exact operator applies to {case.id}"
    cases = []
    for rng_seed, length in zip(rng_seeds, lengths):
        source, edits = random_sequence(case, random.Random(rng_seed), length, unused)
        assert edits
        assert replay(case.source, edits, case.task).source == source
        cases.append((source, edits))
    results = judge_all(judge, [s for s, _ in cases], case.task)
    for (_, edits), result in zip(cases, results):
        assert correct(result), (f"{case.id}: {[e.to_dict() for e in edits]}: {result.status.value} "
                                 f"at {result.stage}: {result.error}")
    return unused


@pytest.mark.parametrize("case", PROPERTY_CASES)
def test_random_sequences_that_use_every_operator_stay_correct(judge, case):
    unused = judge_sequences(judge, case, rng_seeds=(11, 12, 13), lengths=(3, 3, 3))
    assert not unused, f"operators no sequence used (make the sequences longer): {sorted(unused)}"


@pytest.mark.slow
@pytest.mark.parametrize("case", PROPERTY_CASES)
def test_more_random_sequences_stay_correct(judge, case):
    judge_sequences(judge, case, rng_seeds=range(100, 108), lengths=(1, 2, 3, 4, 5, 2, 3, 4))


@pytest.mark.parametrize("causal", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["causal", "full"])
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
    for r in judge_all(judge, [result.source, swapped.source], task):
        assert correct(r), (r.status, r.error)


def test_decode_operators_composed_stay_correct_with_splits_past_the_lengths(judge):
    # Ragged lengths against 8 splits of one 256-entry block each: some splits lie wholly past a
    # sequence's length (a zero weight in the combine) and their K/V index maps are clamped.
    case = seed_case("flash_decoding", "small")
    edits = [Edit("exp2_softmax"), Edit("grouped_heads"), Edit("length_skip", {"compute": False}),
             Edit("split_kv", {"splits": 4}), Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 256}),
             Edit("block_sizes", {"tunable": "KV_SPLITS", "value": 8}), Edit("vmem_limit", {"mib": 32})]
    result = replay(case.source, edits, case.task)
    assert result.status == "applied", result.reason
    r = judge.evaluate(result.source, case.task)
    assert correct(r), (r.status, r.stage, r.error)


@pytest.mark.parametrize("strip, heads", [pytest.param(128, 1, marks=pytest.mark.slow), (256, 2)])
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


def test_an_approximate_reciprocal_passes_the_precision_bar_on_any_draw(judge):
    # Pallas' interpreter models the approximate reciprocal as a bf16 one: the output's error is up
    # to about twice the rounding of the task's XLA program at its worst elements (a max-error
    # ratio of 0.7-3.3 across secret draws, scripts/precision_spread.py), within 1.3x at its 99th
    # percentile and in the mean,
    # which is what the judge's bar reads. Causal and full attention alike pass, on this judge's
    # secret draw (tests/evaluator/correctness/test_secret_inputs.py judges such a chain on five draws).
    for causal in (True, False):
        task = SMALL[causal]
        result = replay(seed_source(), [Edit("deferred_norm"), Edit("approx_reciprocal")], task)
        assert result.status == "applied", result.reason
        verdict = judge.evaluate(result.source, task)
        assert correct(verdict), (causal, verdict.status, verdict.error)
