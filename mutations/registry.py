"""The registry of mutation operators, by name."""

from __future__ import annotations

from ._approx_reciprocal import ApproxReciprocal
from ._base import Operator
from ._block_sizes import BlockSizes
from ._causal_skip import CausalSkip
from ._chip_split import ChipSplit
from ._compact_scratch import CompactScratch
from ._deferred_norm import DeferredNormalisation
from ._dimension_semantics import DimensionSemantics
from ._diagonal_strips import DiagonalStrips
from ._exp2_softmax import Exp2Softmax
from ._grouped_heads import GroupedHeads
from ._head_coarsening import HeadCoarsening
from ._length_skip import LengthSkip
from ._split_kv import SplitKV
from ._vmem_limit import VmemLimit

_OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (BlockSizes(), CompactScratch(), DeferredNormalisation(), CausalSkip(),
               HeadCoarsening(), VmemLimit(), Exp2Softmax(), DiagonalStrips(), ApproxReciprocal(),
               LengthSkip(), GroupedHeads(), SplitKV(), DimensionSemantics(), ChipSplit())
}


def all_operators() -> list[Operator]:
    """Every registered operator, in a stable order."""
    return list(_OPERATORS.values())


def operator_names() -> list[str]:
    return list(_OPERATORS)


def get_operator(name: str) -> Operator:
    """The operator called ``name``; KeyError listing the known names otherwise."""
    try:
        return _OPERATORS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known operators: {', '.join(_OPERATORS)}") from None


def register(op: Operator) -> Operator:
    """Add an operator (e.g. an experimental one) to the registry; returns it."""
    if op.name in _OPERATORS:
        raise ValueError(f"an operator named {op.name!r} is already registered")
    _OPERATORS[op.name] = op
    return op
