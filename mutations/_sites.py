"""Sites: the ``pl.pallas_call`` an operator rewrites, found from the task's entry point.

A production module holds more than the kernel a task runs. JAX's flash attention has a forward
kernel and two backward kernels, each called from its own module-level function, tied together by
``jax.custom_vjp``. An operator rewrites one *site*: a module-level function calling
``pl.pallas_call`` (its *wrapper*, the site's name), the kernel function it hands to
``functools.partial`` and the functions that kernel calls. Only sites *reachable* from the task's
entry point on the forward path count: calls (and references) are followed from the entry, through
a ``custom_vjp``'s primal and the ``fwd`` of its ``defvjp``, never its ``bwd``.

Which site the helpers of :mod:`mutations._cst` look at is a scope (a context variable) that the
operator base class sets around every check, draw and rewrite from the task's entry point and the
edit's ``site`` parameter. A module with a single function calling ``pl.pallas_call`` (every seed)
has that one site, whatever the entry: such modules behave exactly as before sites existed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import libcst as cst

from ._errors import NotApplicable
from ._walk import walk

# (entry point, site name): None for "the task's entry is unknown" / "the one reachable site".
_SCOPE: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "mutation_site", default=(None, None))

SITE_PARAM = "site"     # the Edit parameter naming the site (only when the module has several)


@contextlib.contextmanager
def scope(task: Any, site: str | None = None) -> Iterator[None]:
    """Within the block, the site helpers resolve ``site`` (or the one site reachable from
    ``task.entry``)."""
    token = _SCOPE.set((getattr(task, "entry", None) or None, site))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current() -> tuple[str | None, str | None]:
    return _SCOPE.get()


# ---- the module's call graph ----------------------------------------------------------------
def _names(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name):   # Class.method
            found.add(f"{n.value.value}.{n.attr.value}")
    return found


def _is_pallas_call(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name) and node.func.value.value == "pl"
            and node.func.attr.value == "pallas_call")


@functools.lru_cache(maxsize=4096)   # trees are immutable; nodes hash by identity
def calls_pallas(fn: cst.CSTNode) -> bool:
    """Whether ``fn`` calls ``pl.pallas_call``. Memoised: every check and draw asks it of every
    module-level function of its tree (``several``), and a production module has ~1000 lines."""
    return any(_is_pallas_call(n) for n in walk(fn))


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def definitions(module: cst.Module) -> dict[str, cst.FunctionDef | cst.ClassDef]:
    """Module-level functions by name, module-level classes by name, their methods as
    ``Class.method``."""
    out: dict[str, cst.FunctionDef | cst.ClassDef] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            out[stmt.name.value] = stmt
        elif isinstance(stmt, cst.ClassDef):
            out[stmt.name.value] = stmt
            for item in stmt.body.body:
                if isinstance(item, cst.FunctionDef):
                    out[f"{stmt.name.value}.{item.name.value}"] = item
    return out


def _defvjp_forward(module: cst.Module) -> dict[str, set[str]]:
    """``f.defvjp(fwd, bwd)`` at module level: f -> {fwd} (the bwd is not the forward path)."""
    out: dict[str, set[str]] = {}
    for stmt in module.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr)):
            continue
        call = stmt.body[0].value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "defvjp" and isinstance(call.func.value, cst.Name)):
            continue
        fwd = [a.value for a in call.args if a.keyword is not None and a.keyword.value == "fwd"]
        fwd = fwd or [a.value for a in call.args[:1] if a.keyword is None]
        out.setdefault(call.func.value.value, set()).update(
            f.value for f in fwd if isinstance(f, cst.Name))
    return out


@functools.lru_cache(maxsize=256)
def reachable(module: cst.Module, entry: str) -> tuple[str, ...]:
    """The definitions reachable from ``entry`` (itself included), in the module's order: through
    the names each function's body refers to (a method's ``self.<name>``: its class's), a
    ``custom_vjp``'s ``defvjp`` fwd, and from a class to its methods when the class itself is
    referred to."""
    defs = definitions(module)
    vjp = _defvjp_forward(module)
    seen: set[str] = set()
    todo = [entry] if entry in defs else []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = defs[name]
        refs = _names(node.body) | vjp.get(name, set())
        if "." in name:         # a method: ``self.helper(...)`` is its class's ``helper``
            owner = name.split(".")[0]
            refs |= {f"{owner}.{r[5:]}" for r in refs if r.startswith("self.")}
        if isinstance(node, cst.ClassDef):
            refs |= {n for n in defs if n.startswith(name + ".")}
        todo.extend(r for r in refs if r in defs and r not in seen)
    return tuple(n for n in defs if n in seen)


# ---- sites ----------------------------------------------------------------------------------
def pallas_functions(module: cst.Module) -> list[cst.FunctionDef]:
    """Every module-level function calling ``pl.pallas_call``, in the module's order."""
    return [s for s in module.body if isinstance(s, cst.FunctionDef) and calls_pallas(s)]


def several(module: cst.Module) -> bool:
    """Whether the module has more than one function calling ``pl.pallas_call`` (its edits then
    name their site)."""
    return len(pallas_functions(module)) > 1


@functools.lru_cache(maxsize=256)
def sites(module: cst.Module, entry: str | None) -> tuple[str, ...]:
    """The names of the sites an operator may rewrite: the one function calling ``pl.pallas_call``
    if there is one, else those reachable from ``entry`` on the forward path."""
    found = pallas_functions(module)
    if len(found) <= 1 or entry is None:
        return tuple(f.name.value for f in found)
    on_path = set(reachable(module, entry))
    return tuple(f.name.value for f in found if f.name.value in on_path)


@functools.lru_cache(maxsize=256)
def _resolve(module: cst.Module, entry: str | None, site: str | None) -> cst.FunctionDef:
    names = sites(module, entry)
    if site is not None:
        if site not in names:
            raise NotApplicable(f"no site {site!r} reachable from {entry or 'the entry point'}; "
                                f"sites: {', '.join(names) or 'none'}")
        names = (site,)
    if len(names) != 1:
        where = f" reachable from {entry}" if entry and several(module) else ""
        raise NotApplicable(f"expected one module-level function calling pl.pallas_call{where}, "
                            f"found {len(names)}" + (f" ({', '.join(names)})" if names else ""))
    fn = definitions(module)[names[0]]
    assert isinstance(fn, cst.FunctionDef)
    return fn


def wrapper(module: cst.Module) -> cst.FunctionDef:
    """The site's wrapper (the function calling ``pl.pallas_call``) in the current scope."""
    entry, site = current()
    return _resolve(module, entry, site)


def site_functions(module: cst.Module, kernel: str) -> tuple[str, ...]:
    """The module-level functions a site's kernel runs: ``kernel`` and the functions it refers
    to, in the module's order (helpers shared with other sites included)."""
    return tuple(n for n in reachable(module, kernel)
                 if isinstance(definitions(module)[n], cst.FunctionDef) and "." not in n)
