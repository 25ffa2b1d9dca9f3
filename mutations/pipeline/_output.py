"""Where a kernel's output goes: the ``pl.pallas_call`` a fusing rewrite moves work into, and the
code that takes its output (shared by ``fuse_epilogue`` and ``fuse_reduction``).

The styles people write, each found from the task's entry:

* **inline**: the function calling ``pl.pallas_call(...)(...)`` does more with the output than
  return it: ``y = pl.pallas_call(...)(x, w)`` then ``return jax.nn.gelu(y + b)``, or the call in
  place (``return jnp.mean(pl.pallas_call(...)(p, t))``);
* **a wrapper's caller**: the function calling ``pl.pallas_call`` (the wrapper) returns the output as
  it is, and its one caller (the entry, or a function the entry reaches) does the work;
* **a method** (KernelBench's ``Model.forward``): either of these in a class's method, the arrays it
  reads held by ``self`` (``self.bias``): each such attribute is a value like a parameter.

The kernel is a module-level function (or a ``functools.partial`` of one) or a function defined in
the wrapper's body; it names its inputs, then its output ref, positionally.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import libcst as cst

from .. import _cst as C
from .. import _sites
from .._errors import NotApplicable
from .._walk import replace, walk

OUT = "_o"                   # the name the moved code gives the kernel's output
LIKE = frozenset({"jax.numpy.zeros_like", "jax.numpy.ones_like", "jax.numpy.full_like", "jax.numpy.empty_like"})


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
    """A kernel's pallas_call and where its output is used."""

    module: cst.Module
    site: cst.FunctionDef          # the function calling pl.pallas_call (the wrapper)
    site_name: str                 # its name ("Class.method" for a method)
    pallas: cst.Call               # pl.pallas_call(...)
    outer: cst.Call                # pl.pallas_call(...)(...)
    kernel: cst.FunctionDef
    nested: bool                   # the kernel is defined in the site's body
    n_in: int                      # the kernel's inputs: its output ref is parameter n_in
    o_ref: str
    user: cst.FunctionDef          # the function using the output: the site itself, or its caller
    user_name: str
    call: cst.Call                 # in ``user``: the call giving the output (``outer``, or the wrapper's)
    at: int                        # the index in user's body of the statement holding ``call``

    @property
    def inline(self) -> bool:
        return self.user is self.site

    @property
    def self_name(self) -> str | None:
        """The user's ``self`` when it is a method (its first parameter), else None."""
        params = self.user.params.params
        return params[0].name.value if "." in self.user_name and params else None

    def kwarg(self, name: str) -> cst.BaseExpression | None:
        return C.call_kwarg(self.pallas, name)

    def tail(self) -> list[cst.BaseStatement]:
        """The user's statements from the one holding the output's call on, the call as ``_o``."""
        body = list(self.user.body.body)[self.at:]
        body[0] = C.replace_node(body[0], self.call, cst.Name(OUT))  # type: ignore[assignment]
        return body


def find(module: cst.Module, task: Any, what: str) -> Site:
    """The site reachable from ``task``'s entry and where its output is used; NotApplicable saying
    why not (``what``: the work the operator moves, for the messages)."""
    entry = getattr(task, "entry", None) or None
    site_name, site = _site(module, entry)
    pallas, outer = _outer(site, site_name)
    kernel, nested = _kernel(module, site, pallas)
    n_in = _inputs(outer, pallas)
    params = kernel.params
    if isinstance(params.star_arg, cst.Param) or len(params.params) <= n_in:
        raise NotApplicable(f"the kernel {kernel.name.value}() does not name its output ref as parameter {n_in}")
    o_ref = params.params[n_in].name.value
    at = _statement(site, outer)
    common = dict(module=module, site=site, site_name=site_name, pallas=pallas, outer=outer, kernel=kernel,
                  nested=nested, n_in=n_in, o_ref=o_ref)
    if not _returns_as_is(site, at, outer):
        return Site(**common, user=site, user_name=site_name, call=outer, at=at)  # type: ignore[arg-type]
    if entry is not None and site_name == entry:
        raise NotApplicable(f"no {what} to move: the entry {site_name}() is the kernel's wrapper and returns the "
                            "pallas_call's output as it is (nothing follows the kernel in it)")
    if "." in site_name:
        raise NotApplicable(f"the kernel's wrapper {site_name}() is a method that returns the pallas_call's "
                            "output as it is: its callers are not followed")
    uses = sum(1 for n in walk(module) if isinstance(n, cst.Name) and n.value == site_name)
    calls = [(name, fn, call) for name, fn in _sites.definitions(module).items() if isinstance(fn, cst.FunctionDef)
             for call in C.find_all(fn.body, lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
                                    and n.func.value == site_name)]
    if len(calls) != 1 or uses != 2:          # its def and the one call
        raise NotApplicable(f"{site_name}() must be called exactly once, from the entry or a function it reaches "
                            f"(it is named {uses - 1} times): fusing changes what it returns")
    user_name, user, call = calls[0]
    if entry is None or user is site:
        raise NotApplicable(f"the {what} must follow the kernel's wrapper {site_name}() in the entry; the entry is "
                            f"{entry or 'not named'}")
    if user_name not in _sites.reachable(module, entry):
        raise NotApplicable(f"{user_name}() calls the kernel's wrapper {site_name}(), but the entry {entry} does "
                            "not reach it")
    return Site(**common, user=user, user_name=user_name, call=call, at=_statement(user, call))  # type: ignore[arg-type]


