"""grid_order: two grid axes swap, with every index map, program id and dimension semantics; only
where no state crosses either axis and some input's block follows one and not the other."""

from __future__ import annotations

import pytest

from evaluator.judge import Judge
from mutations import get_operator
from seeds import load_seed

OP = get_operator("grid_order")


@pytest.fixture(scope="module")
def matmul():
    seed = load_seed("matmul")
    return seed, seed.task("M=256,K=256,N=512")


def test_the_matmul_s_row_and_column_axes_swap_and_pass_the_judge(matmul):
    seed, task = matmul
    result = OP.apply_params(seed.kernel_source, task, {"outer": "j", "inner": "i"})
    assert result.applied, result.reason
    out = result.source
    assert "grid=(n // bn, m // bm, k // bk)" in out
    assert "lambda j, i, kk: (i, kk)" in out and "lambda j, i, kk: (kk, j)" in out and "lambda j, i, kk: (i, j)" in out
    assert "pl.program_id(2)" in out                        # the reduction axis stays where it was
    verdict = Judge().evaluate(out, task)
    assert verdict.status.value == "PASS", verdict.error
    # the same edit again changes nothing; the other way round, it is the seed again
    again = OP.apply_params(out, task, {"outer": "j", "inner": "i"})
    assert again.status == "not_applicable" and "already outside" in again.reason
    assert OP.apply_params(out, task, {"outer": "i", "inner": "j"}).source == seed.kernel_source


def test_the_reduction_axis_never_moves(matmul):
    seed, task = matmul
    for inner in ("i", "j"):
        result = OP.apply_params(seed.kernel_source, task, {"outer": "kk", "inner": inner})
        assert result.status == "not_applicable" and "branches on pl.program_id(2)" in result.reason


def test_program_ids_follow_the_swap(matmul):
    seed, task = matmul
    source = seed.kernel_source.replace(
        "acc_ref[...] += jnp.dot(", "row = pl.program_id(0)\n    acc_ref[...] += 0 * row + jnp.dot(")
    out = OP.apply_params(source, task, {"outer": "j", "inner": "i"})
    assert out.applied, out.reason
    assert "row = pl.program_id(1)" in out.source


@pytest.mark.parametrize("seed_name, why", [
    ("flash_attention", "every input's block follows both or neither"),
    ("rmsnorm", "the grid has 1 axis"),
])
def test_it_refuses_where_the_order_cannot_matter_or_cannot_move(seed_name, why):
    seed = load_seed(seed_name)
    check = OP.check(seed.kernel_source, seed.default_task())
    assert not check.ok and why in check.reason, check.reason


def test_an_index_map_it_cannot_reorder_is_refused(matmul):
    seed, task = matmul
    source = seed.kernel_source.replace("lambda i, j, kk: (i, kk)", "_lhs_map").replace(
        "@jax.jit", "def _lhs_map(i, j, kk):\n    return i, kk\n\n\n@jax.jit")
    check = OP.check(source, task)
    assert not check.ok and "is not a lambda" in check.reason, check.reason
