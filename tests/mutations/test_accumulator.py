"""accumulator: a reduction added into the output block moves into an f32 scratch, stored once.

A matmul accumulating in its bf16 output block (written here as a user might) rounds every partial
sum; the rewrite passes the judge with the XLA program's own error. Where the move is not proved
(no reduction in the output, an f32 output, a reduction axis that is not the last, an output map
that follows it), the operator says which."""

from __future__ import annotations

import random

import pytest

from evaluator.judge import Judge
from mutations import get_operator
from seeds import load_seed

OP = get_operator("accumulator")

RMW = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128


def _kernel(a_ref, b_ref, c_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        c_ref[...] = jnp.zeros_like(c_ref)

    c_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(c_ref.dtype)


@jax.jit
def matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), min(BLOCK_K, k)
    return pl.pallas_call(
        _kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
    )(a, b)
'''


@pytest.fixture(scope="module")
def task():
    return load_seed("matmul").task("M=256,K=1024,N=256")


def test_the_sum_moves_to_an_f32_scratch_and_passes_with_xla_s_error(task):
    result = OP.apply(RMW, task, random.Random(0))
    assert result.applied, result.reason
    out = result.source
    assert "def _kernel(a_ref, b_ref, c_ref, acc_ref):" in out
    assert "acc_ref[...] = jnp.zeros_like(acc_ref)" in out
    assert "acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)\n" in out
    assert "@pl.when(pl.program_id(2) == pl.num_programs(2) - 1)" in out
    assert "c_ref[...] = acc_ref[...].astype(c_ref.dtype)" in out
    assert "scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]" in out
    assert "from jax.experimental.pallas import tpu as pltpu" in out
    verdict = Judge().evaluate(out, task)
    assert verdict.status.value == "PASS", verdict.error
    m = verdict.metrics
    assert m.max_abs_error <= 1.01 * m.reference_max_abs_error
    assert not OP.check(out, task).ok                            # once


class _F32:
    output_dtype = "float32"
    entry = "matmul"


@pytest.mark.parametrize("source, task_, why", [
    (load_seed("matmul").kernel_source, None, "never adds into its output block"),
    (RMW, _F32(), "the output is f32 already"),
    (RMW.replace("pl.program_id(2) == 0", "pl.program_id(1) == 0"), None, "is not the grid's last"),
    (RMW.replace("lambda i, j, kk: (i, j)", "lambda i, j, kk: (i, kk)"), None, "follows the reduction axis"),
])
def test_it_refuses_what_it_cannot_prove(task, source, task_, why):
    check = OP.check(source, task_ or task)
    assert not check.ok and why in check.reason, check.reason