def _site(module: cst.Module, entry: str | None) -> tuple[str, cst.FunctionDef]:
    """The function calling pl.pallas_call: the site the scope resolves, else a method entry that
    calls it itself (``Model.forward``)."""
    defs = _sites.definitions(module)
    try:
        fn = C.wrapper(module)
    except NotApplicable:
        method = defs.get(entry or "")
        if entry and "." in entry and isinstance(method, cst.FunctionDef) and _sites.calls_pallas(method):
            return entry, method
        raise
    return next((name for name, d in defs.items() if d is fn), fn.name.value), fn


def _outer(site: cst.FunctionDef, name: str) -> tuple[cst.Call, cst.Call]:
    calls = C.find_all(site, lambda n: C.is_call(n, "pl.pallas_call"))
    if len(calls) != 1:
        raise NotApplicable(f"expected one pl.pallas_call in {name}(), found {len(calls)}")
    pallas = calls[0]
    outers = C.find_all(site, lambda n: isinstance(n, cst.Call) and n.func is pallas)
    if len(outers) != 1:
        raise NotApplicable(f"{name}() does not call pl.pallas_call(...) where it makes it (pl.pallas_call(...)(...))")
    for bad in ("grid_spec", "input_output_aliases"):
        if C.call_kwarg(pallas, bad) is not None:  # type: ignore[arg-type]
            raise NotApplicable(f"pallas_call takes {bad}=: not handled")
    for kw in ("out_specs", "out_shape"):
        value = C.call_kwarg(pallas, kw)  # type: ignore[arg-type]
        if value is None or isinstance(value, (cst.List, cst.Tuple, cst.Dict)):
            raise NotApplicable(f"pallas_call's {kw} is missing or not a single output's")
    if C.call_kwarg(pallas, "in_specs") is None:  # type: ignore[arg-type]
        raise NotApplicable("pallas_call has no in_specs")
    return pallas, outers[0]  # type: ignore[return-value]


def _kernel(module: cst.Module, site: cst.FunctionDef, pallas: cst.Call) -> tuple[cst.FunctionDef, bool]:
    first = pallas.args[0].value if pallas.args and pallas.args[0].keyword is None else None
    if isinstance(first, cst.Call) and C.is_call(first, "functools.partial") and first.args:
        first = first.args[0].value
    if isinstance(first, cst.Name):
        nested = next((s for s in site.body.body if isinstance(s, cst.FunctionDef) and s.name.value == first.value),
                      None)
        if nested is not None:
            return nested, True
        fn = C.module_function(module, first.value)
        if fn is not None:
            if sum(1 for n in walk(module) if isinstance(n, cst.Name) and n.value == first.value) != 2:
                raise NotApplicable(f"the kernel {first.value}() is named elsewhere too: its signature cannot change")
            return fn, False
    raise NotApplicable("pallas_call's kernel is not a module-level function (or a functools.partial of one), "
                        "nor one defined in its wrapper")


def _inputs(outer: cst.Call, pallas: cst.Call) -> int:
    if any(a.star or a.keyword is not None for a in outer.args):
        raise NotApplicable("the kernel's operands are passed with * or by keyword")
    return len(outer.args)


