"""The search's parts without a judge: multi-knob mutation, operator payoff, the surrogate, the
rule that only a kernel that passed correctness can be selected, kept or crowned, and the
steady-state loop (same run whatever order workers finish in; no worker waits for a straggler)."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from evaluator.result import EvalResult, Metrics, Status
from evolve.config import RunConfig, SearchConfig
from evolve.errors import UsageError
from evolve.executors.base import LocalExecutor
from evolve.search.individual import Individual
from evolve.search.loop import Search
from evolve.search.surrogate import Surrogate
from evolve.search.variation import mutate
from mutations import Edit, operator_names, read_tunables, replay
from seeds.flash_attention.task import AttentionTask

TASK = AttentionTask()
SEED = Individual(open("seeds/flash_attention/kernel.py").read(), edits=[])


def _search(**search) -> Search:
    config = RunConfig(search=SearchConfig(**search))
    return Search(config, SEED.source, TASK, evaluate=len, record=print)


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
    children = [mutate(SEED, TASK, rng, 1, max_chain=3) for _ in range(12)]
    # 1..3 edits, and one more when the last made another operator applicable.
    assert any(len(c.edits) > 1 for c in children) and all(1 <= len(c.edits) <= 4 for c in children)
    for c in children:
        assert replay(SEED.source, c.edits, TASK).source == c.source
        assert c.operator == "+".join(e["op"] for e in c.edits)


def test_operators_are_drawn_by_their_weights():
    rng = random.Random(0)
    weights = {name: 1e-9 for name in operator_names()} | {"causal_skip": 1.0}
    ops = {mutate(SEED, TASK, rng, 1, max_chain=1, weights=weights).operator for _ in range(10)}
    assert {op.split("+")[0] for op in ops} == {"causal_skip"}


def test_what_an_edit_makes_applicable_is_drawn_next_in_the_same_move():
    # diagonal_strips applies only after causal_skip, and pays only with it: drawn right after.
    rng = random.Random(0)
    weights = {name: 1e-9 for name in operator_names()} | {"causal_skip": 1.0}
    ops = [mutate(SEED, TASK, rng, 1, max_chain=1, weights=weights).operator for _ in range(40)]
    assert 0.6 < ops.count("causal_skip+diagonal_strips") / len(ops) < 0.95
    assert all(op.startswith("causal_skip") and op.count("+") <= 1 for op in ops)


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


def _fake_cycles(ind: Individual) -> int:
    """A deterministic stand-in for the estimate: bigger blocks and more edits are faster."""
    t = read_tunables(ind.source)
    return 4_000_000 // (t["BLOCK_Q"] * t["BLOCK_KV"] // 16384) + 100_000 // (1 + len(ind.edits))


def _steady_run(delays: dict, workers: int = 2, **search):
    """A steady-state run with a stand-in judge that takes delays[order] seconds for the
    order-th candidate submitted (or, for a callable, until it returns: it is given the
    generations of the items judged so far); returns the items in the order taken in, and the log."""
    log, lock, order, ended = [], threading.Lock(), iter(range(10_000)), []

    def evaluate(ind):
        with lock:
            n = next(order)
            log.append(("start", n, ind.id))
        delay = delays.get(n, 0.0)
        delay(ended) if callable(delay) else time.sleep(delay)
        with lock:
            log.append(("end", n, ind.id))
            ended.append(ind.generation)
        cycles = _fake_cycles(ind)
        return EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=cycles, speedup_vs_reference=1e6 / cycles))

    def record(ind, result):
        _judged(ind, result.status, result.metrics.estimated_cycles, result.metrics.speedup_vs_reference)

    config = RunConfig(search=SearchConfig(**{"population": 4, "generations": 3, "hall_of_fame": 1,
                                              "rng_seed": 5, "lag": 2 * workers, **search}))
    gens = []
    s = Search(config, SEED.source, TASK, evaluate=evaluate, record=record,
               on_generation=lambda g, pool, search: gens.append(g))
    with LocalExecutor(workers) as ex:
        champion = s.run(ex)
    return s, champion, log, gens


def test_the_steady_state_run_is_the_same_whatever_order_workers_finish_in():
    a, champ_a, _, gens = _steady_run({0: 0.3, 5: 0.2})       # a straggler early, one later
    b, champ_b, _, _ = _steady_run({1: 0.3, 2: 0.1, 6: 0.3})
    assert [(i.id, i.parent_ids, i.generation) for i in a.taken] == \
        [(i.id, i.parent_ids, i.generation) for i in b.taken]
    assert champ_a.id == champ_b.id and gens == [0, 1, 2, 3]
    assert len(a.taken) == 4 + 3 * 3 and len({i.id for i in a.taken}) == len(a.taken)
    assert [r["gen"] for r in a.logbook] == [0, 1, 2, 3] and a.logbook[-1]["best"] == champ_a.speedup


def test_no_worker_waits_for_a_straggler():
    # The first child (item 4, generation 1) is judged until another item of generation 2 has
    # been (at most 300 s): with lag 6 the other worker goes on with items 5..9, into generation 2,
    # while the straggler is out; a generational loop would idle until generation 1 was complete,
    # and the straggler would end first. (A wait on the event, not a fixed time: breeding's own
    # speed, slower under coverage or a busy machine, decides nothing.)
    def straggle(ended):
        deadline = time.monotonic() + 300
        while 2 not in ended and time.monotonic() < deadline:
            time.sleep(0.05)

    s, _, log, _ = _steady_run({4: straggle}, workers=2, lag=6)
    generation = {ind.id: ind.generation for ind in s.taken}
    straggler = next(i for kind, n, i in log if kind == "start" and n == 4)
    before = log[:log.index(("end", 4, straggler))]
    assert generation[straggler] == 1
    assert any(kind == "end" and generation[i] == 2 for kind, _, i in before), before


def test_the_logbook_has_the_generation_figures_of_the_kernels_that_passed():
    from evolve.search.loop import make_statistics

    pool = [_judged(_with_blocks(256, 256), Status.PASS, 900_000, 1.0),
            _judged(_with_blocks(512, 512), Status.PASS, 400_000, 2.0),
            _judged(_with_blocks(1024, 1024), Status.PASS, 300_000, 4.0),
            _judged(_with_blocks(2048, 2048), Status.FAIL_VMEM, None, None)]
    assert make_statistics().compile(pool) == {"best": 4.0, "median": 2.0, "pass_rate": 0.75}
    assert make_statistics().compile(pool[3:]) == {"best": None, "median": None, "pass_rate": 0.0}


def test_a_closed_generation_is_archived_and_logged_from_its_logbook_record(tmp_path):
    """EvolutionRun.on_generation: the search's logbook record is the one source of the
    archive's generation record and of the MLflow metrics."""
    from types import SimpleNamespace

    from archive import Archive
    from evolve.run import EvolutionRun

    s, champion, _, _ = _steady_run({})
    logged = []
    run = SimpleNamespace(run_id="r1", archive=Archive(tmp_path),
                          tracker=SimpleNamespace(log_generation_stats=lambda g, stats: logged.append((g, stats))))
    EvolutionRun.on_generation(run, 3, s.pool(), s)
    record = dict(s.logbook[-1])
    assert record["gen"] == 3 and record["best"] == champion.speedup and record["evals"] == len(s.taken)
    assert logged == [(3, record)]
    stored = run.archive.generations("r1").iloc[0]
    assert stored["stats"] == record and stored["hall_of_fame_ids"] == [i.id for i in s.hof]


