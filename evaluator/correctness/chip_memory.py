"""Memory as the chip hands it to a kernel: poison in every type, and a DMA's data only at its wait.

**Poison in every type.** Pallas' interpreter fills memory a kernel did not write (scratch, fresh
output blocks, ``run_scoped`` buffers, the padding of ragged blocks) with ``uninitialized_value``:
NaN for floats, but the type's minimum for integers (0 for ``uint32``, ``0x80000000`` for
``int32``, which reads as -0.0 in f32). An f32 accumulator kept in a ``uint32`` scratch and
bitcast at each use, never zeroed, then starts from 0.0 in the check and from whatever the buffer
held on a TPU. :func:`poison` fills every such buffer with one bit pattern per word that is a NaN
read as any float type of its width or half of it (``0x7FC17FC1`` per 32-bit word: a NaN as f32,
and each 16-bit half ``0x7FC1`` a NaN as bf16 and as f16; ``0xFF`` per byte, a NaN as
``float8_e4m3fn`` and ``float8_e5m2``) and not zero read as any integer type. Semaphores keep 0
(a TPU semaphore starts at 0 by contract); booleans keep False.

**A DMA's destination is undefined until its wait.** Pallas' interpreter performs a local
``make_async_copy`` in full at ``start()``, so a kernel that reads the destination between
``start()`` and ``wait()`` is checked on complete data, where a TPU reads a buffer the DMA is
still filling. :func:`installed` swaps the two discharge rules: ``start()`` fills the destination
window with poison (and signals its semaphore as before), and ``wait()`` lands the copy, reading
the source window its descriptor names. A wait must therefore name the copy it waits for (its
source and destination windows, as JAX's own kernels do: they rebuild the same descriptor); a
wait through a stand-in descriptor of another window leaves the started window poisoned, and the
kernel fails its check. Copies to another chip (a ``device_id``) keep Pallas' rule.
What it cannot see: a kernel that writes a DMA's *source* between its start and its wait (a race
on a TPU too) is checked on the source as it is at the wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np
from jax import lax

# One word of poison per width in bytes: a NaN in every float type of that width (and of half of
# it), never zero as an integer.
_PATTERN = {4: (0x7FC17FC1, np.uint32), 2: (0x7FC1, np.uint16), 1: (0xFF, np.uint8)}


def poison(shape, dtype):
    """An array of ``shape`` and ``dtype`` that no kernel may rely on: see the module's docstring."""
    from jax._src.pallas import core as pallas_core

    if is_semaphore(dtype):
        return jnp.zeros(shape, pallas_core.SEMAPHORE_INTERPRET_DTYPE)
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return jnp.zeros(shape, dtype)
    if "fnuz" in dtype.name:        # these float8 types have one NaN, 0x80
        return jnp.full(shape, jnp.nan, dtype)
    pattern = _PATTERN.get(dtype.itemsize)
    if pattern is None or dtype.name.startswith(("int4", "uint4", "int2", "uint2", "float4")):
        return _pallas_uninitialized(shape, dtype)      # sub-byte and 64-bit types: Pallas' value
    bits, carrier = pattern
    return lax.bitcast_convert_type(jnp.full(shape, bits, carrier), dtype)


def is_semaphore(dtype) -> bool:
    """Whether ``dtype`` is a Pallas semaphore type."""
    from jax._src.pallas import core as pallas_core

    try:
        return jnp.issubdtype(dtype, pallas_core.semaphore_dtype)
    except TypeError:
        return False


def _pallas_uninitialized(shape, dtype):
    from jax._src.pallas import primitives

    return _ORIGINAL["uninitialized_value"](shape, dtype) if "uninitialized_value" in _ORIGINAL \
        else primitives.uninitialized_value(shape, dtype)


_ORIGINAL: dict = {}


def _uninitialized(shape, dtype):
    """Pallas' ``uninitialized_value``, poisoned (the replacement :func:`installed` puts in place)."""
    return poison(shape, dtype)


