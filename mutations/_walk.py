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

Trees are immutable, and the operators ask about the same trees again and again (a source's parse
is shared, ``_base.parse``): :func:`per_tree` keeps what a function computed of a tree, by the
tree's identity, and :func:`nodes` is the walk so kept (a run's breeding from the default seed
walked 11.5 million nodes, most of them the same nodes again).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator

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
    return iter(nodes(node))


def _walk_now(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
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


# Values kept per tree, by the tree's identity (the tree is kept with them, so the identity stays
# its), bounded by the elements they hold in all (a million: some 35 trees of JAX's flash attention).
_KEPT: collections.OrderedDict = collections.OrderedDict()
_KEPT_SIZE = [0]
_KEPT_LIMIT = 1 << 20
_KEPT_LOCK = threading.Lock()


def per_tree(fn: Callable[[cst.CSTNode], tuple | dict]) -> Callable[[cst.CSTNode], tuple | dict]:
    """``fn(node)``, computed once per tree: ``fn`` must be a pure function of the (immutable) tree
    returning a value nobody mutates; its size (``len``) counts against the bound."""

    @functools.wraps(fn)
    def kept(node: cst.CSTNode):
        key = (fn, id(node))
        with _KEPT_LOCK:
            hit = _KEPT.get(key)
            if hit is not None and hit[0] is node:
                _KEPT.move_to_end(key)
                return hit[1]
        value = fn(node)
        with _KEPT_LOCK:
            old = _KEPT.pop(key, None)
            if old is not None:
                _KEPT_SIZE[0] -= len(old[1]) + 1
            _KEPT[key] = (node, value)
            _KEPT_SIZE[0] += len(value) + 1
            while _KEPT_SIZE[0] > _KEPT_LIMIT and len(_KEPT) > 1:
                _, (_, dropped) = _KEPT.popitem(last=False)
                _KEPT_SIZE[0] -= len(dropped) + 1
        return value

    return kept


@per_tree
def nodes(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """Every node :func:`walk` meets, walked once per tree."""
    return tuple(_walk_now(node))
