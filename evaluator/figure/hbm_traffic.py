"""A trusted model of the HBM traffic of a Pallas TPU program: what the static estimate cannot see.

libtpu's static estimate counts a DMA's issue and its wait, not its transfer (libtpu 0.0.42.1,
v5e; the README's "The estimate does not see HBM transfers" has the command): the naive
FlashDecoding kernel at B=8 H=8 N=8192 with 2048-entry KV blocks is estimated at 244,188 cycles
(163 us at 1.5 GHz) for 268 MB of cache, which 819 GB/s of HBM cannot move in less than 328 us.
For a memory-bound kernel the estimate alone would be faster than the hardware.

So the judge also counts the bytes each kernel moves between HBM and VMEM, and a program's time is
never less than those bytes over the chip's HBM bandwidth. The count is read from the Mosaic
module itself (never from what the candidate says): its grid (``iteration_bounds``), and for
every operand its window (``window_bounds``) and index map (``transform_indices``). The grid is
walked in the order the TPU pipeline runs it (last axis fastest, one TensorCore); an input block is
fetched when its block index changes from the previous step, an output block written back when it
changes at the next step or at the last step (the Pallas TPU pipeline's rule; blocks at an array's
edge are clipped; an output declared ``RevisitMode.ANY`` is also read back when the walk returns to
a block it wrote).

Index maps are evaluated as the chip evaluates them (``index_maps.py``: int32 arithmetic that
wraps, unsigned ops by their kind). Element windows (``pl.Element``: the map gives element offsets
into the padded array) are modelled; any other window kind is refused by name. A block index out
of range is clamped, as the interpreter's slice clamps it: a block is never free.

Index maps that read scalar-prefetch operands (e.g. a block index clamped to a sequence's length)
are evaluated on the real values of an input set when the operand is an argument of the program
(the runner evaluates every set's where the bytes follow the data, and the figure is the slowest
set's); otherwise every step is counted as a fetch (an upper bound) and a note says so.
Around the kernels, XLA's own cost analysis gives the bytes the other ops move.

Not modelled here (and said so in a note): operands left in HBM (``memory_space=ANY``) and moved
by the kernel's own DMAs (the runner counts those on every input set, ``dmas.py``, where it has
an interpreted run; without one the figure is refused); index maps using ops outside the integer
set of ``index_maps.py`` (counted as a fetch every step).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

from evaluator.figure.index_maps import walk_index_map
from evaluator.program.kernel_audit import KernelUnreadable, mosaic_module, walk_ops

_ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
             "ui8": 1, "ui16": 2, "ui32": 4, "f8E4M3FN": 1, "f8E5M2": 1}
MAX_STEPS = 1 << 22       # grids larger than this are not walked: a note, and an upper bound


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes a program moves between HBM and on-chip memory, as far as the model sees."""

    kernel_bytes: int = 0          # Pallas kernels' pipelined block transfers
    notes: tuple[str, ...] = ()    # what the model could not see, one line each
    blind: bool = False            # a kernel moves data the model cannot count (manual DMAs)
    data_dependent: bool = False   # an index map read a program input's value: the bytes follow the data
    # Windows whose per-step copies libtpu's static estimate leaves out (an element window: the same
    # decode kernel, blocked, is estimated at 70,908 cycles and with element windows at 50,652, the
    # K/V copies' share; libtpu 0.0.42.1, v5e). The compiler estimate refuses such a figure.
    estimate_misses: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"kernel_bytes": self.kernel_bytes, "notes": list(self.notes), "blind": self.blind,
                "data_dependent": self.data_dependent, "estimate_misses": list(self.estimate_misses)}


