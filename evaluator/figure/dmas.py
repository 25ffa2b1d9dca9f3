"""A kernel's own DMAs, counted on the data: the bytes it really copies to and from HBM.

A kernel may leave an operand in HBM (``memory_space=ANY``) and copy what it needs itself
(``pltpu.make_async_copy``; ragged paged attention copies each sequence's pages). The traffic
model (``hbm_traffic.py``) reads the pipeline's blocks from the Mosaic module, but not these
copies: how many run depends on the data. So the trusted runner counts them where it counts loop
trips (``trips.py``): every ``dma_start`` of the kernel's jaxpr is found here with the bytes it
moves (its source window's shape, from the jaxpr the runner rebuilt, never from anything the
candidate declares), a marker is placed after it (:func:`mark`), and the interpreted run on the
timing input counts how often each marker was passed. A copy counts toward HBM traffic when its
source or destination is in HBM; VMEM-to-VMEM copies do not.

Every ``dma_wait`` is counted the same way, with the bytes of the copy it waits for (its own
descriptor's window). On a TPU a copy started and never waited for is a race (the kernel may read
the buffer before the data lands; the interpreter copies at once, so the check cannot see it) and
a wait without its start never returns; and the estimate would count neither wait. So the bytes
started must equal the bytes waited for on the timing input (:func:`counted` says when not, and
the figure is refused).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore
from jax._src import tree_util
from jax._src.interpreters import mlir

from evaluator.program.jaxpr_tools import find

# The marker: an identity on a scalar, whose only purpose is to be counted by counting.count_eval.
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
    kind: str = "start"        # or "wait"


def mark(slot: int) -> None:
    """Place marker ``slot`` here (inside a kernel being traced again)."""
    MARK.bind(jnp.int32(0), slot=slot)


def _space(aval) -> str:
    space = getattr(aval, "memory_space", None)
    return str(getattr(space, "value", space) or "").lower()


def _dma(eqn, path, kind: str = "start") -> Dma:
    from jax._src.state import types as state_types

    args = tree_util.tree_unflatten(eqn.params["tree"], [v.aval for v in eqn.invars])
    src, dst = args[0], args[1]          # TransformedRefs (the ref's aval and its windows)
    src_ref, dst_ref = getattr(src, "ref", src), getattr(dst, "ref", dst)
    transforms = tuple(getattr(src, "transforms", ()))
    window = state_types.transform_type(transforms, src_ref) if transforms else src_ref
    shape = tuple(int(d) for d in window.shape)
    size = math.prod(shape) * np.dtype(window.dtype).itemsize
    return Dma(path, size, _space(src_ref) in _HBM or _space(dst_ref) in _HBM, shape, str(window.dtype), kind)


def dmas(jaxpr: jcore.Jaxpr) -> list[Dma]:
    """Every ``dma_start`` of a kernel jaxpr, then every ``dma_wait``, each in pre-order (the paths
    ``variants.spec_eval`` uses)."""
    return [_dma(eqn, path, kind) for kind in ("start", "wait")
            for path, eqn in find(jaxpr, lambda e, k=kind: e.primitive.name == f"dma_{k}")]


def marks(jaxpr: jcore.Jaxpr) -> list[tuple[tuple[int, ...], int]]:
    """(path, slot) of every marker in a (discharged) kernel jaxpr."""
    return [(path, int(eqn.params["slot"])) for path, eqn in find(jaxpr, lambda e: e.primitive is MARK)]


def counted(kernel_dmas: list[list[Dma]], passes: list[list[int]]) -> dict:
    """The HBM bytes of every kernel's DMAs as started on the timing input, each DMA's count, and
    the bytes started and waited for (``passes``: how often each start and wait ran)."""
    total, rows = 0, []
    moved = {"start": 0, "wait": 0}
    for k, (found, counts) in enumerate(zip(kernel_dmas, passes, strict=True)):
        for d, n in zip(found, counts, strict=True):
            moved[d.kind] += d.bytes * int(n)
            if d.kind == "wait":
                continue
            total += d.bytes * n if d.hbm else 0
            rows.append({"kernel": k, "path": list(d.path), "shape": list(d.shape), "dtype": d.dtype,
                         "bytes_per_start": d.bytes, "starts": int(n), "hbm": d.hbm})
    return {"dma_bytes": total, "dmas": rows, "dma_started_bytes": moved["start"], "dma_waited_bytes": moved["wait"]}


def unbalanced(facts: dict) -> str | None:
    """Why the kernels' own DMAs, as they ran on the timing input, would not run on a TPU: bytes
    started and never waited for, or waited for and never started. None when they balance."""
    started, waited = facts.get("dma_started_bytes"), facts.get("dma_waited_bytes")
    if started is None or waited is None or started == waited:
        return None
    return (f"the kernel's own DMAs started {started:,} bytes and waited for {waited:,} on the timing "
            "input: on a TPU a copy never waited for is a race and a wait without its copy never "
            "returns; wait for every copy the kernel starts, and only for those")
