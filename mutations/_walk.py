"""A read-only walk of a libcst tree: every node, in the order ``node.visit`` meets them.

libcst has no read-only traversal: ``node.visit(visitor)`` rebuilds every node it passes (each
parent is constructed anew from its visited children, then dropped when nothing changed), which
makes a walk of JAX's flash attention module (~1000 lines, ~29,000 nodes) take 0.1 s. The
operators' checks walk their source's tree dozens of times, so the search's breeding from that
module spent most of its time rebuilding trees nobody kept. :func:`walk` follows the same fields,
in the same order, and builds nothing (a fifth of the time).

Which fields a node's children sit in, and in what order, is libcst's own: read once per node type
from ``_visit_and_replace_children`` by a visitor that records the fields it is told of
(``on_visit_attribute``) and descends no further. A field libcst visits only when it is set (an
f-string's format spec) is not told of when it is None: a node that sets a field its type's first
node left None is read anew.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import libcst as cst

_SENTINEL = cst.MaybeSentinel.DEFAULT
# node type -> (the fields libcst visits, in its order; the fields it did not visit for being None)
_ORDER: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


class _Fields(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False                          # the children's own fields are not this node's

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.names.append(attribute)


def _fields(node: cst.CSTNode) -> tuple[str, ...]:
    visitor = _Fields()
    node._visit_and_replace_children(visitor)
    names = tuple(visitor.names)
    unsure = tuple(f.name for f in dataclasses.fields(node) if f.name not in names and getattr(node, f.name) is None)
    if type(node) not in _ORDER or not unsure:
        _ORDER[type(node)] = names, unsure
    return names


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it, in pre-order, as ``node.visit`` calls ``on_visit``."""
    todo = [node]
    while todo:
        here = todo.pop()
        yield here
        known = _ORDER.get(type(here))
        if known is None or known[1] and any(getattr(here, name) is not None for name in known[1]):
            names = _fields(here)
        else:
            names = known[0]
        children: list[cst.CSTNode] = []
        for name in names:            # a visited field holds a node, a sequence, None or the sentinel
            value = getattr(here, name)
            if isinstance(value, (tuple, list)):
                children += value
            elif value is not None and value is not _SENTINEL:
                children.append(value)
        todo += reversed(children)
