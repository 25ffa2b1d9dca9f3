"""Before/after tests per operator on a small kernel snippet, and where each must not apply."""

from __future__ import annotations

import random
import textwrap

import pytest

from mutations import Applicability, get_operator, read_tunables
from seeds.flash_attention.task import AttentionTask

from .snippets import MINI

CAUSAL = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=True)
FULL = AttentionTask(batch=1, heads=4, seq_len=512, head_dim=128, causal=False)


def apply(name: str, source: str = MINI, task=CAUSAL, **params):
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
    for seed in range(60):
        result = get_operator("block_sizes").apply(source, task, random.Random(seed))
        assert result.status == "applied"
        name, value = result.edit.params["tunable"], result.edit.params["value"]
        seen.add((name, value))
        if name.startswith("BLOCK"):
            assert value % 128 == 0 and 768 % value == 0 and value != 128
        else:
            assert 6 % value == 0 and value != 1
    assert {v for n, v in seen if n == "BLOCK_Q"} == {256, 384, 768}
    assert {v for n, v in seen if n == "HEADS_PER_PROGRAM"} == {2, 3, 6}


def test_block_sizes_not_applicable():
    assert "no module-level block-size constant" in not_applicable("block_sizes", "X = 1\n")
    # N=128: 128 is the only legal sequence block.
    assert "no other legal value" in not_applicable(
        "block_sizes", "BLOCK_Q = 128\n", AttentionTask(seq_len=128))
    # N not a multiple of the 128 tile.
    not_applicable("block_sizes", "BLOCK_Q = 128\n", AttentionTask(seq_len=200))
    illegal = get_operator("block_sizes").apply_params(MINI, CAUSAL, {"tunable": "BLOCK_Q", "value": 384})
    assert illegal.status == "not_applicable" and "legal values" in illegal.reason


def test_block_sizes_is_deterministic():
    op = get_operator("block_sizes")
    a = op.apply(MINI, CAUSAL, random.Random(7))
    b = op.apply(MINI, CAUSAL, random.Random(7))
    assert a == b


# ---- VMEM limit -----------------------------------------------------------------------------
def test_vmem_limit_before_after_and_again():
    after = apply("vmem_limit", mib=48)
    assert "VMEM_LIMIT_BYTES = 48 * 1024 * 1024" in after
    assert read_tunables(after)["VMEM_LIMIT_BYTES"] == 48 * 1024 * 1024
    assert textwrap.dedent("""\
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
    """) in textwrap.dedent("\n".join(line[8:] for line in after.splitlines())) + "\n"
    # A second application only moves the constant.
    again = apply("vmem_limit", after, mib=96)
    assert again.count("vmem_limit_bytes=") == 1
    assert read_tunables(again)["VMEM_LIMIT_BYTES"] == 96 * 1024 * 1024
    assert get_operator("vmem_limit").apply_params(MINI, CAUSAL, {"mib": 1000}).status == "not_applicable"


def test_vmem_limit_not_applicable_without_compiler_params():
    source = MINI.replace('compiler_params=pltpu.CompilerParams(\n            dimension_semantics=('
                          '"parallel", "parallel", "parallel", "arbitrary")),\n', "")
    assert "CompilerParams" not in source
    assert "CompilerParams" in not_applicable("vmem_limit", source)


# ---- compact scratch ------------------------------------------------------------------------
def test_compact_scratch_before_after():
    after = apply("compact_scratch")
    assert "pltpu.VMEM((block_q, 1), jnp.float32)," in after
    assert "STATS_LANES)" not in after
    assert "[:, :1]" not in after
    assert "p = jnp.exp(s - m_next)\n" in after
    assert "acc_scratch[...] = acc_scratch[...] * (l_corr * l_next_inv) + pv * l_next_inv\n" in after
    assert "# Normalise every step." in after          # comments kept
    assert "already" in not_applicable("compact_scratch", after)


def test_compact_scratch_not_applicable_on_other_layouts():
    source = MINI.replace("pltpu.VMEM((block_q, STATS_LANES), jnp.float32)",
                          "pltpu.VMEM((block_q, 8), jnp.float32)")
    assert "expected STATS_LANES" in not_applicable("compact_scratch", source)
    assert "flash_attention" in not_applicable("compact_scratch", "x = 1\n")


# ---- deferred normalisation -----------------------------------------------------------------
def test_deferred_norm_before_after():
    after = apply("deferred_norm")
    assert "l_next_inv" not in after
    assert "acc_scratch[...] = acc_scratch[...] * alpha[:, :1] + pv\n" in after
    assert "o_ref[0, 0] = (acc_scratch[...] / l_scratch[...][:, :1]).astype(o_ref.dtype)" in after
    assert "already deferred" in not_applicable("deferred_norm", after)


