"""A reference file: a row-wise softmax in f32, the task the class-10 softmax candidates are judged
against (``candidates/c10_softmax_no_max.py``; not a candidate itself, so it sits beside the
folder the suite globs). Its example's logits are N(0, 1): no draw near that spread reaches 88.7,
past which exp overflows in f32; the judge's ``wide`` set does (seeds/reference.py)."""

import jax
import jax.numpy as jnp

SMALL = "R=64,C=256"     # the shape the tests run it at


def create_inputs(R=64, C=256):
    return (jax.random.normal(jax.random.key(0), (R, C), jnp.float32),)


def workload(x):
    return jax.nn.softmax(x, axis=-1)