def test_replaying_a_recombined_history_drops_the_edits_that_do_nothing():
    from mutations._replay import replay_applicable

    edits = [{"op": "block_sizes", "params": {"tunable": "BLOCK_Q", "value": 256}},
             {"op": "no_such_operator", "params": {}},                              # unknown: dropped
             {"op": "block_sizes", "params": {"tunable": "BLOCK_Q", "value": 256}},  # no change: dropped
             {"op": "block_sizes", "params": {"tunable": "BLOCK_KV", "value": 512}}]
    source, kept = replay_applicable(SEED.source, edits, TASK)
    assert kept == [edits[0], edits[3]]
    assert read_tunables(source) == {"BLOCK_Q": 256, "BLOCK_KV": 512}
    assert replay(SEED.source, kept, TASK).source == source


def test_the_first_population_covers_every_legal_size_of_each_block():
    from evolve.search.variation import block_shapes

    for rng_seed in range(3):
        children = block_shapes(SEED, TASK, random.Random(rng_seed), 5, max_chain=1)
        sizes = [(read_tunables(c.source)["BLOCK_Q"], read_tunables(c.source)["BLOCK_KV"]) for c in children]
        legal = set(TASK.legal_values("BLOCK_Q"))          # 128..2048; the seed is 128 x 128
        assert {q for q, _ in sizes} | {128} == legal and {kv for _, kv in sizes} | {128} == legal
        assert len(set(sizes)) == 5


