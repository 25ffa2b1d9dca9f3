"""The read-only walk (mutations._walk) meets the same nodes in the same order as libcst's visit,
on every seed, on JAX's flash attention module and on built trees (lists, an f-string's spec)."""

from __future__ import annotations

import inspect

import libcst as cst
import pytest

from mutations._walk import walk

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
