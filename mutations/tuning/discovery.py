"""Tunables found, not declared: every integer that flows into a ``BlockSpec``'s block shape.

A kernel written by someone else holds its blocks in whatever style its author likes: module
constants (``TM = 256``), keyword defaults of the wrapper (``block_k=256``, or a tuple,
``block_shape=(512, 512)`` unpacked as ``l, r = block_shape``), a dataclass's fields
(``cfg.block_m`` with ``block_m: int = 128``), ``functools.partial(f, block_m=128)`` arguments, or
literals in the ``BlockSpec`` itself. :func:`discover` follows each element of each block shape of
each ``pallas_call`` reachable from the entry back to the integer literals that set it, through
local assignments, tuple unpacking, subscripts, ``min``/``max``, parameters (their defaults and
the keyword or positional arguments of their callers) and attributes, all within the module.

A tunable's legal values come from the arrays it tiles (the operand its ``BlockSpec`` maps, the
task's input or output): divisors of each dimension it tiles, and on the last two dimensions
Mosaic's tiling (a multiple of 128 lanes on the last, of 8 sublanes times the packing of the
dtype on the one before: 16 for bf16, 32 for int8), or the whole dimension. A tunable that tiles
several dimensions takes the values legal on all of them. A ``TUNE = {"name": [values]}`` dict at
module level declares a tunable's values itself (as Kernel Tuner users do): it wins over discovery.

A literal written in a block shape (``pl.BlockSpec((128, 128), ...)``) takes with it the literals of
the same value in that call's grid and scratch shapes: the same number said twice.
Nothing here runs the kernel: it reads its source.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import libcst as cst

from .. import _sites
from .._walk import walk
from .block_fields import set_literals

MAX_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class Tunable:
    """One discovered tunable: how the kernel names it, its value, the literals that hold it and
    the values legal for it (ascending)."""

    name: str
    value: int
    literals: tuple[cst.Integer, ...]
    legal: tuple[int, ...]
    declared: bool = False      # its values come from the module's TUNE dict
    sizes: tuple[int, ...] = ()  # the dimensions it tiles at this task


def sublanes(dtype: str) -> int:
    """Mosaic's sublane tile of the second-to-last dimension for ``dtype``: 8 rows of 32 bits."""
    size = {"bfloat16": 2, "float16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1,
            "float8_e4m3fn": 1, "float8_e5m2": 1}.get(dtype, 4)
    return 8 * (4 // size)


def legal_tiles(size: int, from_end: int, dtype: str) -> list[int]:
    """Block sizes legal for a dimension of ``size`` that is the ``from_end``-th from the end."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    if from_end == 1:
        return [d for d in divisors if d % 128 == 0 or d == size]
    if from_end == 2:
        return [d for d in divisors if d % sublanes(dtype) == 0 or d == size]
    return divisors


# ---- the module's names ---------------------------------------------------------------------------
def _functions(module: cst.Module) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}


def _constants(module: cst.Module) -> dict[str, cst.BaseExpression]:
    out = {}
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target,
                                                                                            cst.Name):
                    out[small.targets[0].target.value] = small.value
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                    out[small.target.value] = small.value
    return out


def _aliases(module: cst.Module) -> dict[str, str]:
    """Module-level names bound to a function: ``f2 = f`` or ``f2 = functools.partial(f, ...)``."""
    functions, out = _functions(module), {}
    for name, value in _constants(module).items():
        if isinstance(value, cst.Call) and _callee(value) == "partial" and value.args:
            value = value.args[0].value
        target = value.value if isinstance(value, cst.Name) else None
        if target in functions:
            out[name] = target
    return out


def _callee(call: cst.Call) -> str | None:
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _walk(node: cst.CSTNode, kind: type) -> list:
    return [n for n in walk(node) if isinstance(n, kind)]


def _assignments(fn: cst.FunctionDef) -> dict[str, tuple[cst.BaseExpression, int | None]]:
    """Local names bound in ``fn`` (the last binding wins): name -> (value, index into it)."""
    out: dict[str, tuple[cst.BaseExpression, int | None]] = {}
    for assign in _walk(fn.body, cst.Assign):
        for target in assign.targets:
            t = target.target
            if isinstance(t, cst.Name):
                out[t.value] = (assign.value, None)
            elif isinstance(t, (cst.Tuple, cst.List)):
                for i, el in enumerate(t.elements):
                    if isinstance(el.value, cst.Name):
                        out[el.value.value] = (assign.value, i)
    return out


def _positional(fn: cst.FunctionDef) -> list[cst.Param]:
    return [*fn.params.posonly_params, *fn.params.params]


def _params(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


class _Resolver:
    """Follows an expression in a function back to the integer literals that set it."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.functions = _functions(module)
        self.constants = _constants(module)
        self.calls = _walk(module, cst.Call)
        self.caller = {id(call): fn for fn in self.functions.values() for call in _walk(fn, cst.Call)}

    def resolve(self, expr: cst.BaseExpression, fn: cst.FunctionDef | None, index: int | None = None,
                name: str | None = None, depth: int = 0) -> dict[str, list[cst.Integer]] | None:
        """``{tunable name: literals}`` that set ``expr`` (``index``: its element), or None."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, (cst.Tuple, cst.List)):
            if index is None or index >= len(expr.elements):
                return None
            return self.resolve(expr.elements[index].value, fn, None, name, depth + 1)
        if index is not None and not isinstance(expr, (cst.Name, cst.Attribute)):
            return None
        if isinstance(expr, cst.Integer):
            return {name or "literal": [expr]}
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            idx = expr.slice[0].slice
            if isinstance(idx, cst.Index) and isinstance(idx.value, cst.Integer):
                i = int(idx.value.evaluated_value)
                base = self._label(expr.value)
                return self.resolve(expr.value, fn, i, f"{base}[{i}]" if base else None, depth + 1)
            return None
        if isinstance(expr, cst.Call) and _callee(expr) in ("min", "max"):
            for arg in expr.args:
                found = self.resolve(arg.value, fn, None, None, depth + 1)
                if found:
                    return found
            return None
        if isinstance(expr, cst.Name):
            return self._name(expr.value, fn, index, name, depth)
        if isinstance(expr, cst.Attribute):
            return self._field(expr.attr.value, index, name, depth)
        return None

    @staticmethod
    def _label(expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Name):
            return expr.value
        if isinstance(expr, cst.Attribute):
            return expr.attr.value
        return None

    def _named(self, var: str, index: int | None, name: str | None) -> str:
        return name or (f"{var}[{index}]" if index is not None else var)

    def _name(self, var: str, fn, index, name, depth):
        label = self._named(var, index, name)
        if fn is not None:
            local = _assignments(fn).get(var)
            if local is not None and var in _sites._names(local[0]) and any(p.name.value == var for p in _params(fn)):
                local = None      # a parameter rebound from itself (``tiling = tiling(m, k, n)``): its value flows
            if local is not None:
                value, i = local
                if i is not None:
                    base = self._label(value)
                    return self.resolve(value, fn, i, name or (f"{base}[{i}]" if base else var), depth + 1)
                return self.resolve(value, fn, index, label, depth + 1)
            for param in _params(fn):
                if param.name.value == var:
                    return self._param(fn, param, index, label, depth)
        if var in self.constants:
            return self.resolve(self.constants[var], None, index, label, depth + 1)
        return None

    def _param(self, fn: cst.FunctionDef, param: cst.Param, index, label, depth):
        """A parameter: what its callers pass it (a keyword, a partial's keyword, a positional
        argument: a literal, or a name the caller binds, such as its own parameter), and its
        default. An entry's ``block_rows=32`` handed on to a helper's ``block_rows`` is one
        tunable, the entry's default and the helper's (if any) set together."""
        var, out = param.name.value, {}
        position = [p.name.value for p in _positional(fn)]
        for call in self.calls:
            callee = _callee(call)
            args = list(call.args)
            if callee == "partial" and args and self._label(args[0].value) == fn.name.value:
                args = args[1:]
            elif callee != fn.name.value:
                continue
            for i, arg in enumerate(args):
                hit = (arg.keyword is not None and arg.keyword.value == var) or \
                      (arg.keyword is None and not arg.star and i < len(position) and position[i] == var)
                if hit:     # a literal, or a name in the caller (its own parameter, followed in turn)
                    found = self.resolve(arg.value, self.caller.get(id(call)), index, label, depth + 1)
                    if found:
                        for k, v in found.items():
                            out.setdefault(k, []).extend(v)
        if param.default is not None:
            found = self.resolve(param.default, None, index, label, depth + 1)
            if found:
                for k, v in found.items():
                    out.setdefault(k, []).extend(v)
        return out or None

    def _field(self, attr: str, index, name, depth):
        """``obj.attr``: every literal that sets a field ``attr`` in the module: a class body's
        ``attr: T = <int>`` and a call's ``attr=<int>`` keyword."""
        label, out = self._named(attr, index, name), []
        for cls in _walk(self.module, cst.ClassDef):
            for stmt in cls.body.body:
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)
                                and small.target.value == attr and small.value is not None):
                            found = self.resolve(small.value, None, index, label, depth + 1)
                            out += (found or {}).get(label, [])
        for call in self.calls:
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == attr:
                    found = self.resolve(arg.value, None, index, label, depth + 1)
                    out += (found or {}).get(label, [])
        return {label: out} if out else None


