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
edge are clipped).

Index maps that read scalar-prefetch operands (e.g. a block index clamped to a sequence's length)
are evaluated on the real values of the judge's timing input when the operand is an argument of
the program; otherwise every step is counted as a fetch (an upper bound) and a note says so.
Around the kernels, XLA's own cost analysis gives the bytes the other ops move.

Not modelled here (and said so in a note): operands left in HBM (``memory_space=ANY``) and moved
by the kernel's own DMAs (the runner counts those on the timing input, ``dmas.py``, where it has
an interpreted run; without one the figure is refused); index maps using ops outside the small
integer set below (counted as a fetch every step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from evaluator.kernel_audit import KernelUnreadable, mosaic_module, walk_ops

_ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
             "ui8": 1, "ui16": 2, "ui32": 4, "f8E4M3FN": 1, "f8E5M2": 1}
MAX_STEPS = 1 << 22       # grids larger than this are not walked: a note, and an upper bound


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes a program moves between HBM and on-chip memory, as far as the model sees."""

    kernel_bytes: int = 0          # Pallas kernels' pipelined block transfers
    notes: tuple[str, ...] = ()    # what the model could not see, one line each
    blind: bool = False            # a kernel moves data the model cannot count (manual DMAs)

    def to_dict(self) -> dict:
        return {"kernel_bytes": self.kernel_bytes, "notes": list(self.notes), "blind": self.blind}


def program_traffic(exported, input_value: Callable[[int], np.ndarray] | None = None) -> Traffic:
    """The HBM traffic of every Pallas kernel in ``exported`` (a TPU ``jax.export.Exported``).

    ``input_value(i)`` gives the program's i-th argument (read only for scalar-prefetch operands
    that are program arguments), or None where it is unknown; ``input_value`` None when every value
    is unknown. Never raises: what cannot be read becomes a note and an upper bound.
    """
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax


    total, notes, blind = 0, [], False
    try:
        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
            calls = _kernel_calls(module)
    except Exception as exc:  # noqa: BLE001
        return Traffic(0, (f"the program could not be read for its HBM traffic: {exc}",), True)
    for name, config, operands, results in calls:
        try:
            with mosaic_module(config) as kernel:
                counted = _kernel_bytes(kernel, operands, results, input_value)
        except KernelUnreadable as exc:
            counted = (0, [f"kernel '{name}': its Mosaic body {exc}"], True)
        except Exception as exc:  # noqa: BLE001
            counted = (0, [f"kernel '{name}': traffic not modelled ({type(exc).__name__}: {exc})"], True)
        total += counted[0]
        notes.extend(f"kernel '{name}': {n}" if not n.startswith("kernel '") else n for n in counted[1])
        blind = blind or counted[2]
    return Traffic(total, tuple(notes), blind)


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
def _kernel_bytes(module, operands, results, input_value) -> tuple[int, list[str], bool]:
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
    windows = list(ir.ArrayAttr(main.attributes["window_params"]))
    arrays = [(shape, size) for shape, size, _ in operands[n_prefetch:]] + list(results)
    values = [None if arg is None or input_value is None else input_value(arg) for _, _, arg in operands[:n_prefetch]]
    prefetch = [None if v is None else np.asarray(v) for v in values]
    notes: list[str] = []
    if len(windows) != len(arrays):
        return 0, [f"{len(windows)} windows for {len(arrays)} operands and results: not modelled"], True
    if any(b < 0 for b in grid):
        return 0, ["a dynamic grid: its block transfers are not modelled"], True
    steps = math.prod(grid) if grid else 1
    total, blind = 0, False
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
        block_bytes = _clipper(shape, bounds, itemsize)
        if fn is None or steps > MAX_STEPS:
            notes.append(f"{kind} {i}: index map not walked; counted as a fetch at every step (upper bound)")
            total += steps * block_bytes(None)
            continue
        indices, why = _walk_index_map(fn, grid, prefetch)
        if indices is None:
            notes.append(f"{kind} {i}: {why}; counted as a fetch at every step (upper bound)")
            total += steps * block_bytes(None)
            continue
        total += _transfers(indices, block_bytes, output=kind == "output")
    return total, notes, blind


def _gridless_bytes(funcs, operands, results) -> tuple[int, list[str], bool]:
    """A kernel without a grid: each operand in VMEM/SMEM is copied in (results out) once; one
    left in HBM is moved by the kernel's own DMAs, which are not modelled."""
    from jaxlib.mlir import ir

    main = next(iter(funcs.values()), None)
    if main is None:
        return 0, ["no kernel function: its transfers are not modelled"], True
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
    return total, notes, bool(notes)


