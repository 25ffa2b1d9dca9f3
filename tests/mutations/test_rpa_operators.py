"""The operators on JAX's ragged paged attention, its own source read from the installed package at
test time (never copied here): its block sizes, keyword defaults of None that the module looks up
in its tuned table, and its page copies past each sequence's end (``copies_in_need``), judged on
v6e at the seed's small mixed batch."""

from __future__ import annotations

import random

import pytest

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from evolve.start.resolve import resolve_start
from mutations import Edit, get_operator, replay
from seeds import load_seed
from tests.judging import judge_all

SMALL = "S=3,PREFILL=13,HQ=8,HKV=2,D=128,PAGE=16,LEN=64"
BLOCKS = Edit("block_sizes", {"shape": {"num_kv_pages_per_block": 2, "num_queries_per_block": 8}})


@pytest.fixture(scope="module")
def case():
    seed = load_seed("ragged_paged_attention")
    return seed.task(SMALL), resolve_start("jax", seed).source


def test_a_first_block_move_gives_every_none_default_a_value(case):
    task, source = case
    op = get_operator("block_sizes")
    result = op.apply(source, task, random.Random(0))
    assert result.applied, result.reason
    shape = result.edit.params["shape"]
    assert set(shape) == {"num_kv_pages_per_block", "num_queries_per_block"}
    assert f"num_kv_pages_per_block: int | None = {shape['num_kv_pages_per_block']}," in result.source
    # It starts where the module's own lookup would (its tuned table's entry, via the task) and
    # moves one of them: a neighbour of the tuned blocks, not a random pair.
    looked = {"num_kv_pages_per_block": task.looked_up("NUM_KV_PAGES_PER_BLOCK"),
              "num_queries_per_block": task.looked_up("NUM_QUERIES_PER_BLOCK")}
    assert looked == {"num_kv_pages_per_block": 4, "num_queries_per_block": 16}
    for rng_seed in range(6):
        shape = op.apply(source, task, random.Random(rng_seed)).edit.params["shape"]
        assert sum(shape[n] != looked[n] for n in shape) == 1, shape
    # One field alone would be overridden by the module's lookup of both: refused, with the reason.
    alone = op.apply_params(source, task, {"tunable": "num_queries_per_block", "value": 8})
    assert alone.status == "not_applicable" and "num_kv_pages_per_block would stay None" in alone.reason
    # Once both hold values, one moves alone.
    moved = op.apply(result.source, task, random.Random(1))
    assert moved.applied, moved.reason


def test_copies_in_need_guards_each_page_copy_once(case):
    task, source = case
    op = get_operator("copies_in_need")
    result = op.apply(source, task, random.Random(0))
    assert result.applied, result.reason
    added = [line.strip() for line in result.source.splitlines() if line not in source.splitlines()]
    assert added == [
        "self._async_copies_needed = []",
        "self._async_copies_needed.append(page_idx < end_page_idx)",
        "for async_copy_needed, async_copy in zip(self._async_copies_needed, self._async_copies):",
        "pl.when(async_copy_needed)(async_copy.start)",
        "for async_copy_needed, async_copy in zip(self._async_copies_needed, self._async_copies):",
        "pl.when(async_copy_needed)(async_copy.wait)",
    ]
    again = op.apply(result.source, task, random.Random(0))
    assert again.status == "not_applicable" and "already" in again.reason


def test_the_vmem_limit_lives_in_the_default_of_the_keyword_the_call_passes_on(case):
    task, source = case
    op = get_operator("vmem_limit")
    assert op.repair_params(source, task) == {"mib": 96}     # None: the compiler's own limit
    result = op.apply_params(source, task, {"mib": 96})
    assert result.applied, result.reason
    assert "vmem_limit_bytes: int | None = 96 * 1024 * 1024," in result.source
    assert op.repair_params(result.source, task) is None


@pytest.fixture(scope="module")
def verdicts(case, tmp_path_factory):
    task, source = case
    blocks = replay(source, [BLOCKS], task)
    guarded = replay(blocks.source, [Edit("copies_in_need")], task)
    limited = replay(blocks.source, [Edit("vmem_limit", {"mib": 48})], task)
    assert blocks.applied and guarded.applied and limited.applied
    judge = Judge(JudgeConfig(chip="v6e", cache_dir=str(tmp_path_factory.mktemp("rpa-ops")), workers=2))
    return judge_all(judge, [blocks.source, guarded.source, limited.source], task)


def test_all_pass_the_judge_and_the_guarded_copies_move_fewer_bytes(verdicts):
    blocks, guarded, _ = verdicts
    for r in verdicts:
        assert r.status is Status.PASS, r.error
    # 2-page blocks of 16-token pages over caches up to 64: the short sequences' second page was
    # copied for nothing (a dummy page); counted as they ran on the timing input, it is gone.
    assert guarded.metrics.hbm_bytes < blocks.metrics.hbm_bytes
