"""Small libcst helpers shared by the operators: finding the kernel, its regions, the tunables.

The structure the operators rely on (all present in the seed, and preserved by every operator):

* a module-level wrapper (the one function calling ``pl.pallas_call``) that builds
  ``functools.partial(<kernel>, ...)`` and calls ``pl.pallas_call`` with ``grid``,
  ``in_specs``, ``out_specs``, ``scratch_shapes`` and ``compiler_params``;
* a module-level kernel whose positional parameters are ``q, k, v, o`` refs then the ``m, l,
  acc`` scratch refs, and whose body is: program ids, ``_init`` (``pl.when``), the per-step
  compute, ``_store`` (``pl.when``). The compute may have been moved into ``def _step(...)``.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable, Iterator

import libcst as cst

from . import _sites
from ._errors import NotApplicable
from ._walk import nodes, per_tree, replace, transform_original  # noqa: F401 - the operators' C.transform_original

TUNABLE_PREFIXES = ("BLOCK_", "HEADS_PER_PROGRAM", "VMEM_LIMIT_BYTES", "DIAGONAL_STRIP", "KV_SPLITS", "CHIPS")

_EMPTY = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def norm(node: cst.CSTNode) -> str:
    """The node's code with all whitespace (and comments-free spacing) removed, for matching."""
    return "".join(code(node).split())


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def stmts(text: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(textwrap.dedent(text)).body)


class _Fn(cst.CSTTransformer):
    def __init__(self, fn: Callable[[cst.CSTNode], cst.CSTNode | None]):
        super().__init__()
        self.fn = fn

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = self.fn(updated_node)
        return updated_node if result is None else result


def transform(node: cst.CSTNode, fn: Callable[[cst.CSTNode], cst.CSTNode | None]):
    """Bottom-up rewrite: ``fn`` returns a replacement for a node or None to keep it."""
    return node.visit(_Fn(fn))


def replace_node(tree: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    """``tree`` with ``old`` (a node of it, by identity) replaced by ``new``, as libcst's
    ``deep_replace``, building anew only ``old``'s ancestors (``_walk.replace``)."""
    return replace(tree, {id(old): new})


def find_all(node: cst.CSTNode, pred: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    """The nodes under ``node`` (itself included) that ``pred`` holds for, in visiting order."""
    return [n for n in nodes(node) if pred(n)]


def is_call(node: cst.CSTNode, func: str) -> bool:
    return isinstance(node, cst.Call) and norm(node.func) == func


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in find_all(node, lambda x: isinstance(x, cst.Name))}  # type: ignore[attr-defined]


def assigned_name(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``NAME = value`` as a simple statement line -> (NAME, value)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)):
            return small.targets[0].target.value, small.value
    return None


# ---- module level ---------------------------------------------------------------------------
def module_function(module: cst.Module, name: str) -> cst.FunctionDef | None:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def replace_function(module: cst.Module, name: str, new: cst.FunctionDef) -> cst.Module:
    body = [new if isinstance(s, cst.FunctionDef) and s.name.value == name else s
            for s in module.body]
    return module.with_changes(body=body)


def wrapper(module: cst.Module) -> cst.FunctionDef:
    """The kernel's wrapper: the site's module-level function calling ``pl.pallas_call`` (the one
    such function in a seed, whatever its name; see :mod:`mutations._sites` for modules with
    several)."""
    return _sites.wrapper(module)


def replace_wrapper(module: cst.Module, new: cst.FunctionDef) -> cst.Module:
    return replace_function(module, wrapper(module).name.value, new)


