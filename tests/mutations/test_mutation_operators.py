"""Behaviour of each operator that is not about the text it writes: where it must not apply (and
why), the parameters it samples, what it reads back, how it composes. The rewritten text itself
is compared whole in test_operator_outputs.py; the contract every operator keeps, in
test_operator_contract.py."""

from __future__ import annotations

import dataclasses
import difflib
import json
import random

from mutations import Applicability, Edit, get_operator, read_tunables, replay
from seeds.flash_attention.task import AttentionTask

from .seed_cases import seed_case
from .snippets import MINI

CAUSAL = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=True)
FULL = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=False)
ATTENTION = seed_case("flash_attention")             # the seed at its default (causal) task
DECODE = seed_case("flash_decoding", "small")         # grouped query heads: H=4, HKV=2


def apply(name: str, source: str = MINI, task=CAUSAL, **params) -> str:
    result = get_operator(name).apply_params(source, task, params)
    assert result.status == "applied", result.reason
    return result.source


def not_applicable(name: str, source: str = MINI, task=CAUSAL) -> str:
    op = get_operator(name)
    applicability = op.check(source, task)
    assert isinstance(applicability, Applicability) and not applicability.ok
    assert applicability.reason
    result = op.apply(source, task, random.Random(0))
    assert result.status == "not_applicable" and result.source == source and result.reason
    return applicability.reason


def changed_lines(before: str, after: str) -> list[str]:
    """The lines a rewrite removed (-) and added (+)."""
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def seed_with(*edits: Edit, case=ATTENTION) -> str:
    result = replay(case.source, edits, case.task)
    assert result.status == "applied", result.reason
    return result.source


# ---- block sizes ----------------------------------------------------------------------------
def test_block_sizes_before_after():
    before = "BLOCK_Q = 128  # rows\nBLOCK_KV = 128\n"
    after = get_operator("block_sizes").apply_params(before, CAUSAL, {"tunable": "BLOCK_KV", "value": 256})
    assert after.status == "applied"
    assert after.source == "BLOCK_Q = 128  # rows\nBLOCK_KV = 256\n"


def test_block_sizes_samples_only_legal_values():
    task = AttentionTask(batch=1, heads=6, seq_len=768, head_dim=128)
    source = "BLOCK_Q = 128\nBLOCK_KV = 128\nHEADS_PER_PROGRAM = 1\n"
    seen = set()
    for seed in range(150):
        result = get_operator("block_sizes").apply(source, task, random.Random(seed))
        assert result.status == "applied"
        params = result.edit.params
        moved = params["shape"].items() if "shape" in params else [(params["tunable"], params["value"])]
        if "shape" in params:    # the block shape scaled: both sequence blocks, never the heads
            assert params["shape"] == {"BLOCK_Q": 256, "BLOCK_KV": 256}
        for name, value in moved:
            seen.add((name, value))
            if name.startswith("BLOCK"):
                assert value % 128 == 0 and 768 % value == 0 and value != 128
            else:
                assert 6 % value == 0 and value != 1
    assert {v for n, v in seen if n == "BLOCK_Q"} == {256, 384, 768}
    assert {v for n, v in seen if n == "HEADS_PER_PROGRAM"} == {2, 3, 6}


def test_block_sizes_scales_the_block_shape_and_replays_it():
    task = AttentionTask(batch=1, heads=8, seq_len=2048, head_dim=128)
    source = "BLOCK_Q = 1024\nBLOCK_KV = 1024\nHEADS_PER_PROGRAM = 2\n"
    op = get_operator("block_sizes")
    shapes = {json.dumps(op.apply(source, task, random.Random(s)).edit.params.get("shape"), sort_keys=True)
              for s in range(40)}
    # 1024 -> 2048 or 512 together; 4096 is not legal at N=2048, so up is the only way but down.
    assert shapes - {"null"} == {json.dumps({"BLOCK_KV": 2048, "BLOCK_Q": 2048}, sort_keys=True),
                                 json.dumps({"BLOCK_KV": 512, "BLOCK_Q": 512}, sort_keys=True)}
    up = op.apply_params(source, task, {"shape": {"BLOCK_Q": 2048, "BLOCK_KV": 2048}})
    assert up.source == "BLOCK_Q = 2048\nBLOCK_KV = 2048\nHEADS_PER_PROGRAM = 2\n"
    illegal = op.apply_params(source, task, {"shape": {"BLOCK_Q": 4096, "BLOCK_KV": 4096}})
    assert illegal.status == "not_applicable" and "not legal" in illegal.reason


