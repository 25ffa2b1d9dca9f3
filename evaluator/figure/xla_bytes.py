"""The HBM bytes of a compiled program's own XLA ops: XLA's cost analysis, less what it charges
for buffers that are not in HBM.

The judge floors a program's figure at its HBM traffic over the chip's bandwidth, and for the ops
outside Pallas kernels it reads the traffic from XLA's cost analysis ("bytes accessed"). That
analysis ignores memory spaces. Where XLA stages a whole array in VMEM ahead of its use (an async
``copy-start``/``copy-done`` pair whose destination's layout says ``S(1)``, as it does for an
rmsnorm's input or a decode matmul's weights), the analysis charges the copy three times the
array (the source read, and both arrays of the start's tuple: the destination and the source it
aliases), the ``copy-done`` once more (it only waits), and each read of the staged copy as if
from HBM: five times the array for one read of it from HBM. Measured on rmsnorm's XLA program at
8192 x 4096 bf16 (v5e): 469,946,880 bytes charged, 201,347,580 moved through HBM (x read twice:
by the reduction and by the copy; the output written once), which put the program's figure at
2.33x its own HBM floor (``scripts/xla_hbm_bytes.py`` prints both for any seed).

:func:`overcharge` reads the optimized HLO's entry computation and sums, op by op, what the
analysis charged for buffers in another memory space (a layout naming ``S(n)``): every such
operand and result of an op; a ``copy-start``'s aliased source and a destination not in HBM; a
``copy-done`` whose result is not in HBM. Ops whose traffic the analysis does not price this way
are left alone: Pallas kernels (``custom-call``: their traffic is the judge's own model),
parameters, tuples, bitcasts, and ops that call other computations (loops, branches, calls).
Nothing here can raise the figure: it only removes bytes that never cross HBM.

Nor can it be steered below what the program's ops read and write in HBM. Subtracting a staged
array whole from an op that reads a slice of it would take out more than the analysis charged,
and a program that stages one array and reads slices of it in many ops could cancel its other,
real traffic. So the figure is never below :func:`resident`: each top-level op's operands and
results that are in HBM, counted whole (a copy its HBM source and destination), capped at the
analysis's own figure (whole operands over-count a slice read of an HBM array, and no figure is
raised).
"""

from __future__ import annotations

import math
import re

_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
_OP = re.compile(r"\s*(?:ROOT )?(%[\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)")
_SKIP = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "custom-call", "while",
         "conditional", "call", "after-all"}


def arrays(hlo_type: str) -> list[tuple[int, bool]]:
    """``(bytes, in HBM)`` of each array of an HLO type, e.g. ``bf16[8,128]{1,0:T(8,128)(2,1)S(1)}``
    (a layout naming a memory space ``S(n)``: not in HBM)."""
    out = []
    for dtype, dims, layout in _ARRAY.findall(hlo_type):
        count = math.prod(int(d) for d in dims.split(",") if d)
        out.append((count * _BYTES.get(dtype, 4), not re.search(r"S\(\d+\)", layout or "")))
    return out


def _off_hbm(hlo_type: str) -> int:
    return sum(size for size, in_hbm in arrays(hlo_type) if not in_hbm)


def overcharge(hlo_text: str) -> int:
    """Bytes XLA's cost analysis charges the entry computation for buffers that never cross HBM."""
    total = 0
    for op, result, operands in _ops(hlo_text):
        if op in _SKIP:
            continue
        if op == "copy-start":
            parts = arrays(result)           # (destination, the source it aliases, a context)
            if len(parts) >= 2:
                total += parts[1][0] + sum(size for size, in_hbm in (parts[0], *parts[2:]) if not in_hbm)
        elif op == "copy-done":
            total += _off_hbm(result)
        else:
            total += sum(_off_hbm(t) for t in operands) + _off_hbm(result)
    return total


def _ops(hlo_text: str):
    """``(op, result type, operand types)`` of each instruction of the entry computation."""
    if "\nENTRY " not in hlo_text:
        return
    body = hlo_text.split("\nENTRY ", 1)[1].split("\n}", 1)[0]
    types: dict[str, str] = {}
    for line in body.splitlines()[1:]:
        m = _OP.match(line)
        if m:
            name, result, op, args = m.groups()
            types[name] = result
            yield op, result, [types.get(a.strip().split(" ")[-1], "") for a in args.split(",") if "%" in a]


def resident(hlo_text: str) -> int:
    """The entry computation's top-level ops' operands and results in HBM, each counted whole; a
    copy counts its source and its destination where they are in HBM; what :data:`_SKIP` names and
    a copy-done count nothing."""
    total = 0
    for op, result, operands in _ops(hlo_text):
        if op in _SKIP or op == "copy-done":
            continue
        if op == "copy-start":
            parts = arrays(result)
            total += sum(size for size, in_hbm in (arrays(operands[0]) if operands else []) if in_hbm)
            total += parts[0][0] if parts and parts[0][1] else 0
            continue
        total += sum(size for t in (*operands, result) for size, in_hbm in arrays(t) if in_hbm)
    return total


def xla_hbm_bytes(bytes_accessed: int, hlo_text: str) -> int:
    """The program's own ops' HBM bytes: the cost analysis's figure less :func:`overcharge`, never
    below :func:`resident` (itself capped at the analysis's figure)."""
    return max(bytes_accessed - overcharge(hlo_text), min(resident(hlo_text), bytes_accessed), 0)