def kernel_name(module: cst.Module) -> str:
    return _kernel_name(wrapper(module), module)


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def _kernel_name(site: cst.FunctionDef, module: cst.Module) -> str:
    partials = find_all(site, lambda n: is_call(n, "functools.partial"))
    for call in partials:
        if call.args and isinstance(call.args[0].value, cst.Name):  # type: ignore[attr-defined]
            name = call.args[0].value.value  # type: ignore[attr-defined]
            if module_function(module, name) is not None:
                return name
    for call in find_all(site, lambda n: is_call(n, "pl.pallas_call")):
        first = call.args[0].value if call.args else None  # type: ignore[attr-defined]
        if isinstance(first, cst.Name) and module_function(module, first.value) is not None:
            return first.value                               # pl.pallas_call(kernel, ...)
    raise NotApplicable("pallas_call's kernel is not a module-level function, nor a functools.partial of one")


def kernel(module: cst.Module) -> cst.FunctionDef:
    fn = module_function(module, kernel_name(module))
    assert fn is not None
    return fn


def kernel_refs(fn: cst.FunctionDef) -> tuple[list[str], list[str]]:
    """(io refs q, k, v, o; scratch refs m, l, acc) by position."""
    names = [p.name.value for p in fn.params.params]
    if len(names) < 7:
        star = f", *{fn.params.star_arg.name.value}" if isinstance(fn.params.star_arg, cst.Param) else ""
        raise NotApplicable(f"kernel {fn.name.value}({', '.join(names)}{star}) names {len(names)} of the "
                            "7 refs this operator rewrites (q, k, v, o, then the m, l, acc scratch)")
    return names[:4], names[4:7]


def kernel_kwonly(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in fn.params.kwonly_params]


def pallas_call(module: cst.Module) -> cst.Call:
    return _pallas_call(wrapper(module))


@functools.lru_cache(maxsize=256)
def _pallas_call(site: cst.FunctionDef) -> cst.Call:
    calls = find_all(site, lambda n: is_call(n, "pl.pallas_call"))
    if len(calls) != 1:
        raise NotApplicable(f"expected one pl.pallas_call in the wrapper, found {len(calls)}")
    return calls[0]  # type: ignore[return-value]


def call_kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def scratch_vmem_calls(module: cst.Module) -> list[cst.Call]:
    shapes = call_kwarg(pallas_call(module), "scratch_shapes")
    if not isinstance(shapes, (cst.List, cst.Tuple)):
        raise NotApplicable("pallas_call has no literal scratch_shapes list")
    calls = [e.value for e in shapes.elements]
    if len(calls) < 3 or not all(is_call(c, "pltpu.VMEM") and c.args
                                 and isinstance(c.args[0].value, cst.Tuple) for c in calls):
        raise NotApplicable("scratch_shapes is not a list of pltpu.VMEM((...), dtype)")
    return calls  # type: ignore[return-value]


def stats_compact(module: cst.Module) -> bool:
    """True when the m / l scratch have a last dimension of 1."""
    calls = scratch_vmem_calls(module)
    last = [c.args[0].value.elements[-1].value for c in calls[:2]]  # type: ignore[attr-defined]
    return all(isinstance(x, cst.Integer) and x.evaluated_value == 1 for x in last)


# ---- the kernel's regions -------------------------------------------------------------------
def _is_when_def(stmt: cst.CSTNode, name: str) -> bool:
    return (isinstance(stmt, cst.FunctionDef) and stmt.name.value == name
            and any(is_call(d.decorator, "pl.when") for d in stmt.decorators))


def top_function(fn: cst.FunctionDef, name: str) -> cst.FunctionDef | None:
    for stmt in fn.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def compute_span(fn: cst.FunctionDef) -> tuple[int, int]:
    """Indices [start, stop) of the top-level compute statements between _init and _store."""
    body = list(fn.body.body)
    init = [i for i, s in enumerate(body) if _is_when_def(s, "_init")]
    store = [i for i, s in enumerate(body) if _is_when_def(s, "_store")]
    if len(init) != 1 or len(store) != 1 or not init[0] < store[0]:
        raise NotApplicable("kernel body is not 'ids, @pl.when _init, compute, @pl.when _store'")
    return init[0] + 1, store[0]


