"""A grid dimension whose size is data (``DynamicGridDim``): carried on the wire, checked in the
interpreter, and counted on the data (``figure/dynamic_grid.py``), never the estimate's guess."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src.pallas import core as pallas_core
from jax.experimental import pallas as pl

from evaluator.judge import Judge, JudgeConfig
from evaluator.program import wire
from evaluator.result import Status
from seeds import reference_seed

REFERENCE = '''
import numpy as np

def create_inputs(R=2048, C=512):
    return (np.random.default_rng(0).standard_normal((R, C)).astype(np.float32),)

def workload(x):
    return x * 2.0 + 1.0
'''

# The grid's size is worked out from the data at run time (always R / 64 on finite inputs): a
# dynamic grid dimension. HONEST: the same kernel with that size as a constant.
KERNEL = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

HONEST = False


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def scale(x):
    rows, cols = x.shape
    steps = rows // 64 if HONEST else (jnp.sum(x[:8] * 0.0) + rows // 64).astype(jnp.int32)
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(steps,),
                          in_specs=[pl.BlockSpec((64, cols), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((64, cols), lambda i: (i, 0)))(x)
'''


def test_the_marker_travels_as_the_runners_own_singleton():
    def f(x):
        n = (x[0, 0] * 0 + 2).astype(jnp.int32)
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                              in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)

    closed = jax.make_jaxpr(f)(jnp.ones((16, 128), jnp.float32))
    back = wire.loads(wire.dumps(closed))
    grids = [e.params["grid_mapping"].grid for e in back.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(grids) == 1 and grids[0][0] is pallas_core.dynamic_grid_dim


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    where = tmp_path_factory.mktemp("dynamic")
    (where / "ref.py").write_text(REFERENCE)
    seed = reference_seed(where / "ref.py")
    judge = Judge(JudgeConfig(workers=1, cache_dir=str(where / "cache")))
    out = {}
    for name, source in (("dynamic", KERNEL), ("static", KERNEL.replace("HONEST = False", "HONEST = True"))):
        task = seed.read_task(source)
        out[name] = judge.evaluate(source, task)
    return out


def test_without_counting_a_dynamic_grid_has_no_figure(tmp_path):
    (tmp_path / "ref.py").write_text(REFERENCE)
    task = reference_seed(tmp_path / "ref.py").read_task(KERNEL)
    timing, _ = Judge(JudgeConfig(workers=1, cache_dir=str(tmp_path / "cache"))).estimate_timing(KERNEL, task)
    assert timing.cycles is None and "dynamic grid" in timing.error


def test_a_dynamic_grid_is_counted_on_the_data_as_its_static_twin_is(judged):
    dynamic, static = judged["dynamic"], judged["static"]
    assert static.status is Status.PASS and dynamic.status is Status.PASS, (static.error, dynamic.error)
    # The same blocks at the same count, plus the ops that work the count out (kept and counted, not
    # dropped with the size operand): above the twin, and not the estimate's guess for a grid it
    # cannot see.
    assert dynamic.metrics.hbm_bytes >= static.metrics.hbm_bytes
    ratio = dynamic.metrics.estimated_cycles / static.metrics.estimated_cycles
    assert 1.0 < ratio <= 1.10, (dynamic.metrics.estimated_cycles, static.metrics.estimated_cycles)
