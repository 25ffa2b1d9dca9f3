"""A kernel that pipelines by hand (``pltpu.emit_pipeline`` inside a ``pallas_call`` on HBM refs):
it traces here (Pallas reads the chip's sizes at trace time, answered with the judged chip's), and
its figure is refused by name, since its copies sit in a loop over ``run_scoped`` state the count
cannot follow: never a free figure, and never reported as a wrong answer."""

from __future__ import annotations

from evaluator.result import Status
from seeds import reference_seed

REFERENCE = '''
import jax, jax.numpy as jnp

def create_inputs(M=256, N=256):
    kx, ky = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(ky, (M, N), jnp.float32)

def workload(x, y):
    return jnp.tanh(x) * y + x
'''

KERNEL = '''
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

def _inner(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = jnp.tanh(x) * y_ref[...] + x

def _outer(x_hbm, y_hbm, o_hbm):
    m, n = x_hbm.shape
    spec = pl.BlockSpec((64, n), lambda i: (i, 0))
    pltpu.emit_pipeline(_inner, grid=(m // 64,), in_specs=[spec, spec], out_specs=[spec])(x_hbm, y_hbm, o_hbm)

def fused(x, y):
    return pl.pallas_call(
        _outer, in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2, out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
'''


def test_a_hand_pipelined_kernel_is_traced_and_its_figure_refused_by_name(judge, tmp_path):
    (tmp_path / "reference.py").write_text(REFERENCE)
    task = reference_seed(tmp_path / "reference.py").read_task(KERNEL)
    result = judge.evaluate(KERNEL, task)
    assert result.status is Status.FAIL_TIMING, (result.status, result.error)
    assert "run_scoped" in result.error and "device kind" not in result.error
