"""Tunables found, not declared: every integer that flows into a ``BlockSpec``'s block shape.

A kernel written by someone else holds its blocks in whatever style its author likes: module
constants (``TM = 256``), keyword defaults of the wrapper (``block_k=256``, or a tuple,
``block_shape=(512, 512)`` unpacked as ``l, r = block_shape``), a name bound to the whole block
(``block = (128, 128)``, then ``pl.BlockSpec(block, ...)``), a dataclass's fields (``cfg.block_m``
with ``block_m: int = 128``), a model's attributes (``self.block_m = 512`` in ``__init__``),
``functools.partial(f, block_m=128)`` arguments, a size the wrapper computes
(``bm = min(x.shape[0], 256)``, a branch on the shape, a helper that returns it), or literals in
the ``BlockSpec`` itself. :func:`discover` follows
each element of each block shape of each ``pallas_call`` reachable from the entry (a function, or a
method such as ``Model.forward``) back to the integer literals that set it
(mutations/tuning/follow.py).

A tunable is named from the code, never from its value, so an edit keeps its name: the variable,
parameter, attribute or field nearest the literal that every use passes through (``block_m``,
``block[0]``, ``cfg.block_m``), else the literal's place (``matmul.block[0]``; where two such places
share that, ``matmul.in_specs[1].block[0]``). Literals written in block shapes of one function that
say the same number on the same dimension (counted from the end) are one tunable, as are the
literals equal to it in that call's grid and scratch shapes: the same number said again.

A tunable's legal values come from the arrays it tiles at the task's shapes (the operand its
``BlockSpec`` maps, reshaped or transposed by the wrapper as it may be, or the output the call
declares; mutations/tuning/evaluate.py): divisors of each dimension it tiles, and on the last two
dimensions Mosaic's tiling (a multiple of 128 lanes on the last, of 8 sublanes times the packing of
the dtype on the one before: 16 for bf16, 32 for int8), or the whole dimension. A tunable that
tiles several dimensions takes the values legal on all of them; one the wrapper recomputes
(``while M % bm: bm //= 2``, ``min(bm, M)``) takes only the values that leave it as set, since the
others are undone. A ``TUNE = {"name": [values]}`` dict at module level declares a tunable's values
itself (as Kernel Tuner users do): it wins over discovery, and a module-level integer constant it
names is a tunable even where no block shape reads it (a chunk length the kernel walks inside a
block, Mamba-2's ``CHUNK``).

What is not followed is said (:func:`unfollowed`): each block element that does not come to a
literal, by its ``BlockSpec`` and why (a whole dimension of an input, a call discovery does not
follow, a loop whose test it cannot evaluate). Nothing here runs the kernel: it reads its source.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .._cst import code
from .._walk import walk
from . import names as N
from .block_fields import set_literals
from .blockspecs import Spec, keyword, specs as block_specs
from .evaluate import NA, Array, Scope, inputs
from .follow import SKIP, Follower, Hit, Why, common_name


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
    # the names it went by before names came from the code (``matmul.block-2=128``: a literal's
    # function, dimension from the end and value), so an archived edit that uses one replays
    aliases: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Left:
    """A block element left out: its BlockSpec, the element as written and why."""

    spec: Spec
    element: str
    why: Why


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


# ---- the block elements of each BlockSpec ----------------------------------------------------------
def _elements(spec: Spec, scope: Scope, follower: Follower) -> list[tuple[int, str, cst.CSTNode | None, Any]] | Why:
    """(position, code, the element's node if written, what following it gives) for each element
    of the spec's block shape: written as a tuple, or a name (``block``) followed element by element."""
    shape = spec.shape
    if isinstance(shape, (cst.Tuple, cst.List)):
        return [(j, code(el.value), el.value, follower.follow(el.value, spec.key) if isinstance(el, cst.Element)
                 else Why(code(el), "an unpacked sequence")) for j, el in enumerate(shape.elements)]
    value = scope.value(shape)
    rank = len(value) if isinstance(value, tuple) else len(spec.array.shape) if spec.array is not None else None
    if rank is None:
        found = follower.follow(shape, spec.key, 0)
        if isinstance(found, Why) and found is not SKIP:
            return found
        return Why(code(shape), "a block shape discovery does not follow to a tuple")
    return [(j, f"{code(shape)}[{j}]", None, follower.follow(shape, spec.key, j)) for j in range(rank)]


def _same_literals(call: cst.Call, value: int, written: cst.CSTNode | None) -> list[cst.Integer]:
    """The literals equal to ``value`` in the call's grid, block shapes and scratch shapes, other
    than ``written`` (and the index maps' block indices): the same number said again."""
    out = []
    for key in ("grid", "in_specs", "out_specs", "scratch_shapes"):
        expr = keyword(call, key)
        if expr is not None:
            maps = {id(n) for lam in walk(expr) if isinstance(lam, cst.Lambda) for n in walk(lam)}
            out += [n for n in walk(expr) if isinstance(n, cst.Integer) and n is not written
                    and id(n) not in maps and int(n.evaluated_value) == value]
    return out


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _place_names(groups: dict[str, dict]) -> None:
    """Names for the groups of literals written in block shapes: the first level of detail at which
    no two groups (nor a named tunable) share one."""
    taken = {g["name"] for g in groups.values() if g["name"] is not None}
    todo = [g for g in groups.values() if g["name"] is None]
    levels = (lambda g: f"{_short(g['spec'].key)}.block[{g['j']}]",
              lambda g: f"{_short(g['spec'].key)}.{g['spec'].where}.block[{g['j']}]",
              lambda g: f"{g['spec'].key}.{g['spec'].where}.block[{g['j']}]",
              lambda g: f"{g['spec'].key}.call[{g['spec'].nth}].{g['spec'].where}.block[{g['j']}]#{id(g)}")
    for level in levels:
        names = [level(g) for g in todo]
        rest = []
        for g, name in zip(todo, names):
            if names.count(name) == 1 and name not in taken:
                g["name"] = name
                taken.add(name)
            else:
                rest.append(g)
        todo = rest


def _merge(groups: dict[str, dict]) -> list[dict]:
    """Groups sharing a literal are one tunable (setting one sets the other), named as the first
    of them that the code names (else as the first)."""
    owner: dict[int, dict] = {}
    merged: list[dict] = []
    for g in groups.values():
        into = next((owner[id(lit)] for lit in g["literals"] if id(lit) in owner), None)
        if into is None:
            merged.append(g)
            into = g
        else:
            for field in ("literals", "dims", "guards", "unknown", "specs", "old"):
                into[field] += [x for x in g[field] if not any(x is y for y in into[field])]
            if into["placed"] and not g["placed"]:      # a name from the code over a place's
                into["name"], into["placed"] = g["name"], False
        for lit in into["literals"]:
            owner[id(lit)] = into
    return merged


# ---- the analysis ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Analysis:
    tunables: dict[str, Tunable]
    left: tuple[Left, ...]


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def _analyse(module: cst.Module, entry: str | None, specs: tuple, out: tuple | None, names: tuple) -> Analysis:
    tables = N.tables(module)
    shaped = bool(specs)
    known = inputs(tables, entry, specs, names) if entry else {}
    scopes: dict[str | None, Scope] = {}

    def scope(key: str | None) -> Scope:
        if key not in scopes:
            scopes[key] = Scope(tables, key, known.get(key or "", {}))
        return scopes[key]

    follower = Follower(tables, lambda key: scope(key).truth)
    task_out = Array(tuple(out[0]), out[1]) if out is not None else None
    groups: dict[str, dict] = {}
    left: list[Left] = []
    for spec in block_specs(tables, entry, scope, task_out):
        if spec.why is not None:
            left.append(Left(spec, "", Why("", spec.why)))
            continue
        elements = _elements(spec, scope(spec.key), follower)
        if isinstance(elements, Why):
            left.append(Left(spec, code(spec.shape), elements))
            continue
        rank = len(elements)
        for j, text, written, found in elements:
            if found is SKIP:
                continue
            if isinstance(found, Why):
                left.append(Left(spec, text, found))
                continue
            name = common_name(found)
            literals = [h.literal for h in found]
            if name is None:
                value = int(literals[0].evaluated_value)
                gid = f"@{spec.key}@{rank - j}@{value}"
                literals += _same_literals(spec.call, value, written)
            else:
                gid = name
            g = groups.setdefault(gid, {"name": name, "spec": spec, "j": j, "text": text, "literals": [],
                                        "dims": [], "guards": [], "unknown": [], "specs": [],
                                        "old": [f"{_short(spec.key)}.block{j - rank}="] if name is None else [],
                                        "placed": name is None})
            g["specs"] += [spec] if not any(spec is x for x in g["specs"]) else []
            g["literals"] += [lit for lit in literals if not any(lit is x for x in g["literals"])]
            g["guards"] += [h for hit in found for h in hit.guards if not any(h is x for x in g["guards"])]
            if spec.array is not None and len(spec.array.shape) == rank:
                g["dims"].append((spec.array.shape[j], rank - j, spec.array.dtype))
            else:
                g["unknown"].append(spec)
    _place_names(groups)
    declared = _declared(tables)
    found: dict[str, Tunable] = {}
    for g in _merge(groups):
        tunable, why = _tunable(g, declared, scope, shaped)
        if why is not None:
            left += [Left(spec, g["text"], why) for spec in g["specs"]]
        if tunable is not None:
            found[tunable.name] = tunable
    for name, values in declared.items():       # a declared constant no block shape reads
        node = tables.constants.get(name)
        if name not in found and isinstance(node, cst.Integer):
            found[name] = Tunable(name, int(node.evaluated_value), (node,), tuple(sorted(set(values))), True)
    return Analysis(found, tuple(left))


def _tunable(g: dict, declared: dict[str, list[int]], scope, shaped: bool) -> tuple[Tunable | None, Why | None]:
    name, nodes = g["name"], tuple(g["literals"])
    values = sorted({int(n.evaluated_value) for n in nodes})
    if len(values) != 1:
        return None, Why(name, f"set by literals of different values ({', '.join(map(str, values))}) at "
                               + ", ".join(f"line {{{i}}}" for i in range(min(3, len(nodes)))), nodes[:3])
    value = values[0]
    sizes = tuple(sorted({size for size, _, _ in g["dims"]}))
    if name in declared:
        return Tunable(name, value, nodes, tuple(sorted(set(declared[name]))), True, sizes), None
    if not g["dims"]:
        arrays = ", ".join(dict.fromkeys(f"the {s.where} of {s.key}()" for s in g["unknown"]))
        why = Why(name, f"a block of arrays whose shapes discovery does not know at this task ({arrays})")
        return Tunable(name, value, nodes, (), False, sizes), why if shaped else None
    legal = sorted(set.intersection(*(set(legal_tiles(s, end, dtype)) for s, end, dtype in g["dims"])))
    kept = legal
    for guard in g["guards"]:
        passes = {v: _passes(guard, v, scope) for v in [value, *legal]}
        if any(p is NA for p in passes.values()):
            return None, Why(name, f"recomputed by the {_loop(guard)} at line {{0}}, whose test "
                                   f"`{code(guard.test)}` discovery cannot evaluate at this shape", (guard.node,))
        kept = [v for v in kept if passes[v]]
        if legal and not kept:
            return None, Why(name, f"changed by the {_loop(guard)} at line {{0}} for every value legal at this "
                                   f"shape ({', '.join(map(str, legal))})", (guard.node,))
    if not legal and shaped:
        return None, Why(name, "a block with no value legal on every dimension it tiles ("
                               + ", ".join(f"{s}" for s in sizes) + ")")
    aliases = tuple(dict.fromkeys(f"{old}{value}" for old in g["old"]))
    return Tunable(name, value, nodes, tuple(kept), False, sizes, aliases), None


def _loop(guard: N.Guard) -> str:
    return {"while": "`while` loop", "if": "`if`"}.get(guard.kind, f"`{guard.kind}`")


def _passes(guard: N.Guard, v: int, scope) -> Any:
    """Whether the block value ``v`` stands past ``guard`` at the task's shape (NA: not known). The
    other side of a ``min`` (``max``) that is not known passes it: the value is a cap (floor)."""
    if guard.kind in ("min", "max"):
        other = scope(guard.fn).value(guard.test)
        if not isinstance(other, int):
            return True
        return v <= other if guard.kind == "min" else v >= other
    truth = scope(guard.fn).with_value(guard.var, v).truth(guard.test)
    return NA if truth is NA else truth == guard.want


def _declared(tables: N.Tables) -> dict[str, list[int]]:
    """The module's ``TUNE = {"name": [values], ...}``, if any."""
    tune = tables.constants.get("TUNE")
    out: dict[str, list[int]] = {}
    if isinstance(tune, cst.Dict):
        for el in tune.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) and \
                    isinstance(el.value, (cst.List, cst.Tuple)):
                values = [int(v.value.evaluated_value) for v in el.value.elements if isinstance(v.value, cst.Integer)]
                if values:
                    out[el.key.evaluated_value] = values
    return out


