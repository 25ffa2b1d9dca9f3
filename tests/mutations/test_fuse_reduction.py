"""fuse_reduction: a sum or mean the wrapper takes of the kernel's output becomes per-block partial
sums the kernel writes, so the output never reaches HBM.

A Huber loss written as people write it (the elementwise loss in the kernel, ``jnp.mean`` after the
pallas_call) in each style the operator reads: the pallas_call inline in the entry, its call used in
place, a wrapper called by the entry, a ``Model.forward`` method (its kernel at module level or
defined in it); each rewritten kernel, run in
Pallas' TPU interpret mode on the CPU, gives the original's loss. So does a sum whose output blocks
an "arbitrary" axis revisits (a matmul's K steps), and a block that is not (8, 128)-aligned. The
judge (the TPU compiler for v5e, the secret draws) passes the rewritten Huber loss and counts fewer
cycles. Where the move is not proved, the operator says which rule failed."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from mutations import get_operator

from .kernel_check import load_kernel

OP = get_operator("fuse_reduction")


@dataclasses.dataclass(frozen=True)
class Entry:
    """A task as the operators read it: its entry point's name."""

    entry: str


HEAD = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

DELTA = 1.0


def _huber_kernel(p_ref, t_ref, o_ref):
    d = p_ref[...].astype(jnp.float32) - t_ref[...].astype(jnp.float32)
    a = jnp.abs(d)
    o_ref[...] = jnp.where(a <= DELTA, 0.5 * d * d, DELTA * (a - 0.5 * DELTA)).astype(o_ref.dtype)
'''

INLINE = HEAD + '''

