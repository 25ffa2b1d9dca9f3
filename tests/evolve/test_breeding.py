"""What the search breeds: no kernel whose figure it already has (a VMEM limit decides only
whether a kernel fits), and a first population whose minor blocks split their majors."""

from __future__ import annotations

import random

from evaluator.result import EvalResult, Metrics, Status
from evolve.config import RunConfig, SearchConfig, TaskConfig
from evolve.search.individual import Individual
from evolve.search.loop import Search
from evolve.start.resolve import resolve_start
from evolve.search.variation import block_shapes, covering_shapes
from mutations import Edit, block_values, get_operator, replay
from seeds.flash_attention.task import AttentionTask

TASK = AttentionTask()
SEED = open("seeds/flash_attention/kernel.py").read()


def _kernel(*edits: Edit) -> Individual:
    result = replay(SEED, list(edits), TASK)
    assert result.status == "applied", result.reason
    return Individual(result.source, edits=[e.to_dict() for e in edits])


def _blocks(q: int, kv: int) -> list[Edit]:
    return [Edit("block_sizes", {"tunable": "BLOCK_Q", "value": q}),
            Edit("block_sizes", {"tunable": "BLOCK_KV", "value": kv})]


def _limit(mib: int) -> Edit:
    return Edit("vmem_limit", {"mib": mib})


def test_kernels_that_differ_only_in_their_vmem_limit_share_a_fit_key():
    op = get_operator("vmem_limit")
    keys = {op.fit_key(_kernel(*_blocks(1024, 1024), *([_limit(m)] if m else [])).source, TASK)
            for m in (0, 16, 48, 96)}
    assert len(keys) == 1
    assert op.fit_key(_kernel(*_blocks(1024, 512)).source, TASK) not in keys
    # An operator that changes the figure has none: its key is the source itself.
    assert get_operator("exp2_softmax").fit_key(SEED, TASK) == SEED


def test_no_child_differs_from_a_bred_kernel_only_in_its_vmem_limit():
    search = Search(RunConfig(), SEED, TASK, evaluate=len, record=print)
    bred = search.bred(_kernel(*_blocks(1024, 1024), _limit(16)))
    assert not search.new(bred)
    assert not search.new(_kernel(*_blocks(1024, 1024), _limit(48)))      # its figure is known
    assert not search.new(_kernel(*_blocks(1024, 1024)))
    assert search.new(_kernel(*_blocks(1024, 512), _limit(48)))
    off = Search(RunConfig(search=SearchConfig(fit_keys=False)), SEED, TASK, evaluate=len, record=print)
    off.bred(_kernel(*_blocks(1024, 1024), _limit(16)))
    assert off.new(_kernel(*_blocks(1024, 1024), _limit(48)))


def test_a_kernel_that_did_not_fit_is_still_repaired_and_the_local_step_skips_limits():
    search = Search(RunConfig(search=SearchConfig(local_prob=1.0)), SEED, TASK, evaluate=len, record=print)
    big = search.bred(_kernel(*_blocks(2048, 2048)))
    big.result = EvalResult(Status.FAIL_VMEM)
    big.fitness.values = (0.0,)
    search.record([big])
    repaired = search.breed_one(10, 1)
    assert repaired.operator == "vmem_limit" and repaired.parent_ids == (big.id,)
    # The champion's limit is one of its knobs: the local step moves its other edits only.
    champion = search.bred(_kernel(*_blocks(1024, 1024), Edit("causal_skip", {}), _limit(32)))
    champion.result = EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=150_000, speedup_vs_reference=4.0))
    champion.fitness.values = (4.0,)
    search.record([champion])
    search.taken.append(champion)
    for k in range(6):
        child = search.breed_one(11 + k, 1)
        assert child is not None and not (child.operator == "tweak" and child.params["edit"]["op"] == "vmem_limit")
        assert [e for e in child.edits if e["op"] != "vmem_limit"] != \
            [e for e in champion.edits if e["op"] != "vmem_limit"]


def test_the_first_shapes_pair_each_minor_block_below_its_major():
    config = TaskConfig(seed="flash_attention", start="jax")
    source, task = resolve_start("jax", config.load_seed()).source, config.task()
    seed = Individual(source, edits=[])
    for rng_seed in range(3):
        children = block_shapes(seed, task, random.Random(rng_seed), 4)
        shapes = {tuple(block_values(c.source, task).values()) for c in children}
        # (block_q, block_k_major, block_k): the seed's 128 cube scaled, block_k a size below
        assert shapes == {(256, 256, 128), (512, 512, 256), (1024, 1024, 512), (2048, 2048, 1024)}, shapes
    # Where no block is another's minor (our seed), the ranked shapes are the seed's scaled.
    values = [[128, 256, 512], [128, 256, 512]]
    assert set(covering_shapes(values, (128, 128), random.Random(0))[:2]) == {(256, 256), (512, 512)}
    assert set(covering_shapes(values, (128, 128), random.Random(0), {1: 0})[:2]) == {(256, 128), (512, 256)}


class _Ranker:
    """A stand-in surrogate (a unit test's): it ranks a kernel by its BLOCK_Q, larger first, and
    remembers what it was asked to rank in each step."""
    ready = True

    def __init__(self):
        self.asked: list[list[str]] = []

    def predict(self, source, edits):
        self.asked[-1].append(source)
        return -block_values(source, TASK)["BLOCK_Q"]

    def add(self, *args):
        pass


def test_the_local_step_ranks_its_moves_by_the_surrogate_and_loses_no_move():
    search = Search(RunConfig(search=SearchConfig(local_prob=1.0, oversample=3)), SEED, TASK,
                    evaluate=len, record=print)
    champion = search.bred(_kernel(*_blocks(512, 512), Edit("exp2_softmax", {})))
    champion.result = EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=150_000, speedup_vs_reference=4.0))
    champion.fitness.values = (4.0,)
    search.record([champion])
    search.taken.append(champion)
    search.surrogate = ranker = _Ranker()
    children = []
    for k in range(12):
        ranker.asked.append([])
        child = search.local(random.Random(k), 1)
        if child is None:
            break
        children.append(search.bred(child))
        ranked = ranker.asked[-1]
        if ranked:                  # (the last move, drawn alone, is not ranked)
            assert child.source == min(ranked, key=lambda s: -block_values(s, TASK)["BLOCK_Q"]), \
                "the move is the fastest ranked of those drawn"
    assert any(len(asked) > 1 for asked in ranker.asked), "no step ranked two moves"
    # Every one-step move is bred once, whatever was ranked above it: three drops, and BLOCK_Q and
    # BLOCK_KV each a step down and a step up.
    shapes = sorted((c.operator, tuple(block_values(c.source, TASK).values())) for c in children)
    assert [op for op, _ in shapes].count("drop") == 3
    assert [s for op, s in shapes if op == "tweak"] == [(256, 512), (512, 256), (512, 1024), (1024, 512)]
    # Off (and for runs stored before it, which resume as they ran), the first move drawn is bred.
    assert RunConfig.stored({"search": {}}).search.ranked_local is False
    off = Search(RunConfig(search=SearchConfig(local_prob=1.0, ranked_local=False)), SEED, TASK,
                 evaluate=len, record=print)
    off.champion = champion
    off.taken.append(champion)
    off.surrogate = ranker = _Ranker()
    ranker.asked.append([])
    assert off.local(random.Random(0), 1) is not None and ranker.asked == [[]]
