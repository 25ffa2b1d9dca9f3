"""The search's parts without a judge: multi-knob mutation, operator payoff, the surrogate, and the
rule that only a kernel that passed correctness can be selected, kept or crowned."""

from __future__ import annotations

import random

import pytest

from evaluator.result import EvalResult, Metrics, Status
from evolve.config import RunConfig, SearchConfig
from evolve.individual import Individual
from evolve.search import Search
from evolve.surrogate import Surrogate
from evolve.variation import mutate
from mutations import Edit, operator_names, replay
from seeds.flash_attention.task import AttentionTask

TASK = AttentionTask()
SEED = Individual(open("seeds/flash_attention/kernel.py").read(), edits=[])


def _search(**search) -> Search:
    config = RunConfig(search=SearchConfig(**search))
    return Search(config, SEED.source, TASK, evaluate=len, map_fn=map, record=print,
                  on_generation=lambda *a: None)


def _judged(ind: Individual, status: Status, cycles: int | None, speedup: float | None) -> Individual:
    ind.result = EvalResult(status, metrics=Metrics(estimated_cycles=cycles, speedup_vs_reference=speedup))
    ind.fitness.values = (speedup or 0.0,) if status is Status.PASS else (0.0,)
    return ind


def _with_blocks(q: int, kv: int) -> Individual:
    edits = [Edit("block_sizes", {"tunable": "BLOCK_Q", "value": q}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": kv})]
    result = replay(SEED.source, edits, TASK)
    assert result.status == "applied", result.reason
    return Individual(result.source, edits=[e.to_dict() for e in edits],
                      parent_ids=(SEED.id,), operator="block_sizes+block_sizes")


def test_a_mutation_can_change_several_knobs_and_replays_from_the_seed():
    rng = random.Random(3)
    children = [mutate(SEED, SEED.source, TASK, rng, 1, max_chain=3) for _ in range(12)]
    assert any(len(c.edits) > 1 for c in children) and all(1 <= len(c.edits) <= 3 for c in children)
    for c in children:
        assert replay(SEED.source, c.edits, TASK).source == c.source
        assert c.operator == "+".join(e["op"] for e in c.edits)


def test_operators_are_drawn_by_their_weights():
    rng = random.Random(0)
    weights = {name: 1e-9 for name in operator_names()} | {"causal_skip": 1.0}
    ops = {mutate(SEED, SEED.source, TASK, rng, 1, max_chain=1, weights=weights).operator for _ in range(10)}
    assert ops == {"causal_skip"}


def test_payoff_counts_wins_over_the_parent_once_per_individual():
    search = _search()
    parent = _judged(Individual(SEED.source, edits=[]), Status.PASS, 2_000_000, 0.2)
    better = _judged(_with_blocks(1024, 1024), Status.PASS, 300_000, 1.4)
    worse = _judged(_with_blocks(256, 512), Status.FAIL_CORRECTNESS, None, None)
    search.learn([parent, better, worse])
    search.learn([better])                                  # seen again as an elite: no double count
    assert search.credit["block_sizes"] == [4, 2]          # two chains of two block_sizes edits
    assert search.weights()["block_sizes"] == pytest.approx(3 / 6)


def test_the_surrogate_learns_that_bigger_blocks_are_faster_here():
    s = Surrogate(operator_names(), ["BLOCK_Q", "BLOCK_KV"], min_points=3)
    for q, kv, cycles in [(256, 256, 900_000), (512, 512, 400_000), (256, 1024, 700_000), (1024, 256, 600_000)]:
        ind = _with_blocks(q, kv)
        s.add(ind.id, ind.source, ind.edits, cycles)
    assert s.ready
    big, small = _with_blocks(1024, 1024), _with_blocks(256, 512)
    assert s.predict(big.source, big.edits) < s.predict(small.source, small.edits)


def test_only_a_kernel_that_passed_correctness_is_kept_or_crowned():
    search = _search()
    fast_unchecked = _judged(_with_blocks(1024, 1024), Status.PRUNED, 100, None)
    fast_wrong = _judged(_with_blocks(2048, 2048), Status.FAIL_CORRECTNESS, None, None)
    slow_right = _judged(_with_blocks(256, 512), Status.PASS, 2_000_000, 0.2)
    search.record([fast_unchecked, fast_wrong, slow_right])
    assert search.champion is slow_right and [i.id for i in search.hof] == [slow_right.id]
    assert fast_unchecked.fitness.values == (0.0,) and fast_wrong.fitness.values == (0.0,)
