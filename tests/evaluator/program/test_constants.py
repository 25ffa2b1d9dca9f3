"""The constant budget (evaluator/program/constants.py) and the compiler-parameter allow-list
(evaluator/program/compiler_params.py), on programs traced here: what real kernels hold passes, outputs
carried as data and unmodelled compiler knobs are named."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.program import compiler_params, constants, traced, wire

ROOT = Path(__file__).resolve().parents[3]
SPEC = jax.ShapeDtypeStruct((256, 128), jnp.float32)


def program(fn, *specs):
    """``fn`` traced as the worker does and rebuilt from data as the runner does."""
    return wire.loads(wire.dumps(traced.trace(fn, specs or (SPEC,))))


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel_call(x, **call):
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), **call)(x)


def test_a_plain_kernel_holds_next_to_nothing():
    held = constants.report(program(kernel_call))
    assert held.data_bytes <= 64 and held.computed_bytes == 0 and held.problem() is None


@pytest.mark.parametrize("path, entry, specs", [
    ("seeds/flash_attention/kernel.py", "flash_attention", [((1, 2, 256, 128), "bfloat16")] * 3),
    ("examples/jax_flash_attention.py", "flash_attention", [((1, 2, 256, 128), "bfloat16")] * 3),
    ("seeds/flash_decoding/kernel.py", "flash_decoding",
     [((2, 2, 1, 128), "bfloat16"), ((2, 2, 512, 128), "bfloat16"), ((2, 2, 512, 128), "bfloat16"), ((2,), "int32")]),
])
def test_real_kernels_are_far_under_the_budget(path, entry, specs):
    spec = importlib.util.spec_from_file_location("k", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = functools.partial(getattr(module, entry), sm_scale=0.1)
    held = constants.report(program(fn, *(jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in specs)))
    assert held.data_bytes < constants.BUDGET_BYTES // 16 and held.computed_bytes == 0, held


def test_an_output_sized_constant_is_refused_with_its_size():
    table = np.arange(256 * 128, dtype=np.float32).reshape(256, 128)
    held = constants.report(program(lambda x: kernel_call(x) + table))
    assert held.data_bytes >= table.nbytes
    problem = held.problem()
    assert problem and f"{held.data_bytes:,} bytes of constants" in problem and "float32[256, 128]" in problem


def test_constants_inside_nested_calls_and_kernel_operands_count():
    table = np.full((256, 128), 3.0, np.float32)
    nested = jax.jit(lambda x: x + table)
    held = constants.report(program(lambda x: kernel_call(nested(x))))
    assert held.data_bytes >= table.nbytes


def test_a_small_table_is_allowed():
    table = np.ones((8, 128), np.float32)            # 4 KiB
    held = constants.report(program(lambda x: kernel_call(x)[:8] + table))
    assert held.problem() is None and held.data_bytes >= table.nbytes


def test_broadcasts_and_iotas_of_any_size_are_free():
    def fn(x):
        zeros = jnp.zeros((1024, 1024), jnp.float32)
        rows = jax.lax.broadcasted_iota(jnp.int32, (1024, 1024), 0).astype(jnp.float32)
        return kernel_call(x) + zeros[:256, :128] + rows[:256, :128]
    held = constants.report(program(fn))
    assert held.problem() is None, held


def test_an_array_computed_from_constants_alone_outside_a_kernel_is_refused():
    # A small program can generate anything (here a table from an iota), and XLA may fold it at
    # compile time: its work would be free.
    def fn(x):
        table = jnp.sin(jnp.arange(256 * 128, dtype=jnp.float32)).reshape(256, 128)
        return kernel_call(x) + table
    held = constants.report(program(fn))
    assert held.computed_bytes == 256 * 128 * 4
    assert "from constants alone" in held.problem()


def test_a_kernel_is_paid_work_whatever_it_reads():
    def fn(x):
        table = jnp.ones((256, 128), jnp.float32)    # a broadcast: free
        return kernel_call(x) + kernel_call(table)
    assert constants.report(program(fn)).problem() is None


# ---- compiler parameters ------------------------------------------------------------------------
def test_the_allowed_compiler_parameters_pass():
    params = pltpu.CompilerParams(vmem_limit_bytes=64 << 20, dimension_semantics=(), allow_input_fusion=[True])
    assert compiler_params.problems(program(functools.partial(kernel_call, compiler_params=params))) == []


@pytest.mark.parametrize("field, value", [
    ("flags", {"xla_tpu_enable_log_recorder": True}), ("disable_bounds_checks", True),
    ("internal_scratch_in_bytes", 1 << 20), ("serialization_format", 0), ("has_side_effects", True),
    ("disable_semaphore_checks", True), ("needs_layout_passes", False),
])
def test_every_other_compiler_parameter_is_refused_by_name(field, value):
    params = pltpu.CompilerParams(**{field: value})
    closed = program(functools.partial(kernel_call, compiler_params=params))
    with pytest.raises(compiler_params.KnobRefused, match=f"compiler parameter {field}="):
        compiler_params.check(closed)


def test_an_undeclared_attribute_on_the_parameters_is_refused():
    # The runner rebuilds the jaxpr from data; a hostile worker could add attributes.
    closed = program(functools.partial(kernel_call, compiler_params=pltpu.CompilerParams()))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
    object.__setattr__(eqn.params["compiler_params"], "extra_flags", "--xla_anything")
    assert any("undeclared compiler parameter(s) extra_flags" in p for p in compiler_params.problems(closed))


def test_a_declared_cost_estimate_never_reaches_either_program():
    estimate = pl.CostEstimate(flops=1, transcendentals=0, bytes_accessed=1)
    closed = program(functools.partial(kernel_call, cost_estimate=estimate))
    assert compiler_params.problems(closed) == []
    for interpret in (True, False):
        (eqn,) = [e for e in traced.with_interpret(closed.jaxpr, interpret).eqns if e.primitive.name == "pallas_call"]
        assert eqn.params["cost_estimate"] is None
    assert dataclasses.is_dataclass(estimate)
