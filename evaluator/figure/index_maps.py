"""Index maps evaluated as the chip evaluates them, for the HBM traffic model (``hbm_traffic.py``).

An index-map function of a Mosaic module (``transform_indices``: the grid indices and the
scalar-prefetch refs in, a block index per dimension out) is run here on Python integers, with
the chip's integer semantics: every ``arith`` op wraps to its type's width (int32 arithmetic that
overflows wraps, as it does on the chip and in the interpreter), unsigned ops and compares read
their operands as unsigned, truncations truncate and extensions extend by their kind (an
``index`` is 64 bits wide). A shift by the width or more (poison), a division by zero, control
flow, an op outside this set or a scalar-prefetch value that is not known is no index: the model
then counts a fetch at every step (an upper bound) and says why.
"""

from __future__ import annotations

import numpy as np


def walk_index_map(fn, grid, prefetch) -> tuple[list[tuple] | None, str]:
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


# Values are Python ints held in their type's two's-complement range (an i1 as 0 or 1).
def _wrap(v: int, width: int) -> int:
    if width == 1:
        return v & 1
    v &= (1 << width) - 1
    return v - (1 << width) if v >> (width - 1) else v


def _unsigned(v: int, width: int) -> int:
    return v & ((1 << width) - 1)


def _width(value_type) -> int:
    from jaxlib.mlir import ir

    if isinstance(value_type, ir.IndexType) or str(value_type) == "index":
        return 64
    try:
        return ir.IntegerType(value_type).width
    except (ValueError, TypeError):
        raise _Unknown(f"a value of type {value_type} in an index map") from None


def _nonzero(b: int) -> int:
    return b if b else _fail("division by zero")


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(_nonzero(b))
    return q if (a < 0) == (b < 0) else -q


def _shift(b: int, w: int) -> int:
    return b if 0 <= b < w else _fail(f"a shift by {b} of a {w}-bit value (poison)")


