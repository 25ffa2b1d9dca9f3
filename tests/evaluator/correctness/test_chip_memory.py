"""The interpreter hands a kernel memory as the chip does (``chip_memory.py``, ``interpret.py``):
poison in every type, a DMA's destination undefined until its wait, and "parallel" axes split
between the two TensorCores of a v5p. Each case beside its honest twin, run as the runner runs
the CPU program (one traced jaxpr, our grid loop), with no judge: fast."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.correctness import chip_memory, interpret
from evaluator.program import traced


def run(fn, *args, cores: int = 1):
    """``fn`` run by the judge's interpreter on a chip of ``cores`` TensorCores."""
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr = traced.with_interpret(closed.jaxpr, True)
    interpret.set_cores(cores)
    try:
        with interpret.installed():
            return jax.jit(lambda *xs: jax.core.eval_jaxpr(jaxpr, closed.consts, *xs))(*args)[0]
    finally:
        interpret.set_cores(1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32", "uint32", "int16", "uint16",
                                   "int8", "uint8", "float8_e4m3fn", "float8_e5m2"])
def test_poison_is_a_nan_in_every_float_view_and_never_zero_as_an_integer(dtype):
    x = chip_memory.poison((4,), dtype)
    assert x.dtype == jnp.dtype(dtype)
    if jnp.issubdtype(x.dtype, jnp.floating):
        assert np.isnan(np.asarray(x, np.float32)).all()
    else:
        assert (np.asarray(x) != 0).all()
    width = x.dtype.itemsize
    for view in {4: ("float32", "bfloat16", "float16"), 2: ("bfloat16", "float16")}.get(width, ()):
        as_float = jax.lax.bitcast_convert_type(x, view)
        assert np.isnan(np.asarray(as_float, np.float32)).all(), (dtype, view)


def _accumulate(a, b, *, zeroed: bool, dtype):
    """A K-tiled row sum of a @ b whose f32 accumulator lives in a scratch of ``dtype`` (bitcast
    at each use), zeroed at k == 0 or not."""
    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            if zeroed:
                acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

        acc = jax.lax.bitcast_convert_type(acc_ref[...], jnp.float32)
        acc = acc + jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] = jax.lax.bitcast_convert_type(acc, acc_ref.dtype)
        o_ref[...] = acc

    return pl.pallas_call(
        kernel, grid=(a.shape[1] // 128,),
        in_specs=[pl.BlockSpec((a.shape[0], 128), lambda k: (0, k)), pl.BlockSpec((128, b.shape[1]), lambda k: (k, 0))],
        out_specs=pl.BlockSpec((a.shape[0], b.shape[1]), lambda k: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32),
        scratch_shapes=[pltpu.VMEM((a.shape[0], b.shape[1]), dtype)])(a, b)


@pytest.mark.parametrize("dtype", [jnp.uint32, jnp.int32, jnp.float32])
def test_an_accumulator_never_zeroed_reads_poison_in_any_scratch_type(dtype):
    a = jnp.ones((8, 256), jnp.float32)
    b = jnp.ones((256, 128), jnp.float32)
    assert np.isnan(np.asarray(run(lambda a, b: _accumulate(a, b, zeroed=False, dtype=dtype), a, b))).all()
    np.testing.assert_array_equal(run(lambda a, b: _accumulate(a, b, zeroed=True, dtype=dtype), a, b), 256.0)


def _copy_in(x, *, read_before_wait: bool):
    """x (in HBM) copied into VMEM scratch by the kernel's own DMA; doubled from the buffer read
    before or after the copy's wait."""
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        if read_before_wait:
            o_ref[...] = buf[...] * 2.0
            copy.wait()
        else:
            copy.wait()
            o_ref[...] = buf[...] * 2.0

    return pl.pallas_call(
        kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA])(x)


def test_a_dma_destination_is_poison_until_its_wait():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    assert np.isnan(np.asarray(run(lambda x: _copy_in(x, read_before_wait=True), x))).all()
    np.testing.assert_array_equal(run(lambda x: _copy_in(x, read_before_wait=False), x), x * 2.0)


def _split_k(a, b, *, k_semantics: str):
    """The matmul seed's tiling, its K axis marked ``k_semantics``."""
    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            acc_ref[...] = jnp.zeros(acc_ref.shape, acc_ref.dtype)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    m, k = a.shape
    return pl.pallas_call(
        kernel, grid=(m // 8, k // 128),
        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k)), pl.BlockSpec((128, b.shape[1]), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((8, b.shape[1]), lambda i, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, b.shape[1]), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, b.shape[1]), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", k_semantics)))(a, b)


def test_a_parallel_reduction_axis_is_wrong_on_two_cores_and_right_on_one():
    a = jnp.ones((16, 512), jnp.float32)
    b = jnp.ones((512, 128), jnp.float32)
    bad = run(lambda a, b: _split_k(a, b, k_semantics="parallel"), a, b, cores=2)
    assert np.isnan(np.asarray(bad)).any()
    np.testing.assert_array_equal(run(lambda a, b: _split_k(a, b, k_semantics="arbitrary"), a, b, cores=2), 512.0)
    # One TensorCore (v5e, v6e): the grid runs in order, so the same kernel is right there.
    np.testing.assert_array_equal(run(lambda a, b: _split_k(a, b, k_semantics="parallel"), a, b, cores=1), 512.0)
