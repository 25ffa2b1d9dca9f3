"""The model-sized check's units (seeds/units.py): bases computed a group at a time give what
one at a time gives, and the group follows the memory a unit adds, not what every call needs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from seeds import units

os.environ.setdefault("JAX_PLATFORMS", "cpu")      # group_for compiles, as the children do, on the CPU


@pytest.mark.parametrize("group", [1, 2, 3, 7])
def test_bases_a_group_at_a_time_land_where_one_at_a_time_do(group):
    rng = np.random.default_rng(1)
    assign = units.assignment(rng, 6 * 4, 5)
    bases = rng.standard_normal((5, 3, 2))
    (x,) = units.expand([bases], [[1, 3]], [6, 4], assign)      # units on axes 1 and 3
    w = rng.standard_normal((3, 2))                              # no units: whole in every call
    calls = []

    def per_unit(a, weights):
        calls.append(a.shape)
        return np.einsum("iujv,ij->uv", a, weights)              # independent along its unit axes

    found = units.per_base(per_unit, [x, w], [[1, 3], []], [0, 1], [6, 4], group)
    assert np.allclose(found, per_unit(x, w))
    assert calls[:-1] == [(3, n, 2, 1) for n in [group] * (5 // group) + [5 % group] * bool(5 % group)]


def test_the_group_is_what_the_memory_a_unit_adds_allows():
    weights = 6 << 30                                            # the same for any number of units
    assert units.group_size(lambda n: weights + n * (1 << 20), 35) == 35      # 1 MiB a unit: all at once
    assert units.group_size(lambda n: n * (100 << 20), 35) == 2               # 100 MiB a unit: two
    assert units.group_size(lambda n: n * (1 << 30), 35) == 1                 # past the budget: one
    assert units.group_size(lambda n: 1 / 0, 1) == 1                          # one base: nothing asked


def test_the_group_is_read_from_what_xla_compiles():
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    tokens = units.expand([rng.standard_normal((9, 64), np.float32)], [[0]], [40], units.assignment(rng, 40, 9))[0]
    weights = rng.standard_normal((64, 4096), np.float32)

    def projection(x, w):                              # each unit adds 16 KiB: all nine at once
        return x @ w

    def outer(x, w):                                   # each unit adds 64 x 4096 x 512 f32: 512 MiB
        return x[:, :, None, None] * w[None, :, :, None] * w[None, :, None, :512]
    assert units.group_for(projection, [tokens, jnp.asarray(weights)], [[0], []]) == 9
    assert units.group_for(outer, [tokens, jnp.asarray(weights)], [[0], []]) == 1
