"""The interpret-mode grid loop, without copying the operands at every grid step.

Pallas' HLO interpreter (``interpret=True``) runs a ``pallas_call`` as an XLA while loop over the
grid whose carry holds *every* operand: each step slices its blocks out of the whole arrays, runs
the kernel on them and writes every block back, inputs included. An input written back is no
longer a loop invariant, so XLA copies each whole operand at every step: a step costs time in
proportion to the operands' size, not the block's. At decode sizes (a 512 MB KV cache, 4,096 grid
steps) one check took 200 s, nearly all of it in memcpy. (Where the cost is the number of steps,
not the operands' size, it is not this: JAX's flash attention at 128 blocks on H=32, 8,192 steps,
takes 16 s a set either way.)

:func:`grid_loop` is the same loop, with the same semantics, that carries only what a step can
change: the outputs, the scratch buffers and any input block the kernel writes (the discharged
kernel returns such a block as a new value; an input it only reads comes back as the very
variable it went in as). Every other input is read in place. One deliberate difference: a value
the kernel writes to a scalar-prefetch operand is kept for the next grid step, as SMEM keeps it
on the chip (Pallas' loop drops it; ragged paged attention passes the sequence it stopped at to
the next step that way, and without it every step walked all sequences from the first). The
kernel is discharged and evaluated exactly as Pallas does it (its own ``kernel_to_hlo_jaxpr``,
block index maps, NaN-filled uninitialised buffers, padding of ragged blocks), so a kernel
computes the same values, bit for bit (``tests/evaluator/correctness/test_interpret.py`` holds it to that on
every seed).

**The TPU's pipeline, not the interpreter's arrays.** Pallas' loop carries whole arrays, so a
kernel that leaves an output block and comes back to it later reads what it wrote there, and an
input block it wrote and revisits keeps its writes. A TPU does neither: an output block is written
back to HBM when its index changes and the next visit starts in a buffer that holds something
else (JAX's documentation of output revisiting: undefined), and an input block is fetched afresh
from HBM when its index changes (what the kernel wrote to its buffer is gone). So here, for every
operand the pipeline moves (a block in VMEM or SMEM; not one left in HBM, ``memory_space=ANY``,
which the kernel's own DMAs move), a step whose block index differs from the step before (and the
first step) hands the kernel an output block filled with Pallas' uninitialised value (NaN for
floats) and a written input block fresh from the input array. A kernel that revisits its blocks
consecutively, as JAX's own kernels do, computes exactly what it did before; so does an output
declared ``pl.Buffered(1, revisit=pl.RevisitMode.ANY)``, whose pipeline reads a revisited block back.

**The chip's memory and cores** (issue 55). What a kernel did not write is poison in every type
(``chip_memory.poison``: a NaN as any float, never 0 as an integer), a DMA's destination is
poison until its wait (``chip_memory``), and on a chip of two TensorCores (``set_cores``) each
axis marked ``"parallel"`` is walked a second time as the cores walk it: its second half first,
then its first, each share with fresh scratch and fresh blocks; an output element whose bits
differ from the in-order walk's is poison (``_agreed``), since on the chip it depends on which
core ran which share.

:func:`installed` swaps it in for Pallas' own while the trusted runner exports its CPU program. It
patches one private function of the pinned jax (``hlo_interpreter.pallas_call_hlo_interpret``)
and checks that the function is there, so that a jax that moved it fails loudly, not slowly; and
it gives jax's literal integers a scalar ``shape``, which Pallas' discharge rules ask of an index.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax._src import core as jcore
from jax._src.pallas import core as pallas_core
from jax._src.pallas import hlo_interpreter as hlo

from evaluator.correctness import chip_memory
from evaluator.correctness.chip_memory import poison

_PATCHED = "pallas_call_hlo_interpret"
# TensorCores per chip of the chip judged (``set_cores``): a chip of two splits "parallel" axes.
_CORES = [1]
# What the grid loops of this process split between two cores: (kernel name, axis), for a message.
SPLIT: list[tuple[str, int]] = []


def set_cores(cores: int) -> None:
    """The judged chip's TensorCores per chip (``evaluator.chips``), for every grid loop of this
    process: the trusted runner judges one chip."""
    _CORES[0] = int(cores)


def _written(jaxpr: jcore.Jaxpr, first: int, count: int) -> list[bool]:
    """For the ``count`` block operands from invar ``first`` on: whether the discharged kernel
    returns a new value for it (it wrote the block), rather than the input variable itself."""
    return [jaxpr.outvars[first + k] is not jaxpr.invars[first + k] for k in range(count)]


def grid_loop(*args, jaxpr, debug, input_output_aliases, grid_mapping, mesh, compiler_params,
              cost_estimate, out_avals, metadata, name, count=None, **_):
    """``pallas_call`` interpreted on the host: Pallas' semantics, operands not carried.

    ``count``: a hook that also counts what the kernel does as it runs (``figure/trips.py``:
    its loops and branches on data, its DMAs), called once as ``count(jaxpr, grid_mapping, kernel,
    kernel_consts) -> (kernel, kernel_consts, counter, facts)``; ``counter.zeros()`` is a count
    vector and ``counter.eval(kernel, consts, args) -> (results, delta)`` runs one grid step. Then
    ``(outputs, counts summed over the grid, facts)`` is returned."""
    del debug, mesh, cost_estimate, out_avals, metadata
    dynamic, args = args[:grid_mapping.num_dynamic_grid_bounds], args[grid_mapping.num_dynamic_grid_bounds:]
    bounds = iter(dynamic)
    grid = tuple(next(bounds) if isinstance(d, pallas_core.DynamicGridDim) else d for d in grid_mapping.grid)
    kernel, kernel_consts, scratch_avals = hlo.kernel_to_hlo_jaxpr(jaxpr, (), grid_mapping)
    outs = hlo._initialize_output_vals(grid_mapping.block_mappings_output, args, input_output_aliases)
    scalars = args[grid_mapping.slice_index_ops]
    operands = list(args[len(scalars):]) + list(outs)          # consts, inputs, outputs
    mappings = list(grid_mapping.block_mappings)
    shapes = [pallas_core._get_block_shape(bm.block_shape) for bm in mappings]
    squeezed = [tuple(isinstance(d, pallas_core.Squeezed) for d in bm.block_shape) for bm in mappings]
    for k, (x, bm) in enumerate(zip(operands, mappings, strict=True)):
        padding = [d.padding if isinstance(d, pallas_core.Element) else (0, 0) for d in bm.block_shape]
        if any(p != (0, 0) for p in padding):
            if input_output_aliases:
                raise NotImplementedError("Padding with aliasing not supported.")
            x = lax.pad(x, poison((), x.dtype), [(*p, 0) for p in padding])
        operands[k] = hlo._pad_to_block_dimension(x, shapes[k])
    semaphores = [_is_semaphore_ref(v.aval) for v in jaxpr.invars[grid_mapping.slice_scratch_ops]]
    counter = facts = None
    if count is not None:
        kernel, kernel_consts, counter, facts = count(jaxpr, grid_mapping, kernel, kernel_consts)

    n_in = len(operands) - len(outs)
    first = len(scalars)
    written = _written(kernel, first, n_in) + [True] * len(outs)
    # Operands the TPU pipeline moves block by block: a revisit after another index starts afresh.
    fresh = {k: ("input" if k < n_in else "output") for k in range(len(operands))
             if written[k] and _pipelined(mappings[k]) and not (k >= n_in and _restored(mappings[k]))}
    carried = [k for k in range(len(operands)) if written[k]]       # outputs and written inputs
    fixed = {k: operands[k] for k in range(len(operands)) if not written[k]}
    # Scalar-prefetch operands live in SMEM for the whole grid on the chip: a value the kernel
    # writes there is what the next step reads (ragged paged attention hands the sequence it
    # stopped at to the next step that way). Pallas' loop drops such writes; ours carries them.
    keep_scalars = any(_written(kernel, 0, len(scalars)))

    def walk(held_start, share, offset, counting):
        """One core's walk of its share of the grid (``share``: the grid's extents, ``offset``: the
        share's first index on each axis), from ``held_start`` (the carried arrays) with fresh
        scratch, fresh blocks at its first step and the scalars as the grid started with them."""
        def body(state):
            i, local, counts, last, *rest = state
            index = tuple(ix + o for ix, o in zip(local, offset, strict=True))
            if keep_scalars:
                scalars_now, rest = rest[:len(scalars)], rest[len(scalars):]
            else:
                scalars_now = scalars
            held, held_scratch = rest[:len(carried)], rest[len(carried):]
            arrays = dict(fixed) | dict(zip(carried, held, strict=True))
            if grid_mapping.local_grid_env is not None:
                env = grid_mapping.local_grid_env(index, grid)
            else:
                env = tuple(pallas_core.GridAxis(ix, b) for d, (ix, b) in enumerate(zip(index, grid))
                            if d not in grid_mapping.vmapped_dims)
            with pallas_core.grid_env(env):
                for s in scalars:
                    if isinstance(s.dtype, jcore.bint):
                        s.aval = jcore.typeof(s).update(dtype=jnp.int32)
                starts = [bm.compute_start_indices_interpret(index, *scalars_now) for bm in mappings]
            blocks = [hlo._dynamic_slice(starts[k], shapes[k], arrays[k], squeezed[k]) for k in range(len(operands))]
            now = {k: _index(starts[k]) for k in fresh}
            for k, kind in fresh.items():        # a new block index: the TPU's buffer, not the array
                moved = (i == 0) | jnp.any(now[k] != last[k])
                new = hlo._dynamic_slice(starts[k], shapes[k], operands[k], squeezed[k]) if kind == "input" \
                    else poison(blocks[k].shape, blocks[k].dtype)
                blocks[k] = jnp.where(moved, new, blocks[k])
            last = now
            with pallas_core.grid_env(env):
                if not counting:
                    result = jcore.eval_jaxpr(kernel, kernel_consts, *scalars_now, *blocks, *held_scratch)
                else:
                    result, delta = counter.eval(kernel, kernel_consts, [*scalars_now, *blocks, *held_scratch])
                    counts = counts + delta
            new_blocks = result[first:first + len(operands)]
            new_scratch = result[first + len(operands):]
            new_held = [hlo._dynamic_update_slice(starts[k], shapes[k], arrays[k], new_blocks[k], squeezed[k])
                        for k in carried]
            kept = list(result[:first]) if keep_scalars else []
            return (i + 1, hlo._get_next_indices(share, local), counts, last, *kept, *new_held, *new_scratch)

        zero = counter.zeros() if counting else jnp.zeros((0,), jnp.int32)
        last = {k: jnp.zeros((len(shapes[k]),), jnp.int32) for k in fresh}
        steps = functools.reduce(lambda a, b: a * b, share, 1) if share else 1
        start = (jnp.int32(0), (jnp.int32(0),) * len(grid), zero, last, *(scalars if keep_scalars else ()),
                 *held_start, *fresh_scratch())
        _, _, counts, _, *final = lax.while_loop(lambda state: state[0] < steps, body, start)
        final = final[len(scalars):] if keep_scalars else final
        return counts, final[:len(carried)]

    def fresh_scratch():
        return [jnp.zeros(a.shape, pallas_core.SEMAPHORE_INTERPRET_DTYPE) if sem else poison(a.shape, a.dtype)
                for a, sem in zip(scratch_avals, semaphores, strict=True)]

    initial = [operands[k] for k in carried]
    origin = (0,) * len(grid)
    counts, final = walk(initial, tuple(grid), origin, counter is not None)
    # Two TensorCores: each "parallel" axis checked as split between them (core_split below).
    for axis in _split_axes(compiler_params, grid) if _CORES[0] > 1 else ():
        SPLIT.append((str(getattr(name, "name", name) or "pallas_call"), axis))
        half = (grid[axis] + 1) // 2
        second = tuple(g - half if d == axis else g for d, g in enumerate(grid))
        first_share = tuple(half if d == axis else g for d, g in enumerate(grid))
        _, split = walk(initial, second, tuple(half if d == axis else 0 for d in range(len(grid))), False)
        _, split = walk(split, first_share, origin, False)
        final = [_agreed(a, b) for a, b in zip(final, split, strict=True)]
    final_outs = final[len(carried) - len(outs):len(carried)]
    result = []
    for o, bm in zip(final_outs, grid_mapping.block_mappings_output, strict=True):
        padding = [d.padding if isinstance(d, pallas_core.Element) else (0, 0) for d in bm.block_shape]
        if any(p != (0, 0) for p in padding):
            low, high = zip(*padding, strict=True)
            o = lax.slice(o, low, [s - p for s, p in zip(o.shape, high, strict=True)])
        if o.shape != bm.array_aval.shape:
            o = lax.slice(o, (0,) * o.ndim, bm.array_aval.shape)
        result.append(o)
    if counter is not None:
        return result, counts, facts
    return result


def _split_axes(compiler_params, grid) -> list[int]:
    """The grid axes a chip of two TensorCores may split between its cores: those marked
    ``"parallel"`` or ``"core_parallel"``, of a static extent of at least 2."""
    params = compiler_params.get("mosaic_tpu") if isinstance(compiler_params, dict) else compiler_params
    semantics = getattr(params, "dimension_semantics", None) or ()
    names = [str(getattr(x, "value", x)).lower() for x in semantics]
    return [d for d, name in enumerate(names) if name in ("parallel", "core_parallel")
            and d < len(grid) and isinstance(grid[d], int) and grid[d] >= 2]


def _agreed(a, b):
    """``a`` where ``b`` holds the same bits, poison elsewhere: what is written depends on which
    core ran which share, or in which order the cores wrote back, is not the kernel's answer."""
    if a.dtype == jnp.bool_:
        same = a == b
    else:
        carrier = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[a.dtype.itemsize]
        same = lax.bitcast_convert_type(a, carrier) == lax.bitcast_convert_type(b, carrier)
    return jnp.where(same, a, poison(a.shape, a.dtype))