def test_block_sizes_not_applicable():
    assert "no module-level block-size constant" in not_applicable("block_sizes", "X = 1\n")
    # N=128: 128 is the only legal sequence block.
    assert "no other legal value" in not_applicable(
        "block_sizes", "BLOCK_Q = 128\n", AttentionTask(seq_len=128))
    # N not a multiple of the 128 tile.
    not_applicable("block_sizes", "BLOCK_Q = 128\n", AttentionTask(seq_len=200))
    illegal = get_operator("block_sizes").apply_params(MINI, CAUSAL, {"tunable": "BLOCK_Q", "value": 384})
    assert illegal.status == "not_applicable" and "legal values" in illegal.reason


def test_block_sizes_moves_the_split_count_of_a_split_kernel():
    split = seed_with(Edit("split_kv", {"splits": 4}), case=DECODE)
    assert read_tunables(split)["KV_SPLITS"] == 4
    moved = apply("block_sizes", split, DECODE.task, tunable="KV_SPLITS", value=16)
    assert changed_lines(split, moved) == ["-KV_SPLITS = 4", "+KV_SPLITS = 16"]


# ---- VMEM limit -----------------------------------------------------------------------------
def test_vmem_limit_reads_back_and_a_second_application_only_moves_the_constant():
    after = seed_with(Edit("vmem_limit", {"mib": 48}))
    assert read_tunables(after)["VMEM_LIMIT_BYTES"] == 48 * 1024 * 1024
    again = apply("vmem_limit", after, ATTENTION.task, mib=96)
    assert read_tunables(again)["VMEM_LIMIT_BYTES"] == 96 * 1024 * 1024
    assert [line.split("#")[0].strip() for line in changed_lines(after, again)] == [
        "-VMEM_LIMIT_BYTES = 48 * 1024 * 1024", "+VMEM_LIMIT_BYTES = 96 * 1024 * 1024"]
    assert get_operator("vmem_limit").apply_params(MINI, CAUSAL, {"mib": 1000}).status == "not_applicable"


def test_vmem_limit_gives_a_kernel_without_compiler_params_one():
    source = MINI.replace('compiler_params=pltpu.CompilerParams(\n            dimension_semantics=('
                          '"parallel", "parallel", "parallel", "arbitrary")),\n', "")
    assert source != MINI and "compiler_params" not in source
    out = apply("vmem_limit", source, mib=32)
    assert "compiler_params=pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT_BYTES)" in out
    assert "VMEM_LIMIT_BYTES = 32 * 1024 * 1024" in out
    assert "not one pltpu.CompilerParams" in not_applicable(
        "vmem_limit", source.replace("out_shape=", "compiler_params=dict(mosaic={}),\n        out_shape="))


# ---- compact scratch ------------------------------------------------------------------------
def test_compact_scratch_applies_once():
    assert "already" in not_applicable("compact_scratch", apply("compact_scratch"))


def test_compact_scratch_not_applicable_on_other_layouts():
    source = MINI.replace("pltpu.VMEM((block_q, STATS_LANES), jnp.float32)",
                          "pltpu.VMEM((block_q, 8), jnp.float32)")
    assert "expected STATS_LANES" in not_applicable("compact_scratch", source)
    assert "pallas_call" in not_applicable("compact_scratch", "x = 1\n")


# ---- deferred normalisation -----------------------------------------------------------------
def test_deferred_norm_applies_once():
    assert "already deferred" in not_applicable("deferred_norm", apply("deferred_norm"))


def test_deferred_norm_needs_alpha():
    source = MINI.replace("alpha = jnp.exp(m_prev - m_next)", "alpha = jnp.exp(m_prev) / jnp.exp(m_next)")
    assert "alpha" in not_applicable("deferred_norm", source)


# ---- causal skip ----------------------------------------------------------------------------
def test_causal_skip_applies_once():
    assert "already" in not_applicable("causal_skip", apply("causal_skip"))


def test_causal_skip_not_applicable():
    assert "not causal" in not_applicable("causal_skip", MINI, FULL)
    no_mask = MINI.replace("if causal:  # mask above the diagonal", "if False:")
    assert "if causal" in not_applicable("causal_skip", no_mask)