def program_traffic(exported, input_value: Callable[[int], np.ndarray] | None = None,
                    grid_bounds: list[list[int]] | None = None, prefetch: list | None = None) -> Traffic:
    """The HBM traffic of every Pallas kernel in ``exported`` (a TPU ``jax.export.Exported``).

    ``input_value(i)`` gives the program's i-th argument (read only for scalar-prefetch operands
    that are program arguments), or None where it is unknown; ``input_value`` None when every value
    is unknown. ``grid_bounds[k]``: the sizes of kernel k's dynamic grid dimensions, as counted on
    an input (``dynamic_grid.py``); without them a dynamic grid is not walked. ``prefetch[k]``: kernel
    k's scalar-prefetch operands as the counting run computed them on that input (None: unknown),
    for those the program computes rather than takes. Never raises: what cannot be read becomes a
    note and an upper bound.
    """
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    try:
        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
            calls = _kernel_calls(module)
    except Exception as exc:  # noqa: BLE001
        return Traffic(0, (f"the program could not be read for its HBM traffic: {exc}",), True)
    kernels: list[tuple[str, Traffic]] = []
    for given in (grid_bounds, prefetch):
        if given is not None and len(given) != len(calls):
            return Traffic(0, (f"{len(given)} kernels counted for {len(calls)} in the program: not modelled",), True)
    for k, (name, config, operands, results) in enumerate(calls):
        try:
            with mosaic_module(config) as kernel:
                counted = _kernel_bytes(kernel, operands, results, input_value,
                                        grid_bounds[k] if grid_bounds is not None else None,
                                        prefetch[k] if prefetch is not None else None)
        except KernelUnreadable as exc:
            counted = Traffic(0, (f"its Mosaic body {exc}",), True)
        except Exception as exc:  # noqa: BLE001
            counted = Traffic(0, (f"traffic not modelled ({type(exc).__name__}: {exc})",), True)
        kernels.append((name, counted))
    return Traffic(sum(t.kernel_bytes for _, t in kernels),
                   tuple(f"kernel '{name}': {n}" for name, t in kernels for n in t.notes),
                   any(t.blind for _, t in kernels), any(t.data_dependent for _, t in kernels),
                   tuple(f"kernel '{name}': {m}" for name, t in kernels for m in t.estimate_misses))


# ---- the outer program ------------------------------------------------------------------------
def _tensor(value_type) -> tuple[tuple[int, ...], int]:
    from jaxlib.mlir import ir

    t = ir.RankedTensorType(value_type)
    return tuple(t.shape), _ITEMSIZE.get(str(t.element_type), 4)


def _kernel_calls(module):
    """Every tpu_custom_call: (name, backend_config, operands, results) where an operand is
    (shape, itemsize, index of the program argument it is, or None) and a result (shape, itemsize)."""
    from jaxlib.mlir import ir

    funcs = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func":
            funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
    main = funcs.get("main")
    if main is None:
        return []
    known: dict = {a: i for i, a in enumerate(main.regions[0].blocks[0].arguments)}  # through func.call
    out, seen = [], set()

    def visit(func):
        if func in seen:
            return
        seen.add(func)
        for op in walk_ops(func):
            if op.name == "func.call":
                callee = funcs.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
                if callee is not None:
                    for arg, operand in zip(callee.regions[0].blocks[0].arguments, op.operands, strict=False):
                        if operand in known:
                            known[arg] = known[operand]
                    visit(callee)
            elif (op.name == "stablehlo.custom_call"
                  and ir.StringAttr(op.attributes["call_target_name"]).value == "tpu_custom_call"):
                name = ir.StringAttr(op.attributes["kernel_name"]).value if "kernel_name" in op.attributes else "?"
                config = op.attributes["backend_config"]
                config = ir.StringAttr(config).value if isinstance(config, ir.StringAttr) else None
                operands = [(*_tensor(v.type), known.get(v)) for v in op.operands]
                results = [_tensor(r.type) for r in op.results]
                out.append((name, config, operands, results))

    visit(main)
    return out