def test_the_first_shapes_carry_every_operator_that_applies_and_replay():
    """Stacked children: each of the first ``stacked`` shapes (the rank-paired ones) carries every
    other operator that applies, once each, prerequisites first (causal_skip before diagonal
    strips): a multi-step kernel whose first step alone does not pay is judged in the first
    population. Those after them do not."""
    from evolve.search.loop import search_operators
    from evolve.search.variation import block_shapes

    ops = search_operators("v5e")
    for rng_seed in range(3):
        children = block_shapes(SEED, TASK, random.Random(rng_seed), 6, max_chain=3, operators=ops, stacked=4)
        for child in children[:4]:
            used = {e["op"] for e in child.edits}
            assert {"causal_skip", "diagonal_strips", "deferred_norm", "approx_reciprocal"} <= used, used
            assert len(used) == len(child.edits) - 1            # one edit each; two for the block shape
            left = [op.name for op in ops if op.name not in used and op.check(child.source, TASK)]
            assert left == [], left                              # nothing that applies was left out
            assert replay(SEED.source, [Edit.from_dict(e) for e in child.edits], TASK).source == child.source
        assert all(len(c.edits) < len(children[0].edits) for c in children[4:])
        q = [read_tunables(c.source)["BLOCK_Q"] for c in children[:4]]
        assert sorted(q) == [256, 512, 1024, 2048]               # the shapes paired by rank


def test_a_child_that_failed_for_want_of_vmem_is_repaired_next():
    search = _search()
    big = _judged(_with_blocks(2048, 2048), Status.FAIL_VMEM, None, None)
    search.record([big])
    child = search.breed_one(10, 1)
    assert child.parent_ids == (big.id,) and child.operator == "vmem_limit"
    assert child.edits == big.edits + [{"op": "vmem_limit", "params": {"mib": 96}}]
    assert read_tunables(child.source)["VMEM_LIMIT_BYTES"] == 96 * 1024 * 1024
    assert search.repairs == [] and child.id in search.seen
    # Repaired at the largest limit already: nothing left to repair, the next child is bred.
    search.record([_judged(child, Status.FAIL_VMEM, None, None)])
    assert search.repair(1) is None
    # Over the chip's VMEM itself (not the scoped limit): no limit lifts it, so no repair is judged.
    over = _judged(_with_blocks(2048, 1024), Status.FAIL_VMEM, None, None)
    over.result = EvalResult(Status.FAIL_VMEM, error="RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out "
                             "of memory in memory space vmem. Used 141.12M of 128.00M vmem. Exceeded vmem capacity "
                             "by 13.12M.")
    search.record([over])
    assert search.repair(1) is None


