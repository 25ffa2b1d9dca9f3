"""A kernel's own DMAs counted on every input set (``evaluator/figure/dmas.py``): a decode kernel that
keeps the KV cache in HBM and copies its blocks itself gets a figure, with the bytes it really
moved, and one that copies more than it uses is charged for what it copies."""

from __future__ import annotations

import pytest

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from seeds import load_seed
from tests.judging import judge_all

SHAPE = "B=4,H=4,HKV=2,N=2048,D=128,T=1"

# The naive decode kernel with K and V left in HBM (memory_space=ANY) and copied by the kernel.
# COPY: "block" copies the grid step's block; "whole" the sequence's whole cache every step (and
# uses one block of it); SKIP: no copy (and no compute) past the sequence's length.
MANUAL = '''
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_KV = 512
COPY = "block"
SKIP = False
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _kernel(lengths_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, m_s, l_s, acc_s, sems, *,
            sm_scale, block_kv, group):
    b, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(j == 0)
    def _init():
        m_s[...] = jnp.full(m_s.shape, -jnp.inf, jnp.float32)
        l_s[...] = jnp.zeros(l_s.shape, jnp.float32)
        acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)

    def step():
        kv_head = jax.lax.div(h, group)
        if COPY == "whole":
            ck = pltpu.make_async_copy(k_hbm.at[b, kv_head], k_buf, sems.at[0])
            cv = pltpu.make_async_copy(v_hbm.at[b, kv_head], v_buf, sems.at[1])
        else:
            rows = pl.ds(pl.multiple_of(j * block_kv, block_kv), block_kv)
            ck = pltpu.make_async_copy(k_hbm.at[b, kv_head, rows], k_buf, sems.at[0])
            cv = pltpu.make_async_copy(v_hbm.at[b, kv_head, rows], v_buf, sems.at[1])
        ck.start()
        cv.start()
        ck.wait()
        cv.wait()
        if COPY == "whole":
            rows = pl.ds(pl.multiple_of(j * block_kv, block_kv), block_kv)
            k, v = k_buf[rows, :], v_buf[rows, :]
        else:
            k, v = k_buf[...], v_buf[...]
        q = q_ref[0, 0]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = s * sm_scale
        cols = j * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols < lengths_ref[b], s, MASK_VALUE)
        m_prev, l_prev = m_s[...], l_s[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        l_s[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        m_s[...] = m_next
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        acc_s[...] = acc_s[...] * alpha[:, :1] + pv

    if SKIP:
        pl.when(j * block_kv < lengths_ref[b])(step)
    else:
        step()

    @pl.when(j == pl.num_programs(2) - 1)
    def _store():
        o_ref[0, 0] = (acc_s[...] / l_s[...][:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("sm_scale",))
def flash_decoding(q, k, v, lengths, *, sm_scale=1.0):
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    block_kv = min(BLOCK_KV, kv_len)
    rows = kv_len if COPY == "whole" else block_kv
    kernel = functools.partial(_kernel, sm_scale=sm_scale, block_kv=block_kv, group=heads // kv_heads)
    q_spec = pl.BlockSpec((1, 1, q_len, head_dim), lambda b, h, j, lengths: (b, h, 0, 0))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, heads, kv_len // block_kv),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((rows, head_dim), k.dtype), pltpu.VMEM((rows, head_dim), v.dtype),
                            pltpu.VMEM((q_len, STATS_LANES), jnp.float32),
                            pltpu.VMEM((q_len, STATS_LANES), jnp.float32),
                            pltpu.VMEM((q_len, head_dim), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(lengths, q, k, v)
'''


def manual(copy: str = "block", skip: bool = False) -> str:
    return MANUAL.replace('COPY = "block"', f'COPY = "{copy}"').replace("SKIP = False", f"SKIP = {skip}")


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    seed = load_seed("flash_decoding")
    task = seed.task(SHAPE)
    judge = Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("dmas")), workers=2))
    names = ("pipelined", "block", "whole", "skip", "no wait")
    no_wait = manual("block").replace("        ck.wait()\n        cv.wait()\n", "")
    assert no_wait != manual("block")
    sources = [seed.kernel_source, manual("block"), manual("whole"), manual("block", skip=True), no_wait]
    results = dict(zip(names, judge_all(judge, sources, task), strict=True))
    at = task.input_names.index("lengths")
    return results, task, [truth.inputs[at] for truth in judge.references.truth(task)]


def test_a_kernel_that_copies_its_own_blocks_is_timed_with_the_bytes_it_moves(verdicts):
    results, task, _ = verdicts
    for name, r in results.items():
        assert r.status is Status.PASS or name == "no wait", (name, r.error)
    # Block by block, the kernel's own copies move what the pipeline moves for the naive kernel.
    assert results["block"].metrics.hbm_bytes == results["pipelined"].metrics.hbm_bytes


def test_a_kernel_that_copies_the_whole_cache_is_charged_for_it(verdicts):
    """It uses one block of each copy: it moves as many times the cache as there are blocks, and
    its figure is held to those bytes, not to what it declares or uses."""
    results, task, _ = verdicts
    blocks = task.kv_len // 512
    cache = 2 * task.batch * task.heads * task.kv_len * task.head_dim * 2    # K and V, bf16, every head
    whole, block = results["whole"].metrics, results["block"].metrics
    assert whole.hbm_bytes - block.hbm_bytes == cache * (blocks - 1)
    assert whole.estimated_cycles > block.estimated_cycles


def test_copies_skipped_past_each_length_save_exactly_their_bytes(verdicts):
    """Counted on every input set, the figure the slowest's: the set whose lengths leave the most
    blocks to copy (the fewest skipped)."""
    results, task, sets = verdicts
    per_block = 2 * 512 * task.head_dim * 2       # one K and one V block, bf16
    skipped = min(sum(task.heads * (task.kv_len // 512 - (-(-int(n) // 512))) for n in lengths) for lengths in sets)
    assert results["block"].metrics.hbm_bytes - results["skip"].metrics.hbm_bytes == skipped * per_block
    assert results["skip"].metrics.estimated_cycles < results["block"].metrics.estimated_cycles


def test_copies_started_and_never_waited_for_are_refused(verdicts):
    """On a TPU the kernel would read its buffers before the data lands, and the estimate would
    count no wait. The interpreter lands a copy at its wait (``chip_memory.py``), so the buffers
    it reads are poison: it fails correctness, naming the NaN. (The count of bytes started and
    waited for, ``dmas.py``, stands behind it for a kernel whose outputs survive that.)"""
    results, _, _ = verdicts
    r = results["no wait"]
    assert r.status is Status.FAIL_CORRECTNESS, r
    assert "NaN" in r.error, r.error