def _clipper(shape, bounds, itemsize):
    full = math.prod(bounds) * itemsize

    def block_bytes(index) -> int:
        if index is None:
            return full
        n = itemsize
        for dim, w, j in zip(shape, bounds, index, strict=False):
            n *= max(0, min(w, dim - j * w))
        return n

    return block_bytes


def _transfers(indices: list[tuple], block_bytes, *, output: bool) -> int:
    """Bytes moved for a sequence of per-step block indices (fetch on change; write back on change)."""
    total = 0
    for s, index in enumerate(indices):
        if output:
            if s == len(indices) - 1 or indices[s + 1] != index:
                total += block_bytes(index)
        elif s == 0 or indices[s - 1] != index:
            total += block_bytes(index)
    return total


def _walk_index_map(fn, grid, prefetch) -> tuple[list[tuple] | None, str]:
    """The block index of every grid step, in the pipeline's order; or None and why not."""
    program = _compile(fn, len(grid))
    if isinstance(program, str):
        return None, program
    out = []
    for step in np.ndindex(*grid) if grid else [()]:
        try:
            out.append(program(step, prefetch))
        except _Unknown as exc:
            return None, str(exc)
    return out, ""


class _Unknown(Exception):
    pass


_BINARY = {
    "arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
    "arith.divsi": lambda a, b: int(a / b) if b else _fail("division by zero"),
    "arith.divui": lambda a, b: a // b if b else _fail("division by zero"),
    "arith.floordivsi": lambda a, b: a // b if b else _fail("division by zero"),
    "arith.ceildivsi": lambda a, b: -(-a // b) if b else _fail("division by zero"),
    "arith.remsi": lambda a, b: int(math.fmod(a, b)) if b else _fail("division by zero"),
    "arith.remui": lambda a, b: a % b if b else _fail("division by zero"),
    "arith.minsi": min, "arith.maxsi": max, "arith.minui": min, "arith.maxui": max,
    "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
    "arith.shli": lambda a, b: a << b, "arith.shrsi": lambda a, b: a >> b, "arith.shrui": lambda a, b: a >> b,
}
_CMP = {0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b, 3: lambda a, b: a <= b,
        4: lambda a, b: a > b, 5: lambda a, b: a >= b, 6: lambda a, b: a < b, 7: lambda a, b: a <= b,
        8: lambda a, b: a > b, 9: lambda a, b: a >= b}
_CASTS = {"arith.index_cast", "arith.index_castui", "arith.extui", "arith.extsi", "arith.trunci"}


def _fail(why: str):
    raise _Unknown(why)


def _compile(fn, n_grid: int):
    """A Python closure evaluating an index-map function; or a string saying why it cannot."""
    from jaxlib.mlir import ir

    block = fn.regions[0].blocks[0]
    args = list(block.arguments)
    ops = [op.operation for op in block.operations]
    for op in ops:
        if op.regions:
            return f"its index map has control flow ({op.name})"
        if not (op.name in _BINARY or op.name in _CASTS or op.name in ("arith.constant", "arith.cmpi",
                                                                          "arith.select", "memref.load",
                                                                          "func.return")):
            return f"its index map uses {op.name}, which the model does not evaluate"

    def run(step, prefetch):
        env = {}
        for i, a in enumerate(args[:n_grid]):
            env[a] = int(step[i])
        for j, a in enumerate(args[n_grid:]):
            env[a] = prefetch[j] if j < len(prefetch) else None
        for op in ops:
            name = op.name
            if name == "func.return":
                return tuple(int(env[v]) for v in op.operands)
            vals = [env.get(v) for v in op.operands]
            if name == "arith.constant":
                value = op.attributes["value"]
                result = int(value.value) if isinstance(value, ir.IntegerAttr) else _fail(
                    "a non-integer constant in an index map")
            elif name == "memref.load":
                ref, idx = vals[0], vals[1:]
                if ref is None:
                    _fail("its index map reads a scalar-prefetch value the model does not know")
                result = int(np.asarray(ref)[tuple(int(i) for i in idx)])
            elif any(v is None for v in vals):
                _fail(f"{name} of an unknown value")
            elif name in _BINARY:
                result = _BINARY[name](int(vals[0]), int(vals[1]))
            elif name in _CASTS:
                result = int(vals[0])
            elif name == "arith.cmpi":
                result = int(_CMP[int(ir.IntegerAttr(op.attributes["predicate"]).value)](vals[0], vals[1]))
            else:   # arith.select
                result = vals[1] if vals[0] else vals[2]
            env[op.results[0]] = result
        _fail("its index map has no return")

    return run