def test_a_square_block_also_steps_as_a_square():
    """Equal sizes of a block shape move a step together (block_q = block_k_major = 1024 to 2048,
    block_k kept): the local step offers it beside the one-size steps."""
    from evolve.search.variation import tied_steps
    from mutations import get_operator

    source, task = _jax_flash_attention()
    shape = {"block_q": 1024, "block_k_major": 1024, "block_k": 512}
    steps = [p["shape"] for p in tied_steps(get_operator("block_sizes"), {"shape": shape}, source, task)]
    assert sorted(steps, key=lambda s: s["block_q"]) == [{"block_q": 512, "block_k_major": 512, "block_k": 512},
                                                          {"block_q": 2048, "block_k_major": 2048, "block_k": 512}]
    assert tied_steps(get_operator("block_sizes"), {"shape": {**shape, "block_q": 2048}}, source, task) == []
    edits = [Edit("block_sizes", {"shape": shape}), Edit("exp2_softmax", {})]
    champion = _judged(Individual(replay(source, edits, task).source, edits=[e.to_dict() for e in edits]),
                       Status.PASS, 150_000, 4.0)
    search = Search(RunConfig(search=SearchConfig(local_prob=1.0)), source, task, evaluate=len, record=print)
    search.record([champion])
    search.taken.append(champion)
    shapes = {json.dumps(p["shape"], sort_keys=True) for kind, i, p in search.moves(champion) if p}
    assert json.dumps({"block_q": 2048, "block_k_major": 2048, "block_k": 512}, sort_keys=True) in shapes


def test_the_pool_keeps_the_best_of_other_block_shapes_alive():
    search = _search(population=4, hall_of_fame=1, niches=1)
    best = _judged(_with_blocks(1024, 1024), Status.PASS, 150_000, 4.0)
    other_shape = _judged(_with_blocks(2048, 2048), Status.PASS, 250_000, 2.4)
    recent = [_judged(_with_blocks(q, kv), Status.PASS, 300_000, 2.0)
              for q, kv in [(512, 1024), (256, 1024), (1024, 512)]]
    for ind in [best, other_shape, *recent]:
        search.record([ind])
        search.taken.append(ind)
    pool = search.pool()
    # The champion (the hall of fame keeps a copy), then the next-best shape stays in reach.
    assert [i.id for i in pool] == [best.id, other_shape.id] + [i.id for i in recent[-2:]]
    assert [i.id for i in _search(population=4, hall_of_fame=1).pool()] == []


def test_a_kernel_that_failed_is_never_a_parent():
    search = _search(population=4, hall_of_fame=1, niches=0)
    best = _judged(_with_blocks(1024, 1024), Status.PASS, 150_000, 4.0)
    failed = [_judged(_with_blocks(q, q), status, None, None)
              for q, status in [(2048, Status.FAIL_VMEM), (512, Status.FAIL_CORRECTNESS)]]
    recent = _judged(_with_blocks(256, 1024), Status.PASS, 300_000, 2.0)
    for ind in [best, *failed, recent]:
        search.record([ind])
        search.taken.append(ind)
    assert [i.id for i in search.pool()] == [best.id, recent.id]
    # As runs were made before the rule: the latest items, failed or not, fill the pool.
    old = _search(population=4, hall_of_fame=1, niches=0, passed_parents=False)
    for ind in [best, *failed, recent]:
        old.record([ind])
        old.taken.append(ind)
    assert [i.id for i in old.pool()] == [best.id, *(i.id for i in failed), recent.id]