def _task_key(task: Any, entry: str | None) -> tuple:
    entry = entry or getattr(task, "entry", None) or None
    if task is None:
        return entry, (), None, ()
    specs = tuple((tuple(s), d) for s, d in task.input_specs())
    shape = getattr(task, "output_shape", None)
    out = (tuple(shape), task.output_dtype) if shape is not None else None
    names = getattr(task, "input_names", ()) or ()
    return entry, specs, out, tuple(names) if isinstance(names, (tuple, list)) else ()


def discover(module: cst.Module, task: Any, entry: str | None = None) -> dict[str, Tunable]:
    """The tunables of ``module`` for ``task`` (its entry, its inputs' and output's shapes), by
    name, each with at least one legal value. ``entry`` (a function, or a method: ``Model.forward``)
    overrides the task's."""
    entry, specs, out, names = _task_key(task, entry)
    if not entry:
        return {}
    return {n: t for n, t in _analyse(module, entry, specs, out, names).tunables.items()
            if t.legal and not _one_walked(n, t)}


def _one_walked(name: str, tunable: Tunable) -> bool:
    """A block of one written as a literal in a block shape (``pl.BlockSpec((1, bq, d), ...)``, or
    a tuple bound to a name): the grid walks that dimension one by one (its index map takes the
    grid index as the block index), so moving it alone would skip rows; not a tunable unless
    declared (JAX's flash attention's heads)."""
    return tunable.value == 1 and "[" in name and not tunable.declared


