"""Block sizes held where production modules keep them: keyword arguments and defaults.

Our seeds keep their blocks in module-level constants (``BLOCK_Q = 128``, see ``_tunables``).
JAX's own kernels keep them elsewhere: in a dataclass built with literal keyword arguments
(``BlockSizes.get_default`` returns ``BlockSizes(block_q=128, block_k_major=128, ...)``), in a
dataclass's field defaults, or in a function's keyword defaults (``block_q: int = 128``); or they
leave a keyword default ``None`` and look the value up themselves (ragged paged attention's
``num_kv_pages_per_block=None``: its tuned table, by the chip it runs on). A *block field* is such
a literal, on the task's forward path: in a function or class reachable from the entry point
(:func:`mutations._sites.reachable`). A ``None`` default is a field whose value the source does not
say (``Field.value`` None): a move gives it one; nothing scales or compares it.

The task declares legal values for its own tunables (BLOCK_Q, BLOCK_KV); :data:`FIELD_TUNABLES`
maps a production module's names onto them. A minor block must divide its major block
(``block_k`` divides ``block_k_major``, JAX's own rule), so every move keeps that.
"""

from __future__ import annotations

import dataclasses
import functools

import libcst as cst

from .. import _sites
from .._walk import replace as replace_ids
from .._walk import walk

# A production kernel's forward block names -> the task's tunable whose legal values they take.
FIELD_TUNABLES = {
    "block_q": "BLOCK_Q",
    "block_k_major": "BLOCK_KV",
    "block_k": "BLOCK_KV",
    "block_kv": "BLOCK_KV",
    # JAX's ragged paged attention (its task's own tunables)
    "num_kv_pages_per_block": "NUM_KV_PAGES_PER_BLOCK",
    "num_queries_per_block": "NUM_QUERIES_PER_BLOCK",
}
MAJOR = "_major"


@dataclasses.dataclass(frozen=True)
class Field:
    """One block field: its name, its value and the literals that hold it."""

    name: str
    value: int | None                # None: a keyword default of None (the module's own lookup)
    literals: tuple[cst.Integer | cst.Name, ...]
    where: tuple[str, ...]           # the functions / classes holding the literals

    @property
    def tunable(self) -> str:
        return FIELD_TUNABLES[self.name]


def major_of(name: str) -> str | None:
    """``block_k`` -> ``block_k_major`` (the block it must divide), else None."""
    return None if name.endswith(MAJOR) else name + MAJOR


def _is_none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _literals(node: cst.CSTNode) -> list[tuple[str, cst.Integer | cst.Name]]:
    """``name=<int>`` keyword arguments, ``name: T = <int>`` / ``name=<int>`` / ``name=None``
    parameter defaults and ``name: T = <int>`` class-body fields, for the names in FIELD_TUNABLES."""
    found: list[tuple[str, cst.Integer | cst.Name]] = []
    for n in walk(node):
        if isinstance(n, cst.Arg):
            if n.keyword is not None and n.keyword.value in FIELD_TUNABLES and isinstance(n.value, cst.Integer):
                found.append((n.keyword.value, n.value))
        elif isinstance(n, cst.Param):
            if n.name.value in FIELD_TUNABLES and (isinstance(n.default, cst.Integer) or _is_none(n.default)):
                found.append((n.name.value, n.default))
        elif isinstance(n, cst.AnnAssign):
            if (isinstance(n.target, cst.Name) and n.target.value in FIELD_TUNABLES
                    and isinstance(n.value, cst.Integer)):
                found.append((n.target.value, n.value))
    return found


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def fields(module: cst.Module, entry: str | None) -> dict[str, Field]:
    """The block fields on the forward path from ``entry``, by name, in the module's order. A name
    held by literals of different values is left out (which one runs is not a source question)."""
    if entry is None:
        return {}
    defs = _sites.definitions(module)
    held: dict[str, list[tuple[str, cst.Integer | cst.Name]]] = {}
    for where in _sites.reachable(module, entry):
        node = defs[where]
        if isinstance(node, cst.ClassDef):       # its own field defaults; methods come separately
            body = [s for s in node.body.body if not isinstance(s, cst.FunctionDef)]
            pairs = [p for s in body for p in _literals(s)]
        else:
            pairs = _literals(node)
        for name, literal in pairs:
            held.setdefault(name, []).append((where, literal))
    out = {}
    for name, items in held.items():
        values = {None if _is_none(lit) else int(lit.evaluated_value) for _, lit in items}
        if len(values) == 1:
            out[name] = Field(name, values.pop(), tuple(lit for _, lit in items),
                              tuple(dict.fromkeys(w for w, _ in items)))
    return out


def consistent(values: dict[str, int]) -> str | None:
    """Why a set of block values breaks a minor-divides-major rule, or None."""
    for name, value in values.items():
        major = major_of(name)
        if value is not None and values.get(major) is not None and values[major] % value:
            return f"{name}={value} does not divide {major}={values[major]}"
    return None


def set_fields(module: cst.Module, entry: str | None, values: dict[str, int]) -> cst.Module:
    """Every literal of each named field set to its new value."""
    table = fields(module, entry)
    return set_literals(module, {id(lit): values[f.name] for f in table.values() if f.name in values
                                 for lit in f.literals})


def set_literals(module: cst.Module, replace: dict[int, int]) -> cst.Module:
    """The literals whose node ids ``replace`` names set to their new values (a ``None`` default
    named there becomes the integer)."""
    changes: dict[int, cst.CSTNode] = {}
    for node in walk(module):
        if id(node) not in replace or not isinstance(node, (cst.Integer, cst.Name)):
            continue
        value = str(replace[id(node)])
        # a None default given a value becomes the integer
        changes[id(node)] = node.with_changes(value=value) if isinstance(node, cst.Integer) else cst.Integer(value)
    return replace_ids(module, changes)  # type: ignore[return-value]