# ---- the block shapes of each pallas_call --------------------------------------------------------
def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    """``name=`` of ``call`` or of a grid spec built inside its arguments."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    for arg in call.args:
        if isinstance(arg.value, cst.Call):
            found = _keyword(arg.value, name)
            if found is not None:
                return found
    return None


def _block_shapes(specs: cst.BaseExpression | None, fn: cst.FunctionDef) -> list[tuple[int, cst.Tuple | None]]:
    """(position, block-shape tuple or None) of each BlockSpec in ``specs`` (written there, or bound
    to a local name first: ``lhs_spec = pl.BlockSpec(...)``)."""
    if specs is None:
        return []
    local = _assignments(fn)
    items = [e.value for e in specs.elements] if isinstance(specs, (cst.List, cst.Tuple)) else [specs]
    out = []
    for i, item in enumerate(items):
        for _ in range(MAX_DEPTH):
            if not isinstance(item, cst.Name) or local.get(item.value, (None, 0))[1] is not None:
                break
            item = local[item.value][0]
        shape = None
        if isinstance(item, cst.Call) and _callee(item) == "BlockSpec":
            first = next((a.value for a in item.args if a.keyword is None or a.keyword.value == "block_shape"), None)
            shape = first if isinstance(first, cst.Tuple) else None
        out.append((i, shape))
    return out


def _operands(fn: cst.FunctionDef, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The operands the pallas_call's kernel is applied to: ``pallas_call(...)(x, w)``, or
    ``f = pallas_call(...)`` then ``f(x, w)``."""
    names = {name for name, (value, i) in _assignments(fn).items() if value is call and i is None}
    for outer in _walk(fn, cst.Call):
        if outer.func is call or (isinstance(outer.func, cst.Name) and outer.func.value in names):
            return [a.value for a in outer.args]
    return None