def test_deferred_norm_after_compact_scratch_has_no_lane_slices():
    after = apply("deferred_norm", apply("compact_scratch"))
    assert "acc_scratch[...] = acc_scratch[...] * alpha + pv\n" in after
    assert "(acc_scratch[...] / l_scratch[...]).astype" in after
    assert "[:, :1]" not in after
    # and the other order gives the same kernel body
    other = apply("compact_scratch", apply("deferred_norm"))
    assert other == after


def test_deferred_norm_needs_alpha():
    source = MINI.replace("alpha = jnp.exp(m_prev - m_next)", "alpha = jnp.exp(m_prev) / jnp.exp(m_next)")
    assert "alpha" in not_applicable("deferred_norm", source)


# ---- causal skip ----------------------------------------------------------------------------
def test_causal_skip_before_after():
    after = apply("causal_skip")
    assert "def _step(needs_mask):" in after
    assert "if needs_mask:  # mask above the diagonal" in after
    assert "@pl.when(kv_last <= q_first)" in after
    assert "_step(True)" in after and "_step(False)" in after
    assert "return jnp.minimum(j, jax.lax.div((i + 1) * block_q - 1, block_kv))" in after
    assert after.count("lambda b, h, i, j: (b, h, kv_block_index(i, j), 0)") == 2
    assert after.count("lambda b, h, i, j: (b, h, i, 0)") == 2          # q and o untouched
    assert "already" in not_applicable("causal_skip", after)


def test_causal_skip_not_applicable():
    assert "not causal" in not_applicable("causal_skip", MINI, FULL)
    no_mask = MINI.replace("if causal:  # mask above the diagonal", "if False:")
    assert "if causal" in not_applicable("causal_skip", no_mask)


# ---- diagonal strips ------------------------------------------------------------------------
def test_diagonal_strips_before_after_and_as_a_knob():
    after = apply("diagonal_strips", apply("causal_skip"), strip=256)
    assert "DIAGONAL_STRIP = 256" in after
    assert "def _step(needs_mask, row0=0, *, q_ref=q_ref, k_ref=k_ref, v_ref=v_ref," in after
    assert "rows = row0 + " in after                     # the mask's rows follow the strip
    assert "q_ref=q_ref.at[:, :, rows, :]" in after and "k_ref=k_ref.at[:, :, seen, :]" in after
    assert "if block_q == block_kv and block_q % DIAGONAL_STRIP == 0" in after
    assert after.count("_step(True)") == 1 and "_step(False)" in after   # the fallback stays
    again = apply("diagonal_strips", after, strip=512)
    assert "DIAGONAL_STRIP = 512" in again and again.count("def _diagonal_strips") == 1


def test_diagonal_strips_not_applicable():
    assert "causal_skip first" in not_applicable("diagonal_strips", MINI)
    assert "not causal" in not_applicable("diagonal_strips", apply("causal_skip"), FULL)
    coarse = apply("diagonal_strips", apply("head_coarsening", apply("causal_skip"), heads_per_program=2),
                   strip=256)
    assert "q_ref=tuple(t.at[:, :, rows, :] for t in q_ref)" in coarse
    assert "m_scratch=m_scratch.at[:, rows, :]" in coarse
    strips = apply("diagonal_strips", apply("causal_skip"), strip=256)
    assert "one head per program" in not_applicable("head_coarsening", strips)


# ---- head coarsening ------------------------------------------------------------------------
def test_head_coarsening_before_after():
    after = apply("head_coarsening", heads_per_program=2)
    assert read_tunables(after)["HEADS_PER_PROGRAM"] == 2
    assert "sm_scale, causal, block_q, block_kv, heads_per_program, head_dim):" in after
    # q / k / v refs are tuples of one-head refs; the body loops over the heads.
    assert "    for head in range(heads_per_program):\n        q = q_ref[head][0, 0]\n" in after
    assert "m_scratch[head] = m_next" in after
    # The output block holds the program's heads side by side along lanes.
    assert ("            lanes = pl.ds(head * head_dim, head_dim)  # this head's lanes\n"
            "            o_ref[0, 0, :, lanes] = acc_scratch[head].astype(o_ref.dtype)") in after
    assert "grid = (batch, heads // heads_per_program, seq_len // block_q" in after
    # One (1, 1, block, head_dim) BlockSpec per head of each input: contiguous DMAs only.
    assert ("tuple(pl.BlockSpec((1, 1, block_kv, head_dim), lambda b, h, i, j, t=t: "
            "(b, h * heads_per_program + t, j, 0)) for t in range(heads_per_program))") in after
    assert after.count("lambda b, h, i, j, t=t: (b, h * heads_per_program + t, ") == 3
    assert "out_specs=pl.BlockSpec((1, 1, block_q, heads_per_program * head_dim), " in after
    assert ("jax.ShapeDtypeStruct((q.shape[0], q.shape[1] // heads_per_program, q.shape[2], "
            "heads_per_program * q.shape[3]), q.dtype)") in after
    assert ")((q,) * heads_per_program, (k,) * heads_per_program, (v,) * heads_per_program)\n" in after
    assert "    return _lanes_to_heads(out, heads_per_program)\n" in after
    assert "pltpu.VMEM((heads_per_program, block_q, STATS_LANES), jnp.float32)" in after
    assert "block_q=block_q, block_kv=block_kv,\n" in after
    assert "heads_per_program=heads_per_program,\n" in after and "head_dim=head_dim)" in after
    assert "\n\n\ndef _lanes_to_heads(x, heads_per_program):" in after
    assert "\n\n\n@functools.partial(jax.jit, static_argnames=(\"causal\", \"sm_scale\"))" in after
    assert "already" in not_applicable("head_coarsening", after)