def _statement(fn: cst.FunctionDef, node: cst.CSTNode) -> int:
    body = list(fn.body.body)
    at = next((i for i, s in enumerate(body) if C.find_all(s, lambda n: n is node)), None)
    if at is None or not isinstance(body[at], cst.SimpleStatementLine):
        raise NotApplicable(f"the kernel's output is taken inside a compound statement of {fn.name.value}()")
    return at


def _returns_as_is(fn: cst.FunctionDef, at: int, outer: cst.Call) -> bool:
    """``return pl.pallas_call(...)(...)``, or ``y = ...`` then ``return y``."""
    tail = list(fn.body.body)[at:]
    small = [s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None for s in tail]
    if len(tail) == 1:
        return isinstance(small[0], cst.Return) and small[0].value is outer
    if len(tail) == 2 and isinstance(small[0], cst.Assign) and small[0].value is outer and len(small[0].targets) == 1:
        target = small[0].targets[0].target
        return (isinstance(target, cst.Name) and isinstance(small[1], cst.Return)
                and isinstance(small[1].value, cst.Name) and small[1].value.value == target.value)
    return False


# ---- the kernel's output ref ------------------------------------------------------------------------
def is_whole(target: cst.BaseExpression, ref: str) -> bool:
    """``ref[...]``, ``ref[:]`` or ``ref[:, :]``: the whole block."""
    if not (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value == ref):
        return False
    parts = [e.slice for e in target.slice]
    return all((isinstance(p, cst.Index) and isinstance(p.value, cst.Ellipsis))
               or (isinstance(p, cst.Slice) and p.lower is None and p.upper is None and p.step is None) for p in parts)


def output_mode(kernel: cst.FunctionDef, o_ref: str, names: dict[str, str]) -> str:
    """How the kernel uses its output block: ``"store"`` (only ever stored whole) or
    ``"accumulate"`` (read and stored whole: a sum over grid steps). NotApplicable otherwise."""
    stores: set[int] = set()
    reads: set[int] = set()
    static: set[int] = set()
    for n in walk(kernel.body):
        if isinstance(n, cst.Assign):
            stores.update(id(t.target.value) for t in n.targets if is_whole(t.target, o_ref))  # type: ignore[attr-defined]
        elif isinstance(n, cst.AugAssign) and is_whole(n.target, o_ref):
            reads.add(id(n.target.value))  # type: ignore[attr-defined]
        elif isinstance(n, cst.Subscript) and is_whole(n, o_ref):
            reads.add(id(n.value))
        elif isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == o_ref \
                and n.attr.value in ("dtype", "shape"):
            static.add(id(n.value))
        elif isinstance(n, cst.Call) and dotted(n.func, names) in LIKE and n.args \
                and isinstance(n.args[0].value, cst.Name) and n.args[0].value.value == o_ref:
            static.add(id(n.args[0].value))
    reads -= stores
    uses = [n for n in walk(kernel.body) if isinstance(n, cst.Name) and n.value == o_ref]
    if any(id(n) not in stores | reads | static for n in uses):
        raise NotApplicable(f"the kernel reads, slices or hands on its output block {o_ref}: the work could only "
                            "follow a whole-block store")
    if not stores:
        raise NotApplicable(f"the kernel never stores its output block {o_ref}[...] whole")
    return "accumulate" if reads else "store"


def accumulation_axis(s: Site) -> int:
    """The grid axis a kernel that accumulates into its output block sums over: the one whose first
    step (``@pl.when(pl.program_id(k) == 0)``) stores the block whole; the output's block must not
    follow it."""
    ids = {name: axis for axis, name in C.program_id_names(s.kernel).items()}
    found = None
    for fn in walk(s.kernel.body):
        if not isinstance(fn, cst.FunctionDef):
            continue
        stores = any(isinstance(n, cst.Assign) and any(is_whole(t.target, s.o_ref) for t in n.targets)
                     for n in walk(fn.body))
        for dec in fn.decorators:
            d = dec.decorator
            if stores and C.is_call(d, "pl.when") and d.args:  # type: ignore[attr-defined]
                found = _first_step(d.args[0].value, ids)  # type: ignore[attr-defined]
                if found is not None:
                    break
        if found is not None:
            break
    if found is None:
        raise NotApplicable(f"the kernel accumulates into its output block {s.o_ref}, and no "
                            "@pl.when(pl.program_id(k) == 0) starts the sum: where it ends is not known")
    spec = s.kwarg("out_specs")
    if isinstance(spec, cst.Call) and len(spec.args) >= 2 and isinstance(spec.args[1].value, cst.Lambda):
        lam = spec.args[1].value
        ps = lam.params.params
        if found < len(ps) and ps[found].name.value in C.names_in(lam.body):
            raise NotApplicable(f"the output's block follows grid axis {found}, which the kernel accumulates over")
    return found


