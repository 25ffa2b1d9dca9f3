"""A kernel's own DMAs, counted on the timing input: the bytes it really copies to and from HBM.

A kernel may leave an operand in HBM (``memory_space=ANY``) and copy what it needs itself
(``pltpu.make_async_copy``; ragged paged attention copies each sequence's pages). The traffic
model (``hbm_traffic.py``) reads the pipeline's blocks from the Mosaic module, but not these
copies: how many run depends on the data. So the trusted runner counts them where it counts loop
trips (``trips.py``): every ``dma_start`` of the kernel's jaxpr is found here with the bytes it
moves (its source window's shape, from the jaxpr the runner rebuilt, never from anything the
candidate declares), a marker is placed after it (:func:`mark`), and the interpreted run on the
timing input counts how often each marker was passed. A copy counts toward HBM traffic when its
source or destination is in HBM; VMEM-to-VMEM copies do not.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src import tree_util
from jax._src.interpreters import mlir

from evaluator.jaxpr_tools import find

# The marker: an identity on a scalar, whose only purpose is to be counted by trips.count_eval.
MARK = jcore.Primitive("pallas_evolve_dma_mark")
MARK.def_impl(lambda x, *, slot: x)
MARK.def_abstract_eval(lambda x, *, slot: x)
mlir.register_lowering(MARK, lambda ctx, x, *, slot: [x])

_HBM = ("any", "hbm")


@dataclasses.dataclass(frozen=True)
class Dma:
    """One ``dma_start`` of a kernel: where it sits, what one start moves, and between where."""

    path: tuple[int, ...]
    bytes: int
    hbm: bool
    shape: tuple[int, ...]
    dtype: str


def mark(slot: int) -> None:
    """Place marker ``slot`` here (inside a kernel being traced again)."""
    MARK.bind(jnp.int32(0), slot=slot)


def _space(aval) -> str:
    space = getattr(aval, "memory_space", None)
    return str(getattr(space, "value", space) or "").lower()


def _dma(eqn, path) -> Dma:
    from jax._src.state import types as state_types

    args = tree_util.tree_unflatten(eqn.params["tree"], [v.aval for v in eqn.invars])
    src, dst = args[0], args[1]          # TransformedRefs (the ref's aval and its windows)
    src_ref, dst_ref = getattr(src, "ref", src), getattr(dst, "ref", dst)
    transforms = tuple(getattr(src, "transforms", ()))
    window = state_types.transform_type(transforms, src_ref) if transforms else src_ref
    shape = tuple(int(d) for d in window.shape)
    size = math.prod(shape) * np.dtype(window.dtype).itemsize
    return Dma(path, size, _space(src_ref) in _HBM or _space(dst_ref) in _HBM, shape, str(window.dtype))


def dmas(jaxpr: jcore.Jaxpr) -> list[Dma]:
    """Every ``dma_start`` of a kernel jaxpr, in pre-order (the paths ``variants.spec_eval`` uses)."""
    return [_dma(eqn, path) for path, eqn in find(jaxpr, lambda e: e.primitive.name == "dma_start")]


def marks(jaxpr: jcore.Jaxpr) -> list[tuple[tuple[int, ...], int]]:
    """(path, slot) of every marker in a (discharged) kernel jaxpr."""
    return [(path, int(eqn.params["slot"])) for path, eqn in find(jaxpr, lambda e: e.primitive is MARK)]


def counted(kernel_dmas: list[list[Dma]], starts: list[list[int]]) -> dict:
    """The HBM bytes of every kernel's DMAs as started on the timing input, and each DMA's count."""
    total, rows = 0, []
    for k, (found, counts) in enumerate(zip(kernel_dmas, starts, strict=True)):
        for d, n in zip(found, counts, strict=True):
            total += d.bytes * n if d.hbm else 0
            rows.append({"kernel": k, "path": list(d.path), "shape": list(d.shape), "dtype": d.dtype,
                         "bytes_per_start": d.bytes, "starts": int(n), "hbm": d.hbm})
    return {"dma_bytes": total, "dmas": rows}