def set_values(module: cst.Module, task: Any, values: dict[str, int]) -> cst.Module:
    """Every literal of each named tunable set to its new value."""
    table = discover(module, task)
    return set_literals(module, {id(lit): values[t.name] for t in table.values() if t.name in values
                                 for lit in t.literals})


# ---- what was left out --------------------------------------------------------------------------
def left_out(module: cst.Module, task: Any = None, entry: str | None = None) -> tuple[str, ...]:
    """Each block element discovery did not make a tunable, by its BlockSpec, and why (the elements
    that say the same thing in several BlockSpecs of one function said once)."""
    entry, specs, out, names = _task_key(task, entry)
    left = _analyse(module, entry, specs, out, names).left
    lines = _lines(module, [n for item in left for n in (item.spec.node, *item.why.at)])
    said: dict[tuple[str, str, str], list[Spec]] = {}
    for item in left:
        said.setdefault((item.spec.key, item.element, _phrase(item, lines)), []).append(item.spec)
    messages = []
    for (key, _, phrase), where in said.items():
        where = sorted(where, key=lambda s: lines.get(s.node, 0))
        first, more = where[0], sorted({lines.get(s.node, 0) for s in where[1:]})
        also = f" (and {len(where) - 1} more BlockSpec{'s' if len(where) > 2 else ''} there, " \
               f"line{'s' if len(more) > 1 else ''} {', '.join(map(str, more))})" if len(where) > 1 else ""
        messages.append(f"block of `{first.label()}` in {key}() line {lines.get(first.node, '?')}{also}: {phrase}")
    return tuple(messages)