# ---- diagonal strips ------------------------------------------------------------------------
def test_diagonal_strips_is_a_knob_after_the_first_application():
    after = seed_with(Edit("causal_skip"), Edit("diagonal_strips", {"strip": 256}))
    again = apply("diagonal_strips", after, ATTENTION.task, strip=512)
    assert [line.split("#")[0].strip() for line in changed_lines(after, again)] == [
        "-DIAGONAL_STRIP = 256", "+DIAGONAL_STRIP = 512"]


def test_diagonal_strips_not_applicable():
    assert "causal_skip first" in not_applicable("diagonal_strips", MINI)
    assert "not causal" in not_applicable("diagonal_strips", apply("causal_skip"), FULL)
    strips = apply("diagonal_strips", apply("causal_skip"), strip=256)
    assert "one head per program" in not_applicable("head_coarsening", strips)


# ---- head coarsening ------------------------------------------------------------------------
def test_head_coarsening_reads_back_and_applies_once():
    after = seed_with(Edit("head_coarsening", {"heads_per_program": 2}))
    assert read_tunables(after)["HEADS_PER_PROGRAM"] == 2
    assert "already" in not_applicable("head_coarsening", after, ATTENTION.task)


def test_head_coarsening_needs_the_one_head_layout():
    returned = MINI.replace("    return pl.pallas_call(", "    out = pl.pallas_call(")
    assert "return pl.pallas_call" in not_applicable("head_coarsening", returned)
    strided = MINI.replace("(1, 1, block_kv, head_dim)", "(1, 2, block_kv, head_dim)")
    assert "(1, 1, block, head_dim)" in not_applicable("head_coarsening", strided)


def test_head_coarsening_checks_the_task_heads():
    assert "no more than one head per program" in not_applicable("head_coarsening", MINI, AttentionTask(heads=1))
    assert "no more than one head per program" in not_applicable("head_coarsening", MINI, AttentionTask(heads=11))
    bad = get_operator("head_coarsening").apply_params(MINI, AttentionTask(heads=6), {"heads_per_program": 4})
    assert bad.status == "not_applicable"
    sampled = {get_operator("head_coarsening").sample_params(MINI, AttentionTask(heads=6), random.Random(seed))
               ["heads_per_program"] for seed in range(20)}
    assert sampled == {2, 3, 6}


# ---- exp2 softmax ---------------------------------------------------------------------------
def test_exp2_softmax_applies_once():
    assert "exp2" in not_applicable("exp2_softmax", apply("exp2_softmax"))


def test_exp2_softmax_needs_the_scaling():
    assert "sm_scale" in not_applicable("exp2_softmax", MINI.replace("    s = s * sm_scale\n", ""))


# ---- approximate reciprocal -------------------------------------------------------------------
def test_approx_reciprocal_applies_once():
    assert "already" in not_applicable("approx_reciprocal", apply("approx_reciprocal", apply("deferred_norm")))


def test_approx_reciprocal_needs_the_deferred_normalisation():
    assert "deferred_norm" in not_applicable("approx_reciprocal")


# ---- decode operators -------------------------------------------------------------------------
def test_length_skip_clamps_first_then_skips_compute():
    assert "per-sequence cache lengths" in not_applicable("length_skip", ATTENTION.source, ATTENTION.task)
    op = get_operator("length_skip")
    clamped = seed_with(Edit("length_skip", {"compute": False}), case=DECODE)
    assert op.apply_params(clamped, DECODE.task, {"compute": False}).status == "not_applicable"
    # Once the index maps are clamped, the only move left is skipping the compute too.
    assert {op.apply(clamped, DECODE.task, random.Random(s)).edit.params["compute"] for s in range(8)} == {True}
    both = apply("length_skip", clamped, DECODE.task, compute=True)
    assert both == seed_with(Edit("length_skip", {"compute": True}), case=DECODE)
    assert "already" in not_applicable("length_skip", both, DECODE.task)


def test_grouped_heads_needs_grouped_query_heads():
    decode = seed_case("flash_decoding")                 # H == HKV
    assert "no grouped query heads" in not_applicable("grouped_heads", decode.source, decode.task)
    assert "no grouped query heads" in not_applicable("grouped_heads", ATTENTION.source, ATTENTION.task)
    grouped = seed_with(Edit("grouped_heads"), case=DECODE)
    assert "already grouped" in not_applicable("grouped_heads", grouped, DECODE.task)


