"""`evolve ablate --json` on a tiny task: a row per operator (those that need another operator
first on top of it), the grid row of all operators together, JAX's kernels, with provenance."""

from __future__ import annotations

import json

from mutations import operator_names
from tests.cli_runs import evolve


def test_ablate_json_has_every_operator_the_grid_and_jax(tmp_path):
    r = evolve("ablate", "--shape", "B=1,H=2,N=256,D=128", "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    labels = [row["label"] for row in rows]
    assert labels[0] == "seed"
    for row in rows:
        assert {"label", "edits", "status", "estimated_cycles", "latency_s", "speedup_vs_reference",
                "timing_source", "chip", "libtpu_version"} <= set(row)
        assert row["timing_source"] == "compiler_estimate+hbm+trips" and row["chip"] == "v5e"
    by_op = {row["edits"][-1]["op"]: row for row in rows if row["label"].startswith("seed + ")}
    # Every operator that applies to flash attention (directly or after another); the decode
    # operators, RPA's copies_in_need and the operators for other kernels (no epilogue in the entry,
    # no reduction in the output block, every input follows both batch and heads, no transposed or f32
    # matmul operand, no input fetched once) say "not applicable" and get no row.
    assert set(by_op) == set(operator_names()) - {"grouped_heads", "length_skip", "split_kv", "chip_split",
                                                 "copies_in_need", "fuse_epilogue", "fuse_reduction", "accumulator",
                                                 "grid_order", "mxu_operands", "buffering"}
    # diagonal_strips and approx_reciprocal do not apply to the seed: each sits on its prerequisite.
    assert by_op["diagonal_strips"]["label"] == "seed + causal_skip + diagonal_strips"
    assert by_op["approx_reciprocal"]["label"] == "seed + deferred_norm + approx_reciprocal"
    grid = [row for row in rows if row["label"].startswith("all operators together")]
    assert len(grid) == 1 and grid[0]["status"] == "PASS"
    assert {"causal_skip", "deferred_norm", "exp2_softmax"} <= {e["op"] for e in grid[0]["edits"]}
    # The grid's best, then (when dropping an operator pays) the same without it: the fastest row.
    lean = [row for row in rows if row["label"].startswith("the grid's best without")]
    assert len(lean) <= 1
    best = lean[0] if lean else grid[0]
    if lean:
        assert best["estimated_cycles"] < grid[0]["estimated_cycles"]
        assert len(best["edits"]) < len(grid[0]["edits"])
    passed = [row for row in rows if row["status"] == "PASS" and not row["label"].startswith("JAX")]
    assert best["estimated_cycles"] <= min(row["estimated_cycles"] for row in passed)
    assert {"JAX flash_attention (default blocks)", "JAX flash_attention (tuned blocks)"} <= set(labels)


def test_leave_one_out_drops_exactly_the_edits_that_do_not_pay():
    """Unit test (a stand-in executor scoring by the operators present): compact_scratch and
    vmem_limit cost time here, the rest pays; both are dropped, nothing else is."""
    import dataclasses

    from evaluator.result import EvalResult, Metrics, Status
    from evolve.experiments.ablation import Entry, drop_what_does_not_pay
    from mutations import Edit
    from mutations._replay import replay_applicable
    from seeds.flash_attention.task import AttentionTask
    from tests.mutations.kernel_check import seed_source

    task = AttentionTask(heads=2, seq_len=256)
    cost = {"compact_scratch": +10, "vmem_limit": +5, "causal_skip": -30, "deferred_norm": -20}

    class StandIn:
        def judge_all(self, judge, task, sources, cut=None):
            return [self.score(s) for s in sources]

        def score(self, source):
            edits = by_source[source]
            cycles = 100 + sum(cost.get(e.op, 0) for e in edits)
            return EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=cycles, speedup_vs_reference=100 / cycles))

    by_source = {}
    chain = [Edit("compact_scratch"), Edit("causal_skip"), Edit("deferred_norm"), Edit("vmem_limit", {"mib": 64}),
             Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 256})]
    for i in range(len(chain)):   # every chain that leaving edits out can produce
        for j in range(i, len(chain)):
            for k in range(j, len(chain) + 1):
                for subset in ([e for n, e in enumerate(chain) if n not in (i, j, k)],):
                    source, kept = replay_applicable(seed_source(), subset, task)
                    by_source[source] = kept
    source, kept = replay_applicable(seed_source(), chain, task)
    by_source[source] = kept
    start = Entry("grid", tuple(kept), source, StandIn().score(source))
    best, dropped = drop_what_does_not_pay(StandIn(), None, seed_source(), task, start)
    assert sorted(dropped) == ["compact_scratch", "vmem_limit"]
    assert [e.op for e in best.edits] == ["causal_skip", "deferred_norm", "block_sizes"]
    assert dataclasses.asdict(best.result.metrics)["estimated_cycles"] == 50
