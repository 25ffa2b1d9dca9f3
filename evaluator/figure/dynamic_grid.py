"""A grid dimension whose size is data (``DynamicGridDim``), counted on the data like a loop.

A ``pallas_call`` may take a grid dimension's size as an operand computed in the program (megablox's
``gmm`` runs as many row tiles as its group metadata say the groups visit). libtpu's estimate
cannot know that size and guesses (137,653 cycles for a grid of 5 row tiles whose static
twin counts 19,475: megablox at M=K=N=256, E=4, libtpu 0.0.42.1), and the HBM traffic model cannot
walk a grid it does not know. So the runner counts it as it counts loops on data (``trips.py``):
the interpreted run records each such size on every input set (:func:`with_data`, which also
records the prefetch operands the traffic model walks), and the
figure of a set is read from a variant of the program whose grid is static at that set's sizes
(:func:`static`), which is the same computation on that set; its traffic is walked on that grid
too (``hbm_traffic.program_traffic``'s ``grid_bounds``). A variant is compiled, never run.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax._src.pallas import core as pallas_core

GRID = "grid"     # the first element of a dynamic dimension's choice path: ("grid", i)


def count(eqn) -> int:
    """How many of a ``pallas_call``'s grid dimensions are operands."""
    return eqn.params["grid_mapping"].num_dynamic_grid_bounds


def prefetch_shapes(eqn) -> list[tuple[int, ...]] | None:
    """The shapes of a ``pallas_call``'s scalar-prefetch operands, where all are integers of 32 bits
    or fewer (their values ride on the count vector, exactly); None otherwise."""
    mapping = eqn.params["grid_mapping"]
    avals = [v.aval for v in eqn.invars[count(eqn):count(eqn) + mapping.num_index_operands]]
    if not all(jnp.issubdtype(a.dtype, jnp.integer) and a.dtype.itemsize <= 4 for a in avals):
        return None
    return [tuple(a.shape) for a in avals]


def with_data(counts, eqn, ins):
    """A kernel's count vector with what it ran on appended: its dynamic grid sizes, then its
    scalar-prefetch operands' values (the index maps read them: the traffic model walks them)."""
    n, shapes = count(eqn), prefetch_shapes(eqn)
    parts = [counts] + [jnp.asarray(b, counts.dtype).reshape(1) for b in ins[:n]]
    if shapes:
        parts += [jnp.asarray(x).astype(counts.dtype).reshape(-1) for x in ins[n:n + len(shapes)]]
    return jnp.concatenate(parts) if len(parts) > 1 else counts


def split(vectors: list, grids: list[int], shapes: list) -> tuple[list, list[list[int]], list]:
    """Each kernel's count vector without what :func:`with_data` appended; its grid sizes; and its
    prefetch operands' values (arrays; None where they were not recorded)."""
    counts, bounds, prefetch = [], [], []
    for vector, n, kernel_shapes in zip(vectors, grids, shapes, strict=True):
        values = np.asarray(vector).reshape(-1).astype(np.int64)
        tail = sum(int(np.prod(s)) for s in kernel_shapes or [])
        end = len(values) - tail
        counts.append([int(x) for x in values[:end - n]])
        bounds.append([int(x) for x in values[end - n:end]])
        arrays, at = [], end
        for shape in kernel_shapes or []:
            size = int(np.prod(shape))
            arrays.append(values[at:at + size].astype(np.int32).reshape(shape))
            at += size
        prefetch.append(arrays if kernel_shapes is not None else None)
    return counts, bounds, prefetch


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