def test_split_kv_applies_once_and_keeps_exp2_out():
    split = seed_with(Edit("split_kv", {"splits": 4}), case=DECODE)
    assert "already split" in not_applicable("split_kv", split, DECODE.task)
    # exp2 after the split would leave the combine in natural-log units: refused. The other
    # order is fine (the combine follows the kernel's base: expected/split_kv__flash_decoding+exp2_softmax*).
    assert "natural-log" in not_applicable("exp2_softmax", split, DECODE.task)
    assert "the grid is not" in not_applicable("split_kv", ATTENTION.source, ATTENTION.task)


# ---- dimension semantics ------------------------------------------------------------------------
def _semantics_params(case, axis, semantics):
    return get_operator("dimension_semantics").apply_params(case.source, case.task,
                                                            {"axis": axis, "semantics": semantics})


def test_dimension_semantics_never_makes_a_reduction_axis_parallel():
    for case, kv_axis in ((ATTENTION, 3), (DECODE, 2)):
        refused = _semantics_params(case, kv_axis, "parallel")
        assert refused.status == "not_applicable" and f"branches on pl.program_id({kv_axis})" in refused.reason


def test_dimension_semantics_round_trips_an_independent_axis():
    """Batch is read as an index (lengths_ref[b]) in the decode kernel, not branched on: it may go
    back to parallel. The kv axis scopes the scratch, so attention's head axis may too. Each move
    keeps the parallel axes a prefix of the grid, so the axes behind go arbitrary first."""
    for case, axes in ((DECODE, (1, 0)), (ATTENTION, (2, 1))):
        inner = seed_with(Edit("dimension_semantics", {"axis": axes[0], "semantics": "arbitrary"}), case=case)
        serial = apply("dimension_semantics", inner, case.task, axis=axes[1], semantics="arbitrary")
        assert apply("dimension_semantics", serial, case.task, axis=axes[1], semantics="parallel") == inner


def test_dimension_semantics_keeps_the_parallel_axes_a_prefix():
    """Mosaic refuses parallel axes that are not a prefix of the grid: a middle axis never changes."""
    for axis, semantics in ((0, "arbitrary"), (1, "arbitrary")):
        refused = _semantics_params(ATTENTION, axis, semantics)
        assert refused.status == "not_applicable" and "only axis 2 can" in refused.reason
    op = get_operator("dimension_semantics")
    for i in range(30):
        params = op.sample_params(ATTENTION.source, ATTENTION.task, random.Random(i))
        assert params == {"axis": 2, "semantics": "arbitrary"}
    broken = ATTENTION.source.replace('("parallel", "parallel", "parallel", "arbitrary")',
                                      '("parallel", "arbitrary", "parallel", "arbitrary")')
    assert "do not form a prefix" in not_applicable("dimension_semantics", broken, ATTENTION.task)


def test_dimension_semantics_cannot_pay_on_one_tensorcore():
    from evaluator.chips import CHIPS
    from evolve.search.loop import search_operators

    op = get_operator("dimension_semantics")
    assert {name for name, chip in CHIPS.items() if op.pays_on(chip)} == {"v5p"}    # two TensorCores
    assert op.pays_on(dataclasses.replace(CHIPS["v5e"], tensorcores=2))
    for chip in ("v5e", "v6e"):
        assert "dimension_semantics" not in {o.name for o in search_operators(chip)}
        assert "block_sizes" in {o.name for o in search_operators(chip)}
    assert "dimension_semantics" in {o.name for o in search_operators("v5p")}


def test_dimension_semantics_follows_a_branch_through_an_alias():
    serial = seed_with(Edit("dimension_semantics", {"axis": 1, "semantics": "arbitrary"}),
                       Edit("dimension_semantics", {"axis": 0, "semantics": "arbitrary"}), case=DECODE)
    aliased = serial.replace("    b = pl.program_id(0)\n", "    b = pl.program_id(0)\n    first = b * 1\n", 1)
    aliased = aliased.replace("@pl.when(kv_index == 0)", "@pl.when((kv_index == 0) & (first >= 0))", 1)
    assert aliased.count("first") == 2
    refused = get_operator("dimension_semantics").apply_params(aliased, DECODE.task,
                                                               {"axis": 0, "semantics": "parallel"})
    assert refused.status == "not_applicable" and "branches on pl.program_id(0)" in refused.reason