def test_a_tweak_moves_one_edit_to_its_nearest_other_value():
    from evolve.search.variation import tweak_edit

    edits = [Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 1024}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 1024}),
             Edit("causal_skip", {}), Edit("diagonal_strips", {"strip": 256}), Edit("exp2_softmax", {})]
    parent = Individual(replay(SEED.source, edits, TASK).source, edits=[e.to_dict() for e in edits])
    moved = {}
    for seed in range(24):
        child = tweak_edit(parent, SEED.source, TASK, random.Random(seed), 1)
        assert child.operator == "tweak" and child.parent_ids == (parent.id,)
        assert child.source == replay(SEED.source, child.edits, TASK).source
        changed = [(a, b) for a, b in zip(parent.edits, child.edits) if a != b]
        assert len(changed) == 1 and len(child.edits) == len(parent.edits)   # one edit, in its place
        (before, after), = changed
        moved.setdefault(json.dumps(before, sort_keys=True), set()).add(json.dumps(after["params"], sort_keys=True))
    # Only edits with parameters move, each to a neighbour: one step of log2 either way, the same tunable.
    assert {json.loads(k)["op"] for k in moved} == {"block_sizes", "diagonal_strips"}
    strips = moved[json.dumps(edits[3].to_dict(), sort_keys=True)]
    assert strips == {'{"strip": 128}', '{"strip": 512}'}
    q = moved[json.dumps(edits[0].to_dict(), sort_keys=True)]
    assert q <= {'{"tunable": "BLOCK_Q", "value": 512}', '{"tunable": "BLOCK_Q", "value": 2048}'} and q
    # Nothing to move: no child.
    plain = Individual(replay(SEED.source, [Edit("causal_skip", {})], TASK).source,
                       edits=[{"op": "causal_skip", "params": {}}])
    assert tweak_edit(plain, SEED.source, TASK, random.Random(0), 1) is None


def test_the_surrogate_sees_a_square_block_apart_from_its_sides():
    pairs = [("BLOCK_Q", "BLOCK_KV")]
    s = Surrogate(operator_names(), ["BLOCK_Q", "BLOCK_KV"], min_points=3, pairs=pairs)
    flat = Surrogate(operator_names(), ["BLOCK_Q", "BLOCK_KV"], min_points=3)
    # Square blocks are fast, any non-square one slow: no weighting of the two sizes says so.
    for q, kv in [(256, 256), (512, 512), (1024, 1024), (256, 1024), (1024, 256), (512, 2048), (2048, 512)]:
        ind = _with_blocks(q, kv)
        for model in (s, flat):
            model.add(ind.id, ind.source, ind.edits, 100_000 if q == kv else 400_000)
    square, skewed = _with_blocks(2048, 2048), _with_blocks(256, 512)
    assert s.predict(square.source, square.edits) < s.predict(skewed.source, skewed.edits)
    assert flat.predict(square.source, square.edits) > flat.predict(skewed.source, skewed.edits)


def test_a_drop_undoes_one_edit_and_what_needed_it():
    from evolve.search.variation import drop_edit

    edits = [Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 1024}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 1024}),
             Edit("causal_skip", {}), Edit("diagonal_strips", {"strip": 256}), Edit("exp2_softmax", {})]
    parent = Individual(replay(SEED.source, edits, TASK).source, edits=[e.to_dict() for e in edits])
    children = {}
    for seed in range(40):
        child = drop_edit(parent, SEED.source, TASK, random.Random(seed), 1)
        children[child.params["dropped"]["op"] + str(child.params["dropped"]["params"])] = child
    assert len(children) == 5
    no_skip = children["causal_skip{}"]     # the strips need causal_skip: they go with it
    assert [e["op"] for e in no_skip.edits] == ["block_sizes", "block_sizes", "exp2_softmax"]
    no_exp2 = children["exp2_softmax{}"]
    assert no_exp2.source == replay(SEED.source, edits[:4], TASK).source and no_exp2.parent_ids == (parent.id,)
    assert drop_edit(Individual(SEED.source, edits=[]), SEED.source, TASK, random.Random(0), 1) is None
    # Weighted by the operators' payoff: the edit of the operator that has paid least goes first.
    weights = {"block_sizes": 0.9, "causal_skip": 0.9, "diagonal_strips": 0.9, "exp2_softmax": 0.1}
    dropped = [drop_edit(parent, SEED.source, TASK, random.Random(seed), 1, weights=weights).params["dropped"]["op"]
               for seed in range(40)]
    assert dropped.count("exp2_softmax") > 20 and dropped.count("exp2_softmax") > 3 * dropped.count("causal_skip")


def test_a_run_stored_before_stacked_shapes_resumes_as_it_was_made():
    from evolve.config import RunConfig

    old = RunConfig().to_dict()
    del old["search"]["stacked"], old["search"]["weighted_drop"]   # a run stored before the keys existed
    assert RunConfig.stored(old).search.stacked == 0 and not RunConfig.stored(old).search.weighted_drop
    assert RunConfig.from_dict(old).search.stacked == SearchConfig.stacked == 4   # a new run's default
    assert RunConfig.stored(RunConfig().to_dict()) == RunConfig()


