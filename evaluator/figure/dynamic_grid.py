"""A grid dimension whose size is data (``DynamicGridDim``), counted on the data like a loop.

A ``pallas_call`` may take a grid dimension's size as an operand computed in the program (megablox's
``gmm`` runs as many row tiles as its group metadata say the groups visit). libtpu's estimate
cannot know that size and guesses (137,653 cycles for a grid of 5 row tiles whose static
twin counts 19,475: megablox at M=K=N=256, E=4, libtpu 0.0.42.1), and the HBM traffic model cannot
walk a grid it does not know. So the runner counts it as it counts loops on data (``trips.py``):
the interpreted run records each such size on every input set (:func:`with_bounds`), and the
figure of a set is read from a variant of the program whose grid is static at that set's sizes
(:func:`static`), which is the same computation on that set; its traffic is walked on that grid
too (``hbm_traffic.program_traffic``'s ``grid_bounds``). A variant is compiled, never run.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax._src.pallas import core as pallas_core

GRID = "grid"     # the first element of a dynamic dimension's choice path: ("grid", i)


def count(eqn) -> int:
    """How many of a ``pallas_call``'s grid dimensions are operands."""
    return eqn.params["grid_mapping"].num_dynamic_grid_bounds


def with_bounds(counts, eqn, ins):
    """A kernel's count vector with its dynamic grid sizes on this input appended."""
    n = count(eqn)
    if not n:
        return counts
    return jnp.concatenate([counts, jnp.stack([jnp.asarray(b, counts.dtype) for b in ins[:n]])])


def split(vectors: list, grids: list[int]) -> tuple[list, list[list[int]]]:
    """Each kernel's count vector without its trailing grid sizes, and the sizes."""
    counts, bounds = [], []
    for vector, n in zip(vectors, grids, strict=True):
        values = [int(x) for x in vector]
        counts.append(values[:len(values) - n])
        bounds.append(values[len(values) - n:])
    return counts, bounds


def choice(bounds: list[list[int]]) -> dict[tuple, int]:
    """The variant choice that makes every dynamic grid static at ``bounds``."""
    return {(k, (GRID, i)): b for k, sizes in enumerate(bounds) for i, b in enumerate(sizes)}


def static(eqn, ins: list, sizes: dict[int, int]):
    """``(eqn, ins)`` with the kernel's grid static: dynamic dimension i at ``sizes[i]``, and its
    size operand dropped."""
    mapping = eqn.params["grid_mapping"]
    n = count(eqn)
    if not n:
        return eqn, ins
    if sorted(sizes) != list(range(n)) or any(s < 1 for s in sizes.values()):
        from evaluator.figure.variants import Uncountable

        raise Uncountable(f"a dynamic grid of sizes {sizes}: a variant needs each of its {n} dimensions at 1 or more")
    given = iter(sizes[i] for i in range(n))
    grid = tuple(next(given) if pallas_core.is_dynamic_dim(d) else d for d in mapping.grid)
    fixed = eqn.replace(invars=eqn.invars[n:], params=dict(eqn.params, grid_mapping=mapping.replace(grid=grid)))
    return fixed, ins[n:]