# ---- one kernel -------------------------------------------------------------------------------
def _kernel_bytes(module, operands, results, input_value, dynamic: list[int] | None = None,
                  ran_on: list | None = None) -> Traffic:
    from jaxlib.mlir import ir

    funcs = {}
    main = None
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func":
            funcs[ir.StringAttr(op.attributes["sym_name"]).value] = op
            if "window_params" in op.attributes:
                main = op
    if main is None:
        return _gridless_bytes(funcs, operands, results)
    grid = [int(b) for b in ir.DenseI64ArrayAttr(main.attributes["iteration_bounds"])] \
        if "iteration_bounds" in main.attributes else []
    n_prefetch = int(ir.IntegerAttr(main.attributes["scalar_prefetch"]).value) \
        if "scalar_prefetch" in main.attributes else 0
    n_dynamic = sum(1 for b in grid if b < 0)
    operands = operands[n_dynamic:]     # a dynamic grid's sizes come first among the call's operands
    windows = list(ir.ArrayAttr(main.attributes["window_params"]))
    arrays = [(shape, size) for shape, size, _ in operands[n_prefetch:]] + list(results)
    values = [None if arg is None or input_value is None else input_value(arg) for _, _, arg in operands[:n_prefetch]]
    if ran_on is not None and len(ran_on) == n_prefetch:    # what the counted run computed them to be
        values = [v if v is not None else np.asarray(r) for v, r in zip(values, ran_on, strict=True)]
    prefetch = [None if v is None else np.asarray(v) for v in values]
    reads_data = any(v is not None for v in prefetch)
    notes: list[str] = []
    if len(windows) != len(arrays):
        return Traffic(0, (f"{len(windows)} windows for {len(arrays)} operands and results: not modelled",), True)
    if n_dynamic:
        if dynamic is None or len(dynamic) != n_dynamic:
            return Traffic(0, ("a dynamic grid: its block transfers are not modelled",), True)
        sizes = iter(dynamic)
        grid = [b if b >= 0 else next(sizes) for b in grid]
    steps = math.prod(grid) if grid else 1
    total, blind, misses = 0, False, []
    n_inputs = len(operands) - n_prefetch
    for i, (window, (shape, itemsize)) in enumerate(zip(windows, arrays, strict=True)):
        window = ir.DictAttr(window)
        kind = "input" if i < n_inputs else "output"
        if "transform_indices" not in window:
            notes.append(f"{kind} {i} stays in HBM (memory_space=ANY): the kernel's own DMAs of it are "
                         "not modelled, and the estimate does not see their transfer time")
            blind = True
            continue
        bounds = [int(b) for b in ir.DenseI64ArrayAttr(window["window_bounds"])] \
            if "window_bounds" in window else list(shape)
        fn = funcs.get(ir.FlatSymbolRefAttr(window["transform_indices"]).value)
        element, unknown = _window_kind(window, len(bounds))
        if unknown:
            return Traffic(0, (f"{kind} {i}: {unknown}, a window the model does not know: not modelled",), True)
        block_bytes = _clipper(shape, bounds, itemsize, element)
        if element is not None:
            misses.append(f"{kind} {i} has an element window (pl.Element), whose per-step copies the "
                          "static estimate leaves out")
        if fn is None or steps > MAX_STEPS:
            notes.append(f"{kind} {i}: index map not walked; counted as a fetch at every step (upper bound)")
            total += steps * block_bytes(None)
            continue
        indices, why = walk_index_map(fn, grid, prefetch)
        if indices is None:
            notes.append(f"{kind} {i}: {why}; counted as a fetch at every step (upper bound)")
            total += steps * block_bytes(None)
            continue
        indices = [_clamped(index, shape, bounds, element) for index in indices]
        revisit_any = "revisit_mode" in window and "any" in str(window["revisit_mode"])
        total += _transfers(indices, block_bytes, output=kind == "output", revisit_any=revisit_any)
    return Traffic(total, tuple(notes), blind, reads_data, tuple(misses))