def test_the_local_step_walks_the_champion_s_neighbours_once_each():
    edits = [Edit("block_sizes", {"tunable": "BLOCK_Q", "value": 1024}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 1024}),
             Edit("causal_skip", {}), Edit("diagonal_strips", {"strip": 256}), Edit("exp2_softmax", {})]
    champion = Individual(replay(SEED.source, edits, TASK).source, edits=[e.to_dict() for e in edits])
    search = _search(local_prob=1.0)        # every child is a neighbour of the champion while any is left
    search.record([_judged(champion, Status.PASS, 150_000, 4.0)])
    search.taken.append(champion)
    bred = [search.breed_one(10 + k, 1) for k in range(12)]
    near, after = bred[:11], bred[11]
    moves = sorted((c.operator, json.dumps(c.params["dropped"] if c.operator == "drop" else c.params["to"],
                                           sort_keys=True)) for c in near)
    # Each edit dropped (the strips go with causal_skip), each parameter one step either way, once.
    assert [m for m in moves if m[0] == "drop"] == sorted(("drop", json.dumps(e.to_dict(), sort_keys=True))
                                                         for e in edits)
    assert {m[1] for m in moves if m[0] == "tweak"} == {
        '{"tunable": "BLOCK_Q", "value": 512}', '{"tunable": "BLOCK_Q", "value": 2048}',
        '{"tunable": "BLOCK_KV", "value": 512}', '{"tunable": "BLOCK_KV", "value": 2048}',
        '{"strip": 128}', '{"strip": 512}'}
    assert len({c.id for c in near}) == 11 and all(c.parent_ids == (champion.id,) for c in near)
    for c in near:
        assert c.source == replay(SEED.source, c.edits, TASK).source
    # The neighbourhood spent: the child is bred by the other moves.
    assert after is not None and after.id not in {c.id for c in near} and search.near[(True, champion.id)] == []


def _jax_flash_attention():
    """JAX's installed flash attention (read at test time) and its task, as --start jax gives them."""
    from evolve.config import TaskConfig
    from evolve.start.resolve import resolve_start

    config = TaskConfig(seed="flash_attention", start="jax")
    return resolve_start("jax", config.load_seed()).source, config.task()


def test_a_block_shape_s_tweak_moves_one_size_a_step():
    from evolve.search.variation import nearest, shape_steps
    from mutations import get_operator

    source, task = _jax_flash_attention()
    shape = {"block_q": 2048, "block_k_major": 2048, "block_k": 2048}
    edit = Edit("block_sizes", {"shape": shape})
    parent = Individual(replay(source, [edit], task).source, edits=[edit.to_dict()])
    steps = [p["shape"] for p in shape_steps(get_operator("block_sizes"), edit.params, source, task)]
    # Each size a step down (2048 is the largest legal); block_k_major alone would no longer hold block_k.
    def key(shape):
        return json.dumps(shape, sort_keys=True)

    assert sorted(map(key, steps)) == sorted(map(key, [{**shape, "block_q": 1024}, {**shape, "block_k": 1024}]))
    # The tweak's nearest values are those steps, whatever the operator's draws (which redraw the shape).
    near = [p["shape"] for p in nearest(parent, 0, source, task, random.Random(0))]
    assert sorted(map(key, near)) == sorted(map(key, steps))
    # An edit of one tunable (our seed's constants) has no shape to step.
    assert shape_steps(get_operator("block_sizes"), {"tunable": "BLOCK_Q", "value": 1024}, SEED.source, TASK) == []
    assert shape_steps(get_operator("causal_skip"), {"shape": shape}, source, task) == []


