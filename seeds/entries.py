"""A kernel file's entry: the function (or ``Model.forward``) of it that the judge calls with a
task's inputs, found by reading its text (seeds/reference.py's tasks; ``evolve/start/graft.py``)."""

from __future__ import annotations

import ast

from seeds import kernelbench
from seeds._contract import SeedError


class ReferenceError(SeedError):
    """A reference file that cannot be a task; the message is one line."""


_WRAPPERS = ("partial", "jit")   # functools.partial(f, ...), jax.jit(f, ...): a public name bound to f


def _entries(tree: ast.Module) -> dict[str, tuple[ast.FunctionDef, int, set[str]]]:
    """Every top-level name a caller can invoke: each function (none of its parameters bound), and
    each name assigned ``functools.partial(f, *args, **kw)`` or ``jax.jit(f, ...)`` of a function
    ``f`` of the file (``f``, how many leading positional parameters the partial binds, and the
    names its keywords bind)."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    entries = {name: (fn, 0, set()) for name, fn in functions.items()}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args):
            continue
        call, target = node.value, node.value.args[0]
        wrapper = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if wrapper not in _WRAPPERS or not isinstance(target, ast.Name) or target.id not in functions:
            continue
        bound = len(call.args) - 1 if wrapper == "partial" else 0
        keywords = {k.arg for k in call.keywords if k.arg} if wrapper == "partial" else set()
        for name in node.targets:
            if isinstance(name, ast.Name):
                entries[name.id] = (functions[target.id], bound, keywords)
    return entries


def _positional(fn: ast.FunctionDef, bound: int, keywords: set[str]) -> tuple[list[str], int]:
    """The positional parameters a caller still passes (after ``bound`` leading ones and the
    keyword-bound ones), and how many of them are required."""
    params = fn.args.posonlyargs + fn.args.args
    defaulted = {a.arg for a in params[len(params) - len(fn.args.defaults):]}
    free = [a.arg for a in params[bound:] if a.arg not in keywords]
    return free, sum(1 for a in free if a not in defaulted)


def kernel_entry(kernel_source: str, arity: int, given: str | None = None, prefer: str | None = None,
                 model: bool = False) -> str:
    """The kernel file's entry for a workload of ``arity`` inputs: ``given`` if the file defines
    it, else its one public top-level name that reaches ``pallas_call`` (itself or through the
    file's other functions) and takes ``arity`` positional inputs, or of several the one named
    ``prefer`` (the seed's own entry: megablox's ``gmm`` beside ``tgmm``); ReferenceError when
    there is none or several: name it with --entry. A public name bound to
    ``functools.partial(f, ...)`` or ``jax.jit(f, ...)`` of a private ``f`` counts as ``f`` with
    what the partial binds taken away. For a task in KernelBench's convention (``model``), a
    ``ModelNew`` or ``Model`` whose ``forward`` reaches ``pallas_call`` comes first
    (``"Model.forward"``: seeds/kernelbench.py)."""
    try:
        tree = ast.parse(kernel_source)
    except SyntaxError as exc:
        raise ReferenceError(f"the kernel is not Python: {exc.msg} (line {exc.lineno}); fix it and run again") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
    if given and "." in given:
        if model and kernelbench.kernel_model(tree, set(), given):
            return given
        raise ReferenceError(f"the kernel defines no {given!r} (--entry); a method entry is the forward of a "
                             f"class Model or ModelNew, for a task in KernelBench's convention (Model, get_inputs)")
    if given:
        if given not in functions and given not in assigned:
            raise ReferenceError(f"the kernel defines no {given!r} (--entry); name one of its functions: "
                                 f"{', '.join(sorted(functions)) or '(none)'}")
        return given

    reaches = {name for name, fn in functions.items() if "pallas_call" in kernelbench.referred(fn)}
    while True:      # and every function that calls one of those (a wrapper around the wrapper)
        more = {name for name, fn in functions.items() if name not in reaches and kernelbench.referred(fn) & reaches}
        if not more:
            break
        reaches |= more
    if model and not given:
        found_model = kernelbench.kernel_model(tree, reaches)
        if found_model is not None:
            return found_model
    found = []
    for name, (fn, bound, keywords) in _entries(tree).items():
        free, required = _positional(fn, bound, keywords)
        if not name.startswith("_") and fn.name in reaches and required <= arity <= len(free):
            found.append(name)
    if len(found) > 1 and prefer in found:
        return prefer
    if len(found) != 1:
        why = "no public function" if not found else f"{len(found)} functions ({', '.join(found)})"
        hint = " (nor a class Model or ModelNew whose forward calls it)" if model else ""
        raise ReferenceError(f"the kernel has {why} that calls pallas_call and takes the workload's {arity} "
                             f"inputs{hint}; name its entry with --entry NAME")
    return found[0]


def entry_names(kernel_source: str, entry: str, arity: int) -> tuple[str, ...]:
    """The first ``arity`` positional parameters a caller passes to the kernel's ``entry`` (a
    function, or a partial of one; () if not such a callable of that many)."""
    try:
        tree = ast.parse(kernel_source)
    except SyntaxError:
        return ()
    found = _entries(tree).get(entry)
    names = _positional(*found)[0] if found is not None else []
    return tuple(names[:arity]) if len(names) >= arity else ()
