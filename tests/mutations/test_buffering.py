"""buffering: an input fetched once (its block the same at every grid step) is single-buffered.

On the rmsnorm seed the weight's block is (1, D) at block (0, 0) for every row block: the rewrite
frees its second buffer and changes no copy, so the judge passes it with the seed's figure to the
cycle. Where an input's block follows the grid (a matmul's operands), or the operator cannot read
the BlockSpec, it says which; it never offers what jax 0.10.2 does not lower (more than two
buffers) or what the estimate charges (single-buffering a block that changes)."""

from __future__ import annotations

import random

import pytest

from evaluator.judge import Judge
from mutations import get_operator
from seeds import load_seed

OP = get_operator("buffering")

NAMED = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.float32) * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def scale(x, w):
    t, d = x.shape
    rows = pl.BlockSpec((16, d), lambda i: (i, 0))
    weight = pl.BlockSpec((1, d))
    return pl.pallas_call(
        _kernel, grid=(t // 16,), in_specs=[rows, weight], out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((t, d), x.dtype))(x, w)
'''


@pytest.fixture(scope="module")
def rmsnorm():
    seed = load_seed("rmsnorm")
    return seed, seed.task("T=64,D=256")


def test_the_weight_of_rmsnorm_is_single_buffered_and_costs_nothing(rmsnorm):
    seed, task = rmsnorm
    result = OP.apply(seed.kernel_source, task, random.Random(0))
    assert result.applied, result.reason
    assert result.edit.params == {"input": 1}
    assert "pl.BlockSpec((1, d), lambda i: (0, 0), pipeline_mode=pl.Buffered(1))" in result.source
    assert "pl.BlockSpec((rows, d), lambda i: (i, 0))," in result.source          # the rows keep two buffers
    judge = Judge()
    before, after = judge.evaluate(seed.kernel_source, task), judge.evaluate(result.source, task)
    assert after.status.value == "PASS", after.error
    assert after.metrics.estimated_cycles == before.metrics.estimated_cycles      # it changes no copy
    again = OP.check(result.source, task)
    assert not again.ok and "sets its pipeline mode already" in again.reason      # once


def test_a_named_spec_used_once_with_the_default_index_map_is_found(rmsnorm):
    _, task = rmsnorm
    result = OP.apply_params(NAMED, task, {"input": 1})
    assert result.applied, result.reason
    assert "weight = pl.BlockSpec((1, d), pipeline_mode=pl.Buffered(1))" in result.source
    assert not OP.apply_params(NAMED, task, {"input": 0}).applied                 # rows follow the grid


@pytest.mark.parametrize("source, why", [
    (load_seed("matmul").kernel_source, "input 0: its index map follows the grid"),
    (NAMED.replace("in_specs=[rows, weight], out_specs=rows", "in_specs=[rows, rows], out_specs=rows"),
     "input 1: rows is not a pl.BlockSpec written in the wrapper"),
    (NAMED.replace("in_specs=[rows, weight]", "in_specs=specs").replace("    weight = ", "    specs = [rows, weight]\n"
                                                                          "    weight = "),
     "in_specs is not a literal list"),
    (NAMED.replace("pl.BlockSpec((1, d))", "pl.BlockSpec((1, d), weight_map)"), "weight_map is not a lambda"),
])
def test_it_says_why_it_does_not_apply(rmsnorm, source, why):
    check = OP.check(source, rmsnorm[1])
    assert not check.ok and why in check.reason, check.reason
    assert "deeper buffering than 2 is not lowered by jax 0.10.2" in check.reason or why.startswith("in_specs")