def test_head_coarsening_and_causal_skip_compose_in_both_orders():
    after = apply("head_coarsening", apply("causal_skip"), heads_per_program=2)
    clamp = "t=t: (b, h * heads_per_program + t, kv_block_index(i, j), 0)"
    assert after.count(clamp) == 2
    assert "    def _step(needs_mask):\n        for head in range(heads_per_program):\n" in after
    # The other order: causal_skip finds the per-head K/V spec groups and clamps each.
    other = apply("causal_skip", apply("head_coarsening", heads_per_program=2))
    assert other.count(clamp) == 2
    assert "def _step(needs_mask):" in other


def test_head_coarsening_composes_with_deferred_norm_both_ways():
    one = apply("deferred_norm", apply("head_coarsening", heads_per_program=2))
    other = apply("head_coarsening", apply("deferred_norm"), heads_per_program=2)
    store = "o_ref[0, 0, :, lanes] = (acc_scratch[head] / l_scratch[head][:, :1]).astype(o_ref.dtype)"
    assert store in one and store in other


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
    for seed in range(20):
        result = get_operator("head_coarsening").apply(MINI, AttentionTask(heads=6), random.Random(seed))
        assert result.edit.params["heads_per_program"] in (2, 3, 6)


# ---- exp2 softmax ---------------------------------------------------------------------------
def test_exp2_softmax_before_after():
    after = apply("exp2_softmax")
    assert "s = s * (sm_scale * 1.4426950408889634)\n" in after
    assert "alpha = jnp.exp2(m_prev - m_next)" in after and "p = jnp.exp2(s - m_next[:, :1])" in after
    assert "jnp.exp(" not in after
    assert "exp2" in not_applicable("exp2_softmax", after)
    # composes with deferred normalisation (which finds alpha through exp2)
    assert "acc_scratch[...] * alpha[:, :1] + pv" in apply("deferred_norm", after)


def test_exp2_softmax_needs_the_scaling():
    assert "sm_scale" in not_applicable("exp2_softmax", MINI.replace("    s = s * sm_scale\n", ""))


# ---- approximate reciprocal -------------------------------------------------------------------
def test_approx_reciprocal_before_after():
    deferred = apply("deferred_norm")
    after = apply("approx_reciprocal", deferred)
    assert "acc_scratch[...] * pl.reciprocal(l_scratch[...][:, :1], approx=True)" in after
    assert "/ l_scratch" not in after
    assert "already" in not_applicable("approx_reciprocal", after)


def test_approx_reciprocal_needs_the_deferred_normalisation():
    assert "deferred_norm" in not_applicable("approx_reciprocal")


# ---- all operators --------------------------------------------------------------------------
OPS = ["block_sizes", "compact_scratch", "deferred_norm", "causal_skip", "head_coarsening", "vmem_limit",
       "exp2_softmax"]


@pytest.mark.parametrize("name", OPS)
def test_applying_twice_is_not_applicable_or_harmless(name):
    op = get_operator(name)
    once = op.apply(MINI, CAUSAL, random.Random(1))
    assert once.status == "applied", once.reason
    twice = op.apply(once.source, CAUSAL, random.Random(2))
    if twice.status == "applied":
        # Only tunable-moving operators may apply again, and then only a constant changes.
        assert name in ("block_sizes", "vmem_limit")
        changed = [(a, b) for a, b in zip(once.source.splitlines(), twice.source.splitlines(),
                                          strict=False) if a != b]
        assert len(changed) == 1 and changed[0][1].split("=")[0].strip().isupper()
    else:
        assert twice.status == "not_applicable"


@pytest.mark.parametrize("name", OPS)
def test_garbage_never_raises(name):
    op = get_operator(name)
    sources = ["", "def (:\n", "import jax\n"]
    if name != "block_sizes":     # block_sizes only needs the constants
        sources.append(MINI.replace("flash_attention", "other"))
    for source in sources:
        result = op.apply(source, CAUSAL, random.Random(0))
        assert result.status in ("not_applicable", "failed")
        assert result.source == source and result.reason
        assert not op.check(source, CAUSAL).ok
        with pytest.raises(ValueError):
            op.sample_params(source, CAUSAL, random.Random(0))


@pytest.mark.parametrize("name", OPS)
def test_apply_is_deterministic_for_a_generator_state(name):
    op = get_operator(name)
    results = {op.apply(MINI, CAUSAL, random.Random(123)).source for _ in range(3)}
    assert len(results) == 1
