"""The read-only walk (mutations._walk) meets the same nodes in the same order as libcst's visit,
on every seed, on JAX's flash attention module and on built trees (lists, an f-string's spec); its
replace gives the tree libcst's ``deep_replace`` gives, building anew only what it must; and a
module printed statement by statement is the module's code."""

from __future__ import annotations

import inspect

import libcst as cst
import pytest

from mutations._walk import module_code, replace, walk

from .seed_cases import seed_cases


class _Visited(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def _same_order(node: cst.CSTNode) -> None:
    visited = _Visited()
    node.visit(visited)
    walked = list(walk(node))
    assert len(walked) == len(visited.nodes)
    assert all(a is b for a, b in zip(walked, visited.nodes))


@pytest.mark.parametrize("case", seed_cases(), ids=lambda c: c.id)
def test_walk_follows_visit_on_seeds(case):
    _same_order(cst.parse_module(case.source))


def test_walk_follows_visit_on_jax_flash_attention():
    from jax.experimental.pallas.ops.tpu import flash_attention

    _same_order(cst.parse_module(inspect.getsource(flash_attention)))


def test_walk_follows_visit_on_built_and_odd_trees():
    # A format spec that the type's first node left None; a star import; a built body (a list).
    _same_order(cst.parse_module('a = f"{x}"\nb = f"{y:>{w}}"\nfrom m import *\n'))
    body = [cst.parse_statement("x = pl.pallas_call(k)(q)\n"), cst.parse_statement("y = 1\n")]
    _same_order(cst.Module(body=body))


def _jax_flash_attention() -> str:
    from jax.experimental.pallas.ops.tpu import flash_attention

    return inspect.getsource(flash_attention)


def test_replace_gives_deep_replaces_tree_and_keeps_every_other_node():
    module = cst.parse_module(_jax_flash_attention())
    integers = [n for n in walk(module) if isinstance(n, cst.Integer)]
    calls = [n for n in walk(module) if isinstance(n, cst.Call)]
    cases = [(integers[7], cst.Integer("4096")), (calls[-1], cst.Name("out")),
             (module.body[3], cst.parse_statement("x = 1\n"))]
    for old, new in cases:
        ours = replace(module, {id(old): new})
        theirs = module.deep_replace(old, new)
        assert ours.code == theirs.code
        assert ours.deep_equals(theirs)
        # only the path from the root to the replaced node is new
        before = {id(n) for n in walk(module)}
        new_nodes = [n for n in walk(ours) if id(n) not in before]
        assert 1 <= len(new_nodes) <= 60 and len(before) > 10_000
    # several at once, and an id not in the tree changes nothing
    many = replace(module, {id(integers[1]): cst.Integer("1"), id(integers[2]): cst.Integer("2"),
                            id(object()): cst.Name("x")})
    expected = module.deep_replace(integers[1], cst.Integer("1"))
    again = [n for n in walk(expected) if isinstance(n, cst.Integer)][2]     # deep_replace rebuilt every node
    assert many.code == expected.deep_replace(again, cst.Integer("2")).code
    assert replace(module, {}) is module and replace(module, {id(module): cst.Module(body=[])}).code == "\n"


def test_replace_in_a_tree_holding_one_node_twice_falls_back_to_libcst():
    shared = cst.parse_statement("x = 1\n")
    module = cst.Module(body=[shared, cst.parse_statement("y = 2\n"), shared])
    one = shared.body[0].value
    assert replace(module, {id(one): cst.Integer("5")}).code == "x = 5\ny = 2\nx = 5\n"


@pytest.mark.parametrize("case", seed_cases(), ids=lambda c: c.id)
def test_a_module_printed_by_statements_is_its_code(case):
    module = cst.parse_module(case.source)
    assert module_code(module) == module.code
    changed = replace(module, {id(module.body[-1]): cst.parse_statement("z = 3  # a comment\n")})
    assert module_code(changed) == changed.code


def test_module_code_keeps_the_module_formats_and_corners():
    for text in ["", "\n", "# only a comment\n", "x = 1", "if x:\n\ty = 1\n", "x = 1\r\ny = 2\r\n",
                 "#!/usr/bin/env python\n\n\nx = 1\n\n# footer\n"]:
        module = cst.parse_module(text)
        assert module_code(module) == module.code == text
    body = cst.parse_module("if x:\n    y = 1\n").body
    for indent in ["    ", "\t"]:       # one statement, two modules' formats
        module = cst.Module(body=body, default_indent=indent)
        assert module_code(module) == module.code