# name -> f(a, b, width) on wrapped operands; the result is wrapped to the width afterwards.
_BINARY = {
    "arith.addi": lambda a, b, w: a + b, "arith.subi": lambda a, b, w: a - b, "arith.muli": lambda a, b, w: a * b,
    "arith.divsi": lambda a, b, w: _tdiv(a, b),
    "arith.divui": lambda a, b, w: _unsigned(a, w) // _nonzero(_unsigned(b, w)),
    "arith.floordivsi": lambda a, b, w: a // _nonzero(b),
    "arith.ceildivsi": lambda a, b, w: -(-a // _nonzero(b)),
    "arith.ceildivui": lambda a, b, w: -(-_unsigned(a, w) // _nonzero(_unsigned(b, w))),
    "arith.remsi": lambda a, b, w: a - b * _tdiv(a, b),
    "arith.remui": lambda a, b, w: _unsigned(a, w) % _nonzero(_unsigned(b, w)),
    "arith.minsi": lambda a, b, w: min(a, b), "arith.maxsi": lambda a, b, w: max(a, b),
    "arith.minui": lambda a, b, w: min(a, b, key=lambda x: _unsigned(x, w)),
    "arith.maxui": lambda a, b, w: max(a, b, key=lambda x: _unsigned(x, w)),
    "arith.andi": lambda a, b, w: a & b, "arith.ori": lambda a, b, w: a | b, "arith.xori": lambda a, b, w: a ^ b,
    "arith.shli": lambda a, b, w: a << _shift(_unsigned(b, w), w),
    "arith.shrsi": lambda a, b, w: a >> _shift(_unsigned(b, w), w),
    "arith.shrui": lambda a, b, w: _unsigned(a, w) >> _shift(_unsigned(b, w), w),
}
# arith.cmpi predicates: (compare, unsigned?)
_CMP = {0: (lambda a, b: a == b, False), 1: (lambda a, b: a != b, False), 2: (lambda a, b: a < b, False),
        3: (lambda a, b: a <= b, False), 4: (lambda a, b: a > b, False), 5: (lambda a, b: a >= b, False),
        6: (lambda a, b: a < b, True), 7: (lambda a, b: a <= b, True), 8: (lambda a, b: a > b, True),
        9: (lambda a, b: a >= b, True)}
# Casts: zero-extending ones read their operand as unsigned; the rest sign-extend or truncate.
_CASTS = {"arith.index_cast": False, "arith.extsi": False, "arith.trunci": False,
          "arith.index_castui": True, "arith.extui": True}


def _fail(why: str):
    raise _Unknown(why)


def _compile(fn, n_grid: int):
    """A Python closure evaluating an index-map function as the chip would; or a string saying
    why it cannot."""
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

    # Everything about an op that does not change between steps is read from the IR once (the
    # bindings are slow: a grouped matmul's maps, ~100 ops walked at 2,464 steps, took over 60 s
    # when each step asked them again); values live in slots, not in a dict keyed by IR values.
    slot: dict = {a: i for i, a in enumerate(args)}
    plan = []
    for op in ops:
        name = op.name
        ins = []
        for v in op.operands:
            if v not in slot:
                slot[v] = len(slot)       # defined later or nowhere: read as unknown, as before
            ins.append(slot[v])
        if name == "func.return":
            plan.append((name, None, tuple(ins), None))
            continue
        out = slot.setdefault(op.results[0], len(slot))
        try:
            width = _width(op.results[0].type)
            if name == "arith.constant":
                value = op.attributes["value"]
                extra = int(value.value) if isinstance(value, ir.IntegerAttr) else None
            elif name in _BINARY or name in _CASTS:
                extra = _width(op.operands[0].type)
            elif name == "arith.cmpi":
                extra = (*_CMP[int(ir.IntegerAttr(op.attributes["predicate"]).value)], _width(op.operands[0].type))
            else:
                extra = None
        except _Unknown as exc:
            plan.append(("unknown", out, (), str(exc)))
            continue
        plan.append((name, out, tuple(ins), (width, extra)))
    n_slots = len(slot)
    try:
        grid_widths = [_width(a.type) for a in args[:n_grid]]
    except _Unknown as exc:
        return str(exc)

    def run(step, prefetch):
        env = [None] * n_slots
        for i in range(n_grid):
            env[i] = _wrap(int(step[i]), grid_widths[i])
        for j in range(len(args) - n_grid):
            env[n_grid + j] = prefetch[j] if j < len(prefetch) else None
        for name, out, ins, info in plan:
            if name == "func.return":
                return tuple(int(env[v]) for v in ins)
            if name == "unknown":
                _fail(info)
            width, extra = info
            vals = [env[v] for v in ins]
            if name == "arith.constant":
                result = extra if extra is not None else _fail("a non-integer constant in an index map")
            elif name == "memref.load":
                ref, idx = vals[0], vals[1:]
                if ref is None:
                    _fail("its index map reads a scalar-prefetch value the model does not know")
                array = np.asarray(ref)
                where = tuple(int(i) for i in idx)
                if any(not 0 <= i < n for i, n in zip(where, array.shape, strict=False)):
                    _fail(f"its index map reads scalar-prefetch element {where} of an array of shape {array.shape}")
                result = int(array[where])
            elif any(v is None for v in vals):
                _fail(f"{name} of an unknown value")
            elif name in _BINARY:
                result = _BINARY[name](vals[0], vals[1], extra)
            elif name in _CASTS:
                result = _unsigned(vals[0], extra) if _CASTS[name] else vals[0]
            elif name == "arith.cmpi":
                compare, unsigned, w = extra
                a, b = (_unsigned(vals[0], w), _unsigned(vals[1], w)) if unsigned else (vals[0], vals[1])
                result = int(compare(a, b))
            else:   # arith.select
                result = vals[1] if vals[0] else vals[2]
            env[out] = _wrap(result, width)
        _fail("its index map has no return")

    return run