def test_dimension_semantics_states_them_where_the_kernel_states_none():
    """The example seed states no semantics (every axis arbitrary, Mosaic's default): its one row
    axis becomes parallel through a CompilerParams the rewrite adds, with pltpu imported, and back."""
    axpy = seed_case("axpy")
    assert "CompilerParams" not in axpy.source and "pltpu" not in axpy.source
    parallel = apply("dimension_semantics", axpy.source, axpy.task, axis=0, semantics="parallel")
    assert "compiler_params=pltpu.CompilerParams(dimension_semantics=(\"parallel\",))" in parallel
    assert "from jax.experimental.pallas import tpu as pltpu\n" in parallel
    compile(parallel, "axpy", "exec")
    back = apply("dimension_semantics", parallel, axpy.task, axis=0, semantics="arbitrary")
    assert "dimension_semantics=(\"arbitrary\",)" in back
    refused = get_operator("dimension_semantics").apply_params(axpy.source, axpy.task,
                                                               {"axis": 0, "semantics": "arbitrary"})
    assert refused.status == "not_applicable" and "axis 0 is 'arbitrary'" in refused.reason


def test_dimension_semantics_stated_anew_still_refuses_an_axis_that_carries_state(tmp_path):
    """A user's row sum that states no semantics accumulates into its output across axis 1: axis 0
    may be stated parallel, axis 1 never (the same proof as for stated semantics)."""
    from seeds.reference import Task
    from tests.evolve.test_user_styles import PARTIAL_BLOCKS, ROWSUM_REF

    reference = tmp_path / "ref.py"
    reference.write_text(ROWSUM_REF)
    task = Task.read(reference, PARTIAL_BLOCKS)
    op = get_operator("dimension_semantics")
    first = op.apply_params(PARTIAL_BLOCKS, task, {"axis": 0, "semantics": "parallel"})
    assert first.status == "applied", first.reason
    refused = op.apply_params(first.source, task, {"axis": 1, "semantics": "parallel"})
    assert refused.status == "not_applicable" and "branches on pl.program_id(1)" in refused.reason


# ---- composition ------------------------------------------------------------------------------
def test_operators_that_compose_give_one_kernel_in_either_order():
    hpp2 = Edit("head_coarsening", {"heads_per_program": 2})
    # Pairs whose second operator has code for the first one's output.
    for a, b in [(hpp2, Edit("causal_skip")), (Edit("compact_scratch"), Edit("deferred_norm")),
                 (Edit("exp2_softmax"), Edit("deferred_norm"))]:
        assert seed_with(a, b) == seed_with(b, a), (a.op, b.op)
    a, b = Edit("grouped_heads"), Edit("split_kv", {"splits": 4})
    assert seed_with(a, b, case=DECODE) == seed_with(b, a, case=DECODE)


def test_block_sizes_grid_settings_are_the_tasks_points_else_the_largest_legal_values():
    """The ablation's block grid: the flash seed's own points (``grid_shapes``) largest first; a
    task naming none gets the 3 largest legal values of each BLOCK_* constant; then the best alone."""
    from seeds import load_seed
    from seeds.flash_decoding.task import Task as DecodeTask

    op = get_operator("block_sizes")
    source = load_seed("flash_attention").kernel_source
    points = [tuple((e.params["tunable"], e.params["value"]) for e in s)
              for s in op.grid_settings(source, AttentionTask(), [], None)]
    assert points == [(("BLOCK_Q", 2048), ("BLOCK_KV", 2048)), (("BLOCK_Q", 1024), ("BLOCK_KV", 2048)),
                      (("BLOCK_Q", 2048), ("BLOCK_KV", 1024)), (("BLOCK_Q", 1024), ("BLOCK_KV", 1024)),
                      (("BLOCK_Q", 512), ("BLOCK_KV", 512))]
    # N=512: only (512, 512) of the task's points is legal.
    assert len(op.grid_settings(source, AttentionTask(seq_len=512), [], None)) == 1
    decode = DecodeTask()
    settings = op.grid_settings(load_seed("flash_decoding").kernel_source, decode, [],
                                best := Edit("block_sizes", {"tunable": "BLOCK_KV", "value": 256}))
    legal = sorted(decode.legal_values("BLOCK_KV"))[-3:]
    assert [s[0].params["value"] for s in settings[:-1]] == legal[::-1] and settings[-1] == (best,)