def _phrase(item: Left, lines: dict) -> str:
    why = item.why
    text = why.why.format(*(lines.get(n, "?") for n in why.at))
    if not item.element:
        return text
    if why.what in ("", item.element):
        return f"`{item.element}` is {text}"
    return f"`{item.element}` is `{why.what}`, {text}"


def _lines(module: cst.Module, nodes: list[cst.CSTNode]) -> dict:
    """node -> its first line, for ``nodes``. Positions cost a pass of libcst's metadata (seconds
    for a production module): only the top-level statements holding ``nodes`` take it, each on
    its own, offset by the lines of the statements before it."""
    wanted, out = {id(n) for n in nodes}, {}
    line = 1 + len(module.header)
    for stmt in module.body:
        if not wanted:
            break
        held = [n for n in walk(stmt) if id(n) in wanted]
        if held:
            alone = cst.Module(body=[stmt], default_indent=module.default_indent,
                               default_newline=module.default_newline)
            positions = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
            for n in held:
                out[n] = line + positions[n].start.line - 1
                wanted.discard(id(n))
        line += module.code_for_node(stmt).count("\n")
    return out


def unfollowed(source: str, task: Any = None, entry: str | None = None) -> tuple[str, ...]:
    """What discovery left out of ``source``'s block shapes, one line each: the BlockSpec (its
    function and line, the element as written) and why it is not a tunable. ``task`` (optional)
    gives the entry and the shapes (with it, also the blocks whose legal values the task's shapes
    rule out); ``entry`` (a function or ``Model.forward``) overrides its entry. ``()`` for a
    source that does not parse."""
    if isinstance(task, str):         # unfollowed(source, "Model.forward")
        task, entry = None, entry or task
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return ()
    return left_out(module, task, entry)


__all__ = ["Hit", "Left", "Tunable", "discover", "left_out", "legal_tiles", "set_values", "sublanes", "unfollowed"]