def _is_semaphore_ref(aval) -> bool:
    """Whether a kernel's scratch operand is a semaphore (a TPU semaphore starts at 0)."""
    return chip_memory.is_semaphore(getattr(aval, "inner_aval", aval).dtype)


def _index(starts) -> jnp.ndarray:
    """A block's start indices as one int32 vector (empty for a rank-0 operand)."""
    return jnp.asarray([jnp.asarray(a, jnp.int32) for a in starts], jnp.int32).reshape(len(starts))


def _pipelined(bm) -> bool:
    """Whether the TPU pipeline moves this operand block by block (in VMEM or SMEM), rather than
    leaving it in HBM for the kernel's own DMAs (``memory_space=ANY``/HBM) or the host."""
    space = getattr(bm.transformed_block_aval, "memory_space", None)
    return str(space).lower() not in ("any", "hbm", "host", "semaphore_mem", "memoryspace.any")


def _restored(bm) -> bool:
    """An output whose pipeline restores a block it comes back to (``pl.Buffered(1,
    revisit=pl.RevisitMode.ANY)``: extra DMAs read it back, which the HBM model counts)."""
    return getattr(bm.pipeline_mode, "revisit", None) == pallas_core.RevisitMode.ANY


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Within the block, a ``pallas_call`` lowered with ``interpret=True`` runs :func:`grid_loop`."""
    original: Any = getattr(hlo, _PATCHED, None)
    if original is None:
        raise RuntimeError(f"jax._src.pallas.hlo_interpreter.{_PATCHED} is gone: this jax is not the "
                           "pinned one (pyproject.toml); reinstall with scripts/test.sh")
    setattr(hlo, _PATCHED, grid_loop)
    try:
        with scalar_literals(), chip_memory.installed():
            yield
    finally:
        setattr(hlo, _PATCHED, original)


@contextlib.contextmanager
def scalar_literals() -> Iterator[None]:
    """Within the block, jax's literal integers have a scalar ``shape``. A literal index
    (``ref[0]`` in a kernel jaxpr) is a TypedInt, which Pallas' discharge rules ask for one (jax
    0.10.2: ragged paged attention's ``seq_buf_idx_ref[0]`` fails the HLO interpreter with
    "'TypedInt' object has no attribute 'shape'")."""
    from jax._src import literals

    had_shape = "shape" in vars(literals.TypedInt)
    literals.TypedInt.shape = ()
    try:
        yield
    finally:
        if not had_shape:
            del literals.TypedInt.shape