def _input_specs(module: cst.Module, entry: str, specs: list[tuple[tuple[int, ...], str]]
                 ) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    """function -> {parameter: (shape, dtype)}: the entry's positional inputs, passed on by name
    to the module's functions it calls (and they to theirs)."""
    functions, aliases = _functions(module), _aliases(module)
    if entry not in functions:
        return {}
    first = [p.name.value for p in _positional(functions[entry])]
    out = {entry: dict(zip(first, specs))}
    todo = [entry]
    while todo:
        name = todo.pop()
        known = out[name]
        for call in _walk(functions[name], cst.Call):
            callee = _callee(call)
            callee = aliases.get(callee, callee)
            if callee not in functions or callee == name:
                continue
            params = [p.name.value for p in _positional(functions[callee])]
            mapped = dict(out.get(callee, {}))
            for i, arg in enumerate(call.args):
                if isinstance(arg.value, cst.Name) and arg.value.value in known and not arg.star:
                    target = arg.keyword.value if arg.keyword is not None else (params[i] if i < len(params) else None)
                    if target is not None and target not in mapped:
                        mapped[target] = known[arg.value.value]
            if mapped != out.get(callee):
                out[callee] = mapped
                todo.append(callee)
    return out


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def _discover(module: cst.Module, entry: str | None, specs: tuple, out: tuple | None) -> dict[str, Tunable]:
    if not entry:
        return {}
    resolver = _Resolver(module)
    inputs = _input_specs(module, entry, list(specs))
    reach = set(_sites.reachable(module, entry))
    for alias, target in _aliases(module).items():     # a partial the reachable functions call
        if any(alias in _sites._names(_functions(module)[f].body) for f in reach if f in _functions(module)):
            reach |= set(_sites.reachable(module, target))
    dims: dict[str, list[tuple[int, int, str]]] = {}
    literals: dict[str, list[cst.Integer]] = {}
    for fn in _sites.pallas_functions(module):
        if fn.name.value not in reach:
            continue
        known = inputs.get(fn.name.value, {})
        for call in _walk(fn, cst.Call):
            if not _sites._is_pallas_call(call):
                continue
            operands = _operands(fn, call) or []
            prefetch = _keyword(call, "num_scalar_prefetch")
            skip = int(prefetch.evaluated_value) if isinstance(prefetch, cst.Integer) else 0
            arrays = []
            for i, shape in _block_shapes(_keyword(call, "in_specs"), fn):
                operand = operands[skip + i] if skip + i < len(operands) else None
                arrays.append((shape, known.get(operand.value) if isinstance(operand, cst.Name) else None))
            arrays += [(shape, out) for _, shape in _block_shapes(_keyword(call, "out_specs"), fn)]
            for shape, array in arrays:
                if shape is None:
                    continue
                for j, element in enumerate(shape.elements):
                    found = resolver.resolve(element.value, fn)
                    if not found or len(found) != 1:
                        continue
                    (name, nodes), = found.items()
                    if name == "literal":
                        name = f"{fn.name.value}.block{j - len(shape.elements)}={nodes[0].value}"
                        nodes = nodes + _same_literals(call, int(nodes[0].evaluated_value), element.value)
                    literals.setdefault(name, []).extend(n for n in nodes if n not in literals.get(name, []))
                    if array is not None and len(array[0]) == len(shape.elements):
                        dims.setdefault(name, []).append((array[0][j], len(shape.elements) - j, array[1]))
    declared = _declared(resolver)
    found = {}
    for name, nodes in literals.items():
        values = {int(n.evaluated_value) for n in nodes}
        if len(values) != 1 or (name not in dims and name not in declared):
            continue
        value = values.pop()
        if name in declared:
            legal = sorted(set(declared[name]))
        else:
            sets = [set(legal_tiles(size, end, dtype)) for size, end, dtype in dims[name]]
            legal = sorted(set.intersection(*sets))
        sizes = tuple(sorted({size for size, _, _ in dims.get(name, [])}))
        found[name] = Tunable(name, value, tuple(nodes), tuple(legal), name in declared, sizes)
    return found