def compute_statements(fn: cst.FunctionDef) -> list[cst.BaseStatement]:
    """The per-step compute: the body of ``_step`` if present, else the top-level span."""
    step = top_function(fn, "_step")
    if step is not None:
        return list(step.body.body)
    start, stop = compute_span(fn)
    return list(fn.body.body)[start:stop]


def replace_compute(fn: cst.FunctionDef,
                    rewrite: Callable[[list[cst.BaseStatement]], list[cst.BaseStatement]]):
    step = top_function(fn, "_step")
    body = list(fn.body.body)
    if step is not None:
        new_step = step.with_changes(body=step.body.with_changes(body=rewrite(list(step.body.body))))
        body = [new_step if s is step else s for s in body]
    else:
        start, stop = compute_span(fn)
        body = body[:start] + rewrite(body[start:stop]) + body[stop:]
    return fn.with_changes(body=fn.body.with_changes(body=body))


def store_function(fn: cst.FunctionDef) -> cst.FunctionDef:
    for stmt in fn.body.body:
        if _is_when_def(stmt, "_store"):
            return stmt  # type: ignore[return-value]
    raise NotApplicable("kernel has no @pl.when _store")


def replace_top(fn: cst.FunctionDef, old: cst.CSTNode, new: cst.BaseStatement | list):
    out: list = []
    for stmt in fn.body.body:
        if stmt is old:
            out.extend(new if isinstance(new, list) else [new])
        else:
            out.append(stmt)
    return fn.with_changes(body=fn.body.with_changes(body=out))


def program_id_names(fn: cst.FunctionDef) -> dict[int, str]:
    out: dict[int, str] = {}
    for stmt in fn.body.body:
        pair = assigned_name(stmt)
        if pair and is_call(pair[1], "pl.program_id") and pair[1].args:  # type: ignore[attr-defined]
            axis = pair[1].args[0].value  # type: ignore[attr-defined]
            if isinstance(axis, cst.Integer):
                out[axis.evaluated_value] = pair[0]
    return out


def with_block(stmt_text: str, body: list[cst.BaseStatement]) -> cst.BaseCompoundStatement:
    """Parse a compound statement header (with a ``pass`` body) and give it ``body``."""
    node = cst.parse_statement(textwrap.dedent(stmt_text))
    assert isinstance(node, cst.BaseCompoundStatement)
    return node.with_changes(body=node.body.with_changes(body=body))


def add_kwonly_param(fn: cst.FunctionDef, name: str) -> cst.FunctionDef:
    if name in kernel_kwonly(fn):
        return fn
    params = fn.params
    new = list(params.kwonly_params) + [cst.Param(cst.Name(name))]
    star = params.star_arg if not isinstance(params.star_arg, cst.MaybeSentinel) else cst.ParamStar()
    # Keep the trailing formatting of the last existing parameter for the new one.
    if params.kwonly_params:
        last = params.kwonly_params[-1]
        new[-2] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        new[-1] = new[-1].with_changes(comma=last.comma)
    return fn.with_changes(params=params.with_changes(kwonly_params=new, star_arg=star))


def add_call_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    args = list(call.args)
    if any(a.keyword is not None and a.keyword.value == name for a in args):
        return call
    new_arg = cst.Arg(value=expr(value), keyword=cst.Name(name),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
    if args:
        # Put the new argument on its own line when the call is already laid out over lines.
        gap: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
        if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
            gap = call.whitespace_before_args
        for arg in args[:-1]:
            if isinstance(arg.comma, cst.Comma) and isinstance(arg.comma.whitespace_after,
                                                               cst.ParenthesizedWhitespace):
                gap = arg.comma.whitespace_after
        last = args[-1]
        # The whitespace before the closing parenthesis stays before it (after the new argument).
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=gap),
                                     whitespace_after_arg=cst.SimpleWhitespace(""))
        new_arg = new_arg.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
    return call.with_changes(args=args + [new_arg])