def _dma_start(should_discharge, in_avals, out_avals, *args, tree, device_id_type, priority, add):
    """``dma_start`` discharged as a TPU sees it: the destination window is poison until the wait
    (its semaphore is signalled as Pallas signals it). A copy to another chip keeps Pallas' rule."""
    from jax._src.pallas.mosaic import primitives as tpu

    new_vals, extra = _ORIGINAL["dma_start"](should_discharge, in_avals, out_avals, *args, tree=tree,
                                             device_id_type=device_id_type, priority=priority, add=add)
    if tpu._dma_unflatten(tree, args)[4] is not None:
        return new_vals, extra
    return _write_window(new_vals, should_discharge, in_avals, args, tree, fill="poison"), extra


def _dma_wait(should_discharge, in_avals, out_avals, *args, tree, device_id_type, insert_dummy_device):
    """``dma_wait`` discharged as a TPU sees it: the copy lands here, from the source window the
    descriptor names, and the semaphore is waited on as Pallas waits on it."""
    from jax._src.pallas.mosaic import primitives as tpu

    new_vals, extra = _ORIGINAL["dma_wait"](should_discharge, in_avals, out_avals, *args, tree=tree,
                                            device_id_type=device_id_type,
                                            insert_dummy_device=insert_dummy_device)
    if tpu._dma_unflatten(tree, args)[4] is not None:
        return new_vals, extra
    return _write_window(new_vals, should_discharge, in_avals, args, tree, fill="source"), extra


def _write_window(new_vals, should_discharge, in_avals, args, tree, *, fill: str) -> tuple:
    """``new_vals`` (what Pallas' rule made) with the DMA's destination window written with
    ``fill``: ``poison`` (at a start) or the source window's values (at a wait)."""
    from jax._src.pallas.mosaic import primitives as tpu
    from jax._src.state import discharge as state_discharge
    from jax._src.state import primitives as sp

    src, dst, *_ = tpu._dma_unflatten(tree, args)
    src_ref, src_transforms = tpu._get_ref_and_transforms(src)
    dst_ref, dst_transforms = tpu._get_ref_and_transforms(dst)
    # Both rules lay their values out as (src, *its transforms, dst, *its transforms, semaphores...).
    at = len(tpu._dma_tree_leaves(tpu._dma_unflatten(tree, in_avals)[0]))
    discharged = bool(tpu._get_ref(tpu._dma_unflatten(tree, should_discharge)[1]))
    new_vals = list(new_vals)
    current = (new_vals[at] if new_vals[at] is not None else dst_ref) if discharged else dst_ref[...]
    window = state_discharge.transform_array(current, dst_transforms)
    if fill == "poison":
        data = poison(window.shape, window.dtype)
    else:
        data = state_discharge.transform_array(src_ref[...], src_transforms).astype(window.dtype)
    _, updated = state_discharge.transform_swap_array(current, dst_transforms, data)
    if discharged:
        new_vals[at] = updated
    else:
        sp.ref_set(dst_ref, None, updated)
    return tuple(new_vals)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Within the block, the interpreter poisons what a kernel did not write and lands a DMA at
    its wait (see the module's docstring)."""
    from jax._src.pallas import primitives
    from jax._src.pallas.mosaic import primitives as tpu
    from jax._src.state import discharge as state_discharge

    rules = state_discharge._partial_discharge_rules
    saved = {"uninitialized_value": primitives.uninitialized_value,
             "dma_start": rules[tpu.dma_start_p], "dma_wait": rules[tpu.dma_wait_p]}
    _ORIGINAL.update(saved)
    primitives.uninitialized_value = _uninitialized
    rules[tpu.dma_start_p], rules[tpu.dma_wait_p] = _dma_start, _dma_wait
    try:
        yield
    finally:
        primitives.uninitialized_value = saved["uninitialized_value"]
        rules[tpu.dma_start_p], rules[tpu.dma_wait_p] = saved["dma_start"], saved["dma_wait"]