def _same_literals(call: cst.Call, value: int, written: cst.BaseExpression) -> list[cst.Integer]:
    """The literals equal to ``value`` in the call's grid, block shapes and scratch shapes, other
    than ``written``: the same number said again."""
    out = []
    for key in ("grid", "in_specs", "out_specs", "scratch_shapes"):
        expr = _keyword(call, key)
        if expr is not None:
            out += [n for n in _walk(expr, cst.Integer) if n is not written and int(n.evaluated_value) == value]
    return out


def _declared(resolver: _Resolver) -> dict[str, list[int]]:
    """The module's ``TUNE = {"name": [values], ...}``, if any."""
    tune = resolver.constants.get("TUNE")
    out: dict[str, list[int]] = {}
    if isinstance(tune, cst.Dict):
        for el in tune.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) and \
                    isinstance(el.value, (cst.List, cst.Tuple)):
                values = [int(v.value.evaluated_value) for v in el.value.elements if isinstance(v.value, cst.Integer)]
                if values:
                    out[el.key.evaluated_value] = values
    return out


def discover(module: cst.Module, task: Any) -> dict[str, Tunable]:
    """The tunables of ``module`` for ``task`` (its entry, its inputs' and output's shapes), by
    name, each with at least one legal value."""
    entry = getattr(task, "entry", None)
    specs = tuple((tuple(s), d) for s, d in task.input_specs())
    shape = getattr(task, "output_shape", None)
    out = (tuple(shape), task.output_dtype) if shape is not None else None
    return {n: t for n, t in _discover(module, entry, specs, out).items() if t.legal}


def set_values(module: cst.Module, task: Any, values: dict[str, int]) -> cst.Module:
    """Every literal of each named tunable set to its new value."""
    table = discover(module, task)
    return set_literals(module, {id(lit): values[t.name] for t in table.values() if t.name in values
                                 for lit in t.literals})