PLTPU = "from jax.experimental.pallas import tpu as pltpu"


def with_import(module: cst.Module, line: str = PLTPU) -> cst.Module:
    """``module`` with the import statement ``line`` after its last top-level import, unless a
    top-level statement is that line already."""
    if any(isinstance(s, cst.SimpleStatementLine) and code(s).strip() == line for s in module.body):
        return module
    at = max((i + 1 for i, s in enumerate(module.body) if isinstance(s, cst.SimpleStatementLine)
              and isinstance(s.body[0], (cst.Import, cst.ImportFrom))), default=0)
    return module.with_changes(body=[*module.body[:at], *stmts(line + "\n"), *module.body[at:]])


def grid_tuple(wrapper: cst.FunctionDef) -> cst.Tuple:
    """The grid's literal tuple: the ``grid=`` keyword's value, or the one tuple a local name it
    passes was assigned."""
    args = find_all(wrapper, lambda n: isinstance(n, cst.Arg) and n.keyword is not None
                      and n.keyword.value == "grid")
    if len(args) != 1:
        raise NotApplicable(f"the wrapper passes grid= {len(args)} times (expected once)")
    value = args[0].value  # type: ignore[attr-defined]
    if isinstance(value, cst.Name):
        found = [pair[1] for s in find_all(wrapper, lambda n: isinstance(n, cst.SimpleStatementLine))
                 if (pair := assigned_name(s)) and pair[0] == value.value]
        value = found[0] if len(found) == 1 else None
    if not isinstance(value, cst.Tuple) or any(isinstance(e, cst.StarredElement) for e in value.elements):
        raise NotApplicable("the grid is not a literal tuple (grid=(a, b, ...)) in the wrapper")
    return value


@per_tree
def _calls(node: cst.CSTNode) -> dict[str, tuple[cst.Call, ...]]:
    """The calls under ``node`` by the dotted name they call, in visiting order."""
    out: dict[str, list[cst.Call]] = {}
    for n in nodes(node):
        if isinstance(n, cst.Call):
            out.setdefault(norm(n.func), []).append(n)
    return {name: tuple(calls) for name, calls in out.items()}


def iter_calls(node: cst.CSTNode, func: str) -> Iterator[cst.Call]:
    yield from _calls(node).get(func, ())


# ---- a site's kernel functions (production modules) ------------------------------------------
def site_kernels(module: cst.Module) -> list[cst.FunctionDef]:
    """The module-level functions the site's kernel runs: the kernel handed to functools.partial
    and the functions it calls (JAX's kernel dispatches to a multi-step and a single-step body)."""
    defs = _sites.definitions(module)
    out = []
    for name in _sites.site_functions(module, kernel_name(module)):
        fn = defs[name]
        if isinstance(fn, cst.FunctionDef) and not _sites.calls_pallas(fn):
            out.append(fn)
    return out


def assigned_from(fn: cst.CSTNode, prefixes: tuple[str, ...]) -> set[str]:
    """Names assigned (``NAME = ...``) from an expression whose code starts with one of
    ``prefixes`` (e.g. ``jnp.sum(``), anywhere in ``fn``."""
    out = set()
    for node in find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                         and isinstance(n.targets[0].target, cst.Name)):
        if norm(node.value).startswith(prefixes):  # type: ignore[attr-defined]
            out.add(node.targets[0].target.value)  # type: ignore[attr-defined]
    return out


def definition_statement(module: cst.Module, fn: cst.FunctionDef) -> int | None:
    """The index in ``module.body`` of the statement defining ``fn``: the function itself, or the
    class whose method it is; None when ``fn`` is neither."""
    for i, stmt in enumerate(module.body):
        if stmt is fn or (isinstance(stmt, cst.ClassDef) and any(item is fn for item in stmt.body.body)):
            return i
    return None
