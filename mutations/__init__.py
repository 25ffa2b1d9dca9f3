"""pallas-evolve: mutations.

A family of source-to-source rewrites of Pallas TPU kernels (libcst), behind a small base class
(:class:`Operator`) and a registry by name. Every operator reports "not applicable" as a value,
draws its parameters from a ``random.Random`` it is given, and records what it did as a
replayable :class:`Edit`, so an edit history can be re-applied to the seed (:func:`replay`).
"""

from . import registry
from ._base import Applicability, Edit, MutationResult, NotApplicable, Operator
from .tuning.block_sizes import block_values, legal_values
from ._replay import replay
from ._tunables import read_tunables
from .registry import all_operators, get_operator, operator_names

__all__ = [
    "Applicability",
    "Edit",
    "MutationResult",
    "NotApplicable",
    "Operator",
    "all_operators",
    "block_values",
    "get_operator",
    "legal_values",
    "operator_names",
    "read_tunables",
    "registry",
    "replay",
]
