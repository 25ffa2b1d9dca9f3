"""pallas-evolve: mutations.

A family of source-to-source rewrites of Pallas TPU kernels (libcst), behind a small base class
(:class:`Operator`) and a registry by name. Every operator reports "not applicable" as a value,
draws its parameters from a ``random.Random`` it is given, and records what it did as a
replayable :class:`Edit`, so an edit history can be re-applied to the seed (:func:`replay`).
"""

from . import registry
from ._base import Applicability, Edit, MutationResult, NotApplicable, Operator, parse
from .tuning.block_sizes import block_values, consistent, legal_values
from .tuning.defaults import required_defaults
from ._replay import replay, replay_applicable
from ._tunables import read_tunables
from .registry import all_operators, get_operator, operator_names, shape_operator
from .tuning.discovery import discover, unfollowed

__all__ = [
    "all_operators",
    "Applicability",
    "block_values",
    "consistent",
    "discover",
    "Edit",
    "get_operator",
    "legal_values",
    "MutationResult",
    "NotApplicable",
    "Operator",
    "operator_names",
    "parse",
    "read_tunables",
    "registry",
    "replay",
    "replay_applicable",
    "required_defaults",
    "shape_operator",
    "unfollowed",
]
