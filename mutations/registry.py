"""The registry of mutation operators, by name (one family of ``seeds/registry.py``).

A new operator is one module (an ``Operator`` subclass) plus one line: here for a built-in, or an
entry point ``pallas_evolve.operators`` (``name = "package.module:Class"``) in the package that
defines it. The operator-by-seed contract suite (``tests/mutations/test_operator_contract.py``)
runs every registered operator.
"""

from __future__ import annotations

import threading

from seeds import Registry

from ._base import Operator

OPERATORS = Registry("operators", {
    "block_sizes": "mutations.tuning.block_sizes:BlockSizes",
    "compact_scratch": "mutations.attention.compact_scratch:CompactScratch",
    "deferred_norm": "mutations.attention.deferred_norm:DeferredNormalisation",
    "causal_skip": "mutations.attention.causal_skip:CausalSkip",
    "head_coarsening": "mutations.attention.head_coarsening:HeadCoarsening",
    "vmem_limit": "mutations.tuning.vmem_limit:VmemLimit",
    "exp2_softmax": "mutations.attention.exp2_softmax:Exp2Softmax",
    "diagonal_strips": "mutations.attention.diagonal_strips:DiagonalStrips",
    "approx_reciprocal": "mutations.attention.approx_reciprocal:ApproxReciprocal",
    "length_skip": "mutations.decode.length_skip:LengthSkip",
    "grouped_heads": "mutations.decode.grouped_heads:GroupedHeads",
    "split_kv": "mutations.decode.split_kv:SplitKV",
    "dimension_semantics": "mutations.tuning.dimension_semantics:DimensionSemantics",
    "chip_split": "mutations.decode.chip_split:ChipSplit",
    "copies_in_need": "mutations.decode.copies_in_need:CopiesInNeed",
    "fuse_epilogue": "mutations.pipeline.fuse_epilogue:FuseEpilogue",
    "fuse_reduction": "mutations.pipeline.fuse_reduction:FuseReduction",
    "grid_order": "mutations.pipeline.grid_order:GridOrder",
    "accumulator": "mutations.pipeline.accumulator:Accumulator",
    "mxu_operands": "mutations.pipeline.mxu_operands:MxuOperands",
    "buffering": "mutations.pipeline.buffering:Buffering",
}, member="operator")
_INSTANCES: dict[str, Operator] = {}
_LOCK = threading.Lock()


def get_operator(name: str) -> Operator:
    """The operator called ``name``; KeyError listing the known names otherwise."""
    member = OPERATORS.load(name)
    with _LOCK:
        if name not in _INSTANCES:
            op = member() if isinstance(member, type) else member
            if not isinstance(op, Operator) or op.name != name:
                raise TypeError(f"the operator registered as {name!r} is not an Operator named {name!r}")
            _INSTANCES[name] = op
        return _INSTANCES[name]


def all_operators() -> list[Operator]:
    """Every registered operator, in a stable order (built-ins first)."""
    return [get_operator(name) for name in OPERATORS.names()]


def shape_operator() -> Operator | None:
    """The operator that sets a kernel's block shape (``Operator.sets_shape``), if one is registered."""
    return next((op for op in all_operators() if op.sets_shape), None)


def operator_names() -> list[str]:
    return OPERATORS.names()


def register(op: Operator) -> Operator:
    """Add an operator (an instance) at run time, e.g. an experimental one; returns it."""
    OPERATORS.register(op.name, op)
    return op


def unregister(name: str) -> None:
    """Remove an operator added with :func:`register`."""
    OPERATORS.unregister(name)
    with _LOCK:
        _INSTANCES.pop(name, None)