def huber_loss(pred, target):
    m, n = pred.shape
    block = (128, 256)
    loss = pl.pallas_call(
        _huber_kernel,
        grid=(m // block[0], n // block[1]),
        in_specs=[pl.BlockSpec(block, lambda i, j: (i, j)), pl.BlockSpec(block, lambda i, j: (i, j))],
        out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), pred.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(pred, target)
    return jnp.mean(loss)
'''

IN_PLACE = HEAD + '''

def huber_loss(pred, target):
    m, n = pred.shape
    bm, bn = 64, 256
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return jnp.sum(pl.pallas_call(
        _huber_kernel,
        grid=(m // bm, n // bn),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((m, n), pred.dtype),
    )(pred, target)) / (m * n)
'''

WRAPPER = HEAD + '''

def huber(pred, target, block_m=64):
    m, n = pred.shape
    return pl.pallas_call(
        _huber_kernel,
        grid=(m // block_m,),
        in_specs=[pl.BlockSpec((block_m, n), lambda i: (i, 0)), pl.BlockSpec((block_m, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_m, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), pred.dtype),
    )(pred, target)


def huber_loss(pred, target):
    return jnp.mean(huber(pred, target))
'''

METHOD = HEAD + '''

class Model:
    def __init__(self, delta=1.0):
        self.delta = delta

    def forward(self, pred, target):
        m, n = pred.shape
        block = (128, 128)
        out = pl.pallas_call(
            _huber_kernel,
            grid=(m // block[0], n // block[1]),
            in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))] * 2,
            out_specs=pl.BlockSpec(block, lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), pred.dtype),
        )(pred, target)
        return out.mean()
'''

# A method whose kernel is defined in its body, the call in place.
NESTED = HEAD.split("\n\ndef _huber_kernel")[0] + '''


class Model:
    def forward(self, pred, target):
        def kernel(p_ref, t_ref, o_ref):
            d = p_ref[...] - t_ref[...]
            o_ref[...] = jnp.where(jnp.abs(d) <= DELTA, 0.5 * d * d, DELTA * (jnp.abs(d) - 0.5 * DELTA))

        m, n = pred.shape
        return jnp.mean(pl.pallas_call(
            kernel,
            grid=(m // 128,),
            in_specs=[pl.BlockSpec((128, n), lambda i: (i, 0))] * 2,
            out_specs=pl.BlockSpec((128, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((m, n), pred.dtype),
        )(pred, target))
'''

# A sum over an "arbitrary" axis: each output block is revisited over K and stored at its last step.
MATMUL_SUM = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _mm_kernel(x_ref, w_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def total(x, w):
    m, k = x.shape
    n = w.shape[1]
    y = pl.pallas_call(
        _mm_kernel,
        grid=(m // 128, n // 128, k // 128),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, w)
    return jnp.sum(y)
'''

STYLES = {"inline": (INLINE, "huber_loss"), "in_place": (IN_PLACE, "huber_loss"),
          "wrapper": (WRAPPER, "huber_loss"), "method": (METHOD, "Model.forward"),
          "nested_kernel": (NESTED, "Model.forward")}


def _run(source: str, entry: str, *args):
    """``entry`` of ``source`` on ``args`` in Pallas' TPU interpret mode (on the CPU)."""
    from jax.experimental.pallas import tpu as pltpu

    module = load_kernel(source)
    fn = module.Model().forward if entry == "Model.forward" else getattr(module, entry)
    with pltpu.force_tpu_interpret_mode():
        return np.asarray(fn(*args)).astype(np.float64)


def _inputs(shape, dtype="float32"):
    import jax
    import jax.numpy as jnp

    kp, kt = jax.random.split(jax.random.key(0))
    return (jax.random.normal(kp, shape, jnp.float32).astype(dtype) * 2,
            jax.random.normal(kt, shape, jnp.float32).astype(dtype) * 2)


def _huber_mean(pred, target) -> float:
    d = np.asarray(pred, np.float64) - np.asarray(target, np.float64)
    a = np.abs(d)
    return float(np.mean(np.where(a <= 1.0, 0.5 * d * d, a - 0.5)))


@pytest.mark.parametrize("style", list(STYLES))
def test_each_style_is_rewritten_and_gives_the_original_loss(style):
    source, entry = STYLES[style]
    result = OP.apply(source, Entry(entry), random.Random(0))
    assert result.applied, result.reason
    out = result.source
    assert "o_ref[...] = _reduction_block_partial(" in out and "out_specs=_partial_spec" in out
    assert ", *, pre_dtype):" in out
    assert "jnp.mean(" not in out.split("def _reduction_total")[1] and ".mean()" not in out
    assert OP.check(out, Entry(entry)).reason == "the kernel's reduction is already fused"
    pred, target = _inputs((256, 512))
    want = _run(source, entry, pred, target)
    assert abs(want - _huber_mean(pred, target)) < 1e-5
    assert abs(_run(out, entry, pred, target) - want) <= 1e-6 * abs(want)


def test_the_huber_loss_is_rewritten_as_partial_sums_and_a_total():
    out = OP.apply(INLINE, Entry("huber_loss"), random.Random(0)).source
    entry = out.split("def huber_loss")[1]
    assert "_pre = jax.ShapeDtypeStruct((m, n), pred.dtype)\n" in entry
    assert ("_partial_shape, _partial_spec = _reduction_partials(_pre, pl.BlockSpec(block, lambda i, j: (i, j)))"
            in entry)
    assert "functools.partial(_huber_kernel, pre_dtype=_pre.dtype)" in entry and "out_shape=_partial_shape" in entry
    assert entry.rstrip().endswith("return _reduction_total(loss, _pre, mean=True)")
    kernel = out.split("def _huber_kernel")[1].split("\ndef ")[0]
    assert "(p_ref, t_ref, o_ref, *, pre_dtype):" in kernel
    # the wrapper's own division stays; the wrapper-called style returns the total from the wrapper
    in_place = OP.apply(IN_PLACE, Entry("huber_loss"), random.Random(0)).source
    assert "_pre, mean=False) / (m * n)" in in_place
    wrapped = OP.apply(WRAPPER, Entry("huber_loss"), random.Random(0)).source
    assert "def huber_loss(pred, target):\n    return huber(pred, target)" in wrapped


def test_a_bf16_output_is_rounded_as_it_was_stored():
    pred, target = _inputs((256, 512), "bfloat16")
    result = OP.apply(INLINE, Entry("huber_loss"), random.Random(0))
    want = _run(INLINE, "huber_loss", pred, target)
    assert abs(_run(result.source, "huber_loss", pred, target) - want) <= 1e-2 * abs(want)


def test_blocks_an_arbitrary_axis_revisits_give_the_same_sum():
    import jax
    import jax.numpy as jnp

    result = OP.apply(MATMUL_SUM, Entry("total"), random.Random(0))
    assert result.applied, result.reason
    x = jax.random.normal(jax.random.key(1), (256, 384), jnp.float32)
    w = jax.random.normal(jax.random.key(2), (384, 256), jnp.float32)
    want = float(np.sum(np.asarray(x, np.float64) @ np.asarray(w, np.float64)))
    got = _run(result.source, "total", x, w)
    assert abs(got - _run(MATMUL_SUM, "total", x, w)) <= 1e-5 * np.abs(np.asarray(x) @ np.asarray(w)).sum()
    assert abs(got - want) <= 1e-4 * np.abs(np.asarray(x) @ np.asarray(w)).sum()


def test_a_block_that_is_not_8_by_128_aligned_adds_up_to_one_cell():
    source = WRAPPER.replace("block_m=64", "block_m=4")
    result = OP.apply(source, Entry("huber_loss"), random.Random(0))
    pred, target = _inputs((16, 200))
    assert abs(_run(result.source, "huber_loss", pred, target) - _huber_mean(pred, target)) < 1e-5


@pytest.mark.parametrize("old, new, why", [
    ("return jnp.mean(loss)", "return jnp.mean(loss), loss", "used nowhere else"),
    ("return jnp.mean(loss)", "return jnp.mean(loss, axis=0)", "not summed whole"),
    ("return jnp.mean(loss)", "return jnp.max(loss)", "not summed whole"),
    ("return jnp.mean(loss)", "return loss", "no reduction to move"),
    ("    o_ref[...] = jnp.where(", "    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype) + jnp.where(",
     "reads its output block's shape"),
    ("    o_ref[...] = jnp.where(", "    o_ref[...] = jnp.zeros_like(o_ref)\n    o_ref[...] += jnp.where(",
     "accumulates into its output block"),
    ("    o_ref[...] = jnp.where(", "    o_ref[0:8, :] = jnp.where(", "reads, slices or hands on its output block"),
])
def test_it_refuses_what_it_cannot_prove(old, new, why):
    assert old in INLINE
    check = OP.check(INLINE.replace(old, new), Entry("huber_loss"))
    assert not check.ok and why in check.reason, check.reason


def test_a_wrapper_called_twice_is_left_alone():
    source = WRAPPER.replace("return jnp.mean(huber(pred, target))",
                             "return jnp.mean(huber(pred, target)) + jnp.mean(huber(target, pred))")
    check = OP.check(source, Entry("huber_loss"))
    assert not check.ok and "must be called exactly once" in check.reason


HUBER_REFERENCE = '''
import jax
import jax.numpy as jnp

M, N = 1024, 2048


def create_inputs():
    kp, kt = jax.random.split(jax.random.key(0))
    return (jax.random.normal(kp, (M, N), jnp.float32) * 2, jax.random.normal(kt, (M, N), jnp.float32) * 2)


def workload(pred, target):
    d = pred - target
    a = jnp.abs(d)
    return jnp.mean(jnp.where(a <= 1.0, 0.5 * d * d, a - 0.5))
'''


@pytest.mark.judge
def test_the_rewritten_huber_loss_passes_the_judge_in_fewer_cycles(judge, tmp_path):
    """The TPU compiler (v5e) takes the partial sums' (8, 128) blocks; the secret draws pass; the
    loss array no longer makes its trip through HBM (measured at 1024 x 2048 f32: 46,096 cycles as
    written, 30,853 rewritten; 0.67x and 1.00x the XLA program)."""
    from seeds.reference import Task

    (tmp_path / "reference.py").write_text(HUBER_REFERENCE)
    source = INLINE.replace("block = (128, 256)", "block = (256, 512)")
    task = Task.read(tmp_path / "reference.py", source, entry="huber_loss")
    fused = OP.apply(source, task, random.Random(0))
    assert fused.applied, fused.reason
    before, after = judge.evaluate(source, task), judge.evaluate(fused.source, task)
    assert before.status.value == "PASS" and after.status.value == "PASS", (before.error, after.error)
    assert after.metrics.estimated_cycles < 0.8 * before.metrics.estimated_cycles
