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


def _names(here: cst.CSTNode) -> tuple[str, ...]:
    """The fields ``here`` holds its children in, in libcst's visiting order."""
    known = _ORDER.get(type(here))
    if known is None or known[1] and any(getattr(here, name) is not None for name in known[1]):
        return _fields(here)
    return known[0]


def _walk_now(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    todo = [node]
    while todo:
        here = todo.pop()
        yield here
        names = _names(here)
        children: list[cst.CSTNode] = []
        for name in names:            # a visited field holds a node, a sequence, None or the sentinel
            value = getattr(here, name)
            if isinstance(value, (tuple, list)):
                children += value
            elif value is not None and value is not _SENTINEL:
                children.append(value)
        todo += reversed(children)


# Values kept per tree, by the tree's identity (the tree is kept with them, so the identity stays
# its), bounded by the elements they hold in all (4 million: some 140 trees of JAX's flash attention;
# a million made a run's breeding from it walk its trees again, 3% of its time).
_KEPT: collections.OrderedDict = collections.OrderedDict()
_KEPT_SIZE = [0]
_KEPT_LIMIT = 1 << 22
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


_SHARED = object()      # a node met twice in one tree: it has no one parent


@per_tree
def _parents(tree: cst.CSTNode) -> dict[int, object]:
    """id(node) -> its parent, for every node of ``tree`` (the root's: None)."""
    up: dict[int, object] = {id(tree): None}
    for here in nodes(tree):
        if up.get(id(here)) is _SHARED:
            continue
        for name in _names(here):
            value = getattr(here, name)
            for child in value if isinstance(value, (tuple, list)) else (value,):
                if child is not None and child is not _SENTINEL:
                    up[id(child)] = _SHARED if id(child) in up else here
    return up


def replace(tree: cst.CSTNode, changes: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """``tree`` with each node whose ``id`` is a key of ``changes`` replaced by its value, as
    ``deep_replace`` does one (by identity); an id not in the tree changes nothing. Only the
    replaced nodes' ancestors are built anew: every other node is the very node of ``tree`` (libcst's
    ``deep_replace`` rebuilds the whole tree, 0.1 s on JAX's flash attention module)."""
    up = _parents(tree)
    dirty: set[int] = set()
    for key in changes:
        parent = up.get(key)
        if parent is _SHARED:
            return _replace_by_visit(tree, changes)
        while parent is not None and id(parent) not in dirty:
            if up[id(parent)] is _SHARED:
                return _replace_by_visit(tree, changes)
            dirty.add(id(parent))
            parent = up[id(parent)]

    def rebuild(node: cst.CSTNode) -> cst.CSTNode:
        new = changes.get(id(node))
        if new is not None:
            return new
        if id(node) not in dirty:
            return node
        updates = {}
        for name in _names(node):
            value = getattr(node, name)
            if isinstance(value, (tuple, list)):
                items = [rebuild(child) for child in value]
                if any(a is not b for a, b in zip(items, value)):
                    updates[name] = type(value)(items)
            elif value is not None and value is not _SENTINEL:
                item = rebuild(value)
                if item is not value:
                    updates[name] = item
        return node.with_changes(**updates) if updates else node

    return rebuild(tree)


class _ByOriginal(cst.CSTTransformer):
    def __init__(self, fn: Callable[[cst.CSTNode, cst.CSTNode], cst.CSTNode | None]):
        super().__init__()
        self.fn = fn

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = self.fn(original_node, updated_node)
        return updated_node if result is None else result


def transform_original(node: cst.CSTNode, fn: Callable[[cst.CSTNode, cst.CSTNode], cst.CSTNode | None]):
    """Bottom-up rewrite keyed by the original tree: ``fn(original, updated)`` returns a replacement
    for a node (``updated``: the node with its children already rewritten) or None to keep it. The
    nodes of ``node`` itself can be matched by identity (``original is some_node_found_before``)."""
    return node.visit(_ByOriginal(fn))


def _replace_by_visit(tree: cst.CSTNode, changes: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """:func:`replace` for a tree that holds one node in two places: libcst's own walk."""
    return transform_original(tree, lambda original, updated: changes.get(id(original)))


# Each top-level statement's printed code, by the statement's identity and the module's formats.
_CODES: collections.OrderedDict = collections.OrderedDict()
_CODES_LIMIT = 1 << 15


def module_code(module: cst.Module) -> str:
    """``module.code``, each top-level statement printed once: a rewrite builds anew only the
    statements it changes (:func:`replace`, ``_cst.replace_function``), so a child's source is
    mostly its parent's statements, kept here by identity (libcst prints a module as its header,
    statements and footer one after the other, in a fresh state each: no statement's code depends
    on another's)."""
    if not module.has_trailing_newline:
        return module.code
    parts = []
    for node in (*module.header, *module.body, *module.footer):
        key = (id(node), module.default_indent, module.default_newline)
        with _KEPT_LOCK:
            hit = _CODES.get(key)
        if hit is None or hit[0] is not node:
            hit = (node, module.code_for_node(node))
            with _KEPT_LOCK:
                _CODES[key] = hit
                while len(_CODES) > _CODES_LIMIT:
                    _CODES.popitem(last=False)
        parts.append(hit[1])
    return "".join(parts) or module.default_newline