def _window_kind(window, rank: int) -> tuple[tuple[tuple[int, int], ...] | None, str]:
    """An element window's padding per dimension (``#tpu.element_window<[low...],[high...]>``),
    None for a blocked window; and, for any other kind of window, what it is (refused by name)."""
    if "window_kind" not in window:
        return None, ""
    text = str(window["window_kind"])
    match = re.fullmatch(r"#tpu\.element_window<\[([-\d, ]*)\],\s*\[([-\d, ]*)\]>", text.strip())
    if match is None:
        return None, f"window kind {text}"
    low, high = ([int(x) for x in part.split(",") if x.strip()] for part in match.groups())
    if len(low) != rank or len(high) != rank:
        return None, f"window kind {text} (padding of another rank)"
    return tuple(zip(low, high)), ""


def _gridless_bytes(funcs, operands, results) -> Traffic:
    """A kernel without a grid: each operand in VMEM/SMEM is copied in (results out) once; one
    left in HBM is moved by the kernel's own DMAs, which are not modelled."""
    from jaxlib.mlir import ir

    main = next(iter(funcs.values()), None)
    if main is None:
        return Traffic(0, ("no kernel function: its transfers are not modelled",), True)
    args = list(main.regions[0].blocks[0].arguments)
    arrays = [(shape, size) for shape, size, _ in operands] + list(results)
    total, notes = 0, []
    for i, ((shape, itemsize), arg) in enumerate(zip(arrays, args, strict=False)):
        space = str(arg.type) if isinstance(arg.type, ir.MemRefType) else ""
        if "vmem" in space or "smem" in space:
            total += math.prod(shape) * itemsize
        else:
            notes.append(f"operand {i} stays in HBM (memory_space=ANY): the kernel's own DMAs of it are "
                         "not modelled, and the estimate does not see their transfer time")
    return Traffic(total, tuple(notes), bool(notes))


def _clipper(shape, bounds, itemsize, element: tuple[tuple[int, int], ...] | None = None):
    """``block_bytes(index)``: the bytes the pipeline moves for one block.

    ``index`` is a block index per dimension, or (an element window, ``pl.Element``: ``element``
    holds each dimension's padding) the element offset into the padded array. An index out of
    range is clamped as the interpreter's ``dynamic_slice`` clamps it, so a block is never free:
    the figure is of the block the kernel was checked with. Blocks at an array's edge are clipped
    to the array (a window over padding moves only the real elements)."""
    full = math.prod(bounds) * itemsize

    def block_bytes(index) -> int:
        if index is None:
            return full
        n = itemsize
        for d, (dim, w, j) in enumerate(zip(shape, bounds, index, strict=False)):
            if element is not None:
                low, high = element[d]
                first = min(max(j, 0), max(dim + low + high - w, 0)) - low
            else:
                first = min(max(j, 0), max(-(-dim // w) - 1, 0)) * w
            n *= max(0, min(first + w, dim) - max(first, 0))
        return n

    return block_bytes


def _clamped(index, shape, bounds, element) -> tuple:
    """The block index the interpreter (and the count) uses: out-of-range indices clamped."""
    if element is not None:
        return tuple(min(max(j, 0), max(dim + lo + hi - w, 0))
                     for j, dim, w, (lo, hi) in zip(index, shape, bounds, element, strict=False))
    return tuple(min(max(j, 0), max(-(-dim // w) - 1, 0)) for j, dim, w in zip(index, shape, bounds, strict=False))


def _transfers(indices: list[tuple], block_bytes, *, output: bool, revisit_any: bool = False) -> int:
    """Bytes moved for a sequence of per-step block indices (fetch on change; write back on
    change). An output whose pipeline restores revisited blocks (``RevisitMode.ANY``) also reads a
    block back each time it returns to one it wrote before."""
    total, seen = 0, set()
    for s, index in enumerate(indices):
        if output:
            if s == len(indices) - 1 or indices[s + 1] != index:
                total += block_bytes(index)
            if revisit_any and (s == 0 or indices[s - 1] != index):
                if index in seen:
                    total += block_bytes(index)
                seen.add(index)
        elif s == 0 or indices[s - 1] != index:
            total += block_bytes(index)
    return total