def test_the_local_step_also_walks_the_best_of_another_block_shape():
    source, task = _jax_flash_attention()

    def kernel(q: int, k_major: int, k: int, cycles: int) -> Individual:
        edits = [Edit("block_sizes", {"shape": {"block_q": q, "block_k_major": k_major, "block_k": k}}),
                 Edit("exp2_softmax", {})]
        result = replay(source, edits, task)
        assert result.status == "applied", result.reason
        ind = Individual(result.source, edits=[e.to_dict() for e in edits])
        return _judged(ind, Status.PASS, cycles, 1e6 / cycles)

    search = Search(RunConfig(search=SearchConfig(local_prob=1.0, niches=1, walk_within=1.5)), source, task,
                    evaluate=len, record=print)
    champion, other = kernel(1024, 1024, 1024, 150_000), kernel(2048, 2048, 2048, 200_000)
    for ind in (champion, other):
        search.record([ind])
        search.taken.append(ind)
    bred = [search.breed_one(10 + k, 1) for k in range(4)]
    assert [c.parent_ids for c in bred] == [(champion.id,), (other.id,), (champion.id,), (other.id,)]
    # The other shape's best moves its block shape a step (to a neighbouring cell: one size, or
    # its equal sizes together), nothing else.
    moved = {json.dumps(c.params["to"]["shape"], sort_keys=True) for c in bred[1::2]}
    assert len(moved) == 2 and moved <= {
        json.dumps({"block_q": 1024, "block_k_major": 2048, "block_k": 2048}, sort_keys=True),
        json.dumps({"block_q": 2048, "block_k_major": 2048, "block_k": 1024}, sort_keys=True),
        json.dumps({"block_q": 1024, "block_k_major": 1024, "block_k": 1024}, sort_keys=True)}
    assert all(c.edits[1:] == other.edits[1:] for c in bred[1::2])


def test_the_local_step_walks_another_shape_only_within_walk_within_of_the_champion():
    def walked_first(within: float, others: list[tuple[int, int]]) -> list[tuple]:
        search = _search(local_prob=1.0, niches=2, walk_within=within)
        champion = _judged(_with_blocks(1024, 1024), Status.PASS, 150_000, 4.0)
        for ind in [champion] + [_judged(_with_blocks(q, q), Status.PASS, cycles, 600_000 / cycles)
                                 for q, cycles in others]:
            search.record([ind])
            search.taken.append(ind)
        return [search.cell(search.walked()[0]) for _ in range(6)]

    champion, near, far = (1024, 1024), (512, 512), (2048, 2048)
    # 1.2x the champion's cycles is walked in its turn; 1.4x is not, under a bar of 1.3x: the
    # champion takes its turns (its moves are the ones that can still pay).
    assert walked_first(1.3, [(512, 180_000), (2048, 210_000)]) == [champion, near] * 3
    assert walked_first(1.3, [(2048, 210_000)]) == [champion] * 6
    # 0: any other shape's best is walked, as before the bar (runs stored before it resume so).
    assert walked_first(0, [(512, 180_000), (2048, 210_000)]) == [champion, near, champion, far, champion, near]
    assert RunConfig.stored({"search": {}}).search.walk_within == 0
    with pytest.raises(UsageError, match="walk_within"):
        SearchConfig(walk_within=0.5)


def test_a_small_population_shrinks_the_elites_and_niches_to_fit():
    """--population 2 runs (one elite, one niche, one child a generation); the defaults are 2 each
    from 3 on; a value the user sets that does not fit says which and how to fix it."""
    two = SearchConfig(population=2, generations=3)
    assert (two.hall_of_fame, two.niches, two.total()) == (1, 1, 5)
    assert (SearchConfig().hall_of_fame, SearchConfig().niches) == (2, 2)
    assert (SearchConfig(population=3, niches=0).hall_of_fame, SearchConfig(population=3, niches=0).niches) == (2, 0)
    with pytest.raises(UsageError, match=r"niches must be .* \(2\), got 3; lower it or raise --population"):
        SearchConfig(population=3, niches=3)
    with pytest.raises(UsageError, match=r"hall_of_fame .* \(2\), got 2; lower it or raise --population"):
        SearchConfig(population=2, hall_of_fame=2)