def _first_step(cond: cst.BaseExpression, ids: dict[str, int]) -> int | None:
    """k for ``pl.program_id(k) == 0`` (or a name bound to pl.program_id(k)), else None."""
    if not (isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1
            and isinstance(cond.comparisons[0].operator, cst.Equal)):
        return None
    left, right = cond.left, cond.comparisons[0].comparator
    if isinstance(left, cst.Integer):
        left, right = right, left
    if not (isinstance(right, cst.Integer) and right.evaluated_value == 0):
        return None
    if isinstance(left, cst.Name):
        return ids.get(left.value)
    if C.is_call(left, "pl.program_id") and left.args and isinstance(left.args[0].value, cst.Integer):  # type: ignore[attr-defined]
        return left.args[0].value.evaluated_value  # type: ignore[attr-defined]
    return None


# ---- names ------------------------------------------------------------------------------------------
def aliases(module: cst.Module) -> dict[str, str]:
    """Module-level import aliases: ``jnp`` -> ``jax.numpy``, ``lax`` -> ``jax.lax``."""
    out: dict[str, str] = {}
    for stmt in module.body:
        for node in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(node, cst.Import):
                for a in node.names:
                    full = C.code(a.name)
                    out[a.asname.name.value if a.asname else full.split(".")[0]] = (  # type: ignore[union-attr]
                        full if a.asname else full.split(".")[0])
            elif isinstance(node, cst.ImportFrom) and node.module is not None and not isinstance(
                    node.names, cst.ImportStar):
                for a in node.names:
                    name = C.code(a.name)
                    out[a.asname.name.value if a.asname else name] = f"{C.code(node.module)}.{name}"  # type: ignore[union-attr]
    return out


def dotted(node: cst.BaseExpression, names: dict[str, str]) -> str | None:
    """``jnp.mean`` -> ``jax.numpy.mean`` (through the module's aliases ``names``)."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    head = names.get(node.value, node.value)
    return ".".join([head, *reversed(parts)])


def module_names(module: cst.Module) -> set[str]:
    names = set(aliases(module))
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif (pair := C.assigned_name(stmt)) is not None:
            names.add(pair[0])
    return names


def fresh(name: str, taken: set[str]) -> str:
    """``name``, with underscores appended until it is not in ``taken`` (then added to it)."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


# ---- putting the rewritten functions back -----------------------------------------------------------
def rebuild(s: Site, kernel: cst.FunctionDef, site: cst.FunctionDef, user: cst.FunctionDef | None,
            helpers: str) -> cst.Module:
    """The module with the kernel, the site and (caller style) the user rewritten, ``helpers`` (module-
    level code) before the site's definition, and ``functools`` and ``jax`` imported."""
    if s.nested:
        site = site.with_changes(body=site.body.with_changes(
            body=[kernel if st is s.kernel else st for st in site.body.body]))
    new = {id(s.site): site}
    if not s.nested:
        new[id(s.kernel)] = kernel
    if user is not None and not s.inline:
        new[id(s.user)] = user
    at = C.definition_statement(s.module, s.site)
    module = replace(s.module, new)
    added = C.stmts(helpers)
    added[0] = added[0].with_changes(leading_lines=[cst.EmptyLine()] * 2)  # type: ignore[call-arg]
    body = list(module.body)
    at = len(body) if at is None else at
    body[at:at] = added
    module = module.with_changes(body=body)
    names = aliases(module)
    if "functools" not in names:
        at = next((i for i, st in enumerate(module.body) if isinstance(st, cst.SimpleStatementLine)
                   and isinstance(st.body[0], (cst.Import, cst.ImportFrom))
                   and C.code(st).strip() != "from __future__ import annotations"), 0)
        module = module.with_changes(body=[*module.body[:at], *C.stmts("import functools\n"), *module.body[at:]])
    if names.get("jax") != "jax":
        module = C.with_import(module, "import jax")
    return module


def with_comma(elements: list, last: Any) -> list:
    """``elements`` (call args or list elements) with ``last`` appended after a ``", "``."""
    if not elements:
        return [last]
    return [*elements[:-1], elements[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            last]
