"""Module-level integer tunables (``BLOCK_Q = 128``, ``VMEM_LIMIT_BYTES = 48 * 1024 * 1024``)."""

from __future__ import annotations

import libcst as cst

from ._base import NotApplicable, parse
from ._cst import TUNABLE_PREFIXES, assigned_name


def _int_value(node: cst.BaseExpression) -> int | None:
    """Evaluate an integer literal or a product / sum / shift of integer literals."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.BinaryOperation):
        left, right = _int_value(node.left), _int_value(node.right)
        if left is None or right is None:
            return None
        op = node.operator
        if isinstance(op, cst.Multiply):
            return left * right
        if isinstance(op, cst.Add):
            return left + right
        if isinstance(op, cst.Subtract):
            return left - right
        if isinstance(op, cst.LeftShift):
            return left << right
    return None


def _is_tunable(name: str) -> bool:
    return name.isupper() and name.startswith(TUNABLE_PREFIXES)


def module_ints(module: cst.Module) -> dict[str, int]:
    out: dict[str, int] = {}
    for stmt in module.body:
        pair = assigned_name(stmt)
        if pair is not None and pair[0].isupper():
            value = _int_value(pair[1])
            if value is not None:
                out[pair[0]] = value
    return out


def read_tunables(source: str) -> dict[str, int]:
    """The module-level integer tunables of a kernel source (BLOCK_Q, BLOCK_KV, ...).

    Returns ``{}`` for a source that does not parse.
    """
    try:
        module = parse(source)      # the operators' parse, shared: the surrogate reads every child
    except cst.ParserSyntaxError:
        return {}
    return {k: v for k, v in module_ints(module).items() if _is_tunable(k)}


def set_tunable(module: cst.Module, name: str, value_code: str,
                comment: str | None = None) -> cst.Module:
    """Set ``NAME = value_code`` at module level; insert it after the last tunable if absent (a
    module with none, e.g. a kernel whose blocks are arguments: NotApplicable, not a failure)."""
    value = cst.parse_expression(value_code)
    body = list(module.body)
    for i, stmt in enumerate(body):
        pair = assigned_name(stmt)
        if pair is not None and pair[0] == name:
            assign = stmt.body[0]  # type: ignore[attr-defined]
            body[i] = stmt.with_changes(body=[assign.with_changes(value=value)])  # type: ignore
            return module.with_changes(body=body)
    last = None
    for i, stmt in enumerate(body):
        pair = assigned_name(stmt)
        if pair is not None and _is_tunable(pair[0]):
            last = i
    if last is None:
        raise NotApplicable(f"no module-level tunable (BLOCK_*, ...) to place {name} after")
    line = cst.parse_statement(f"{name} = {value_code}\n")
    if comment:
        line = line.with_changes(trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(f"# {comment}")))
    body.insert(last + 1, line)
    return module.with_changes(body=body)
