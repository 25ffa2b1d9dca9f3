"""Stage 1: a static screen of a candidate's source, before any of it runs.

The screen is a fast first filter with clear messages, not the boundary: the operating system
is (``jail.py``). Anything that slips past it still runs as ``nobody`` in its own namespaces.

The screen parses the source with libcst and refuses, naming the construct and its line:
imports outside an allow-list, calls of dangerous builtins, access to dunder attributes
(the usual ways out of a restricted namespace), assignments to attributes of imported
modules, and ``global``/``nonlocal`` statements. It also checks the kernel interface.
"""

from __future__ import annotations

import dataclasses
import sys

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from evaluator.program.compiler_params import ALLOWED as ALLOWED_COMPILER_PARAMS

# Modules a kernel may import (a module is allowed if it equals one of these or lies below it).
ALLOWED_IMPORTS = (
    "jax.numpy",
    "jax.lax",
    "jax.experimental.pallas",   # includes .tpu and the reference ops under .ops
    "jax.nn",
    "functools",
    "math",
    "numpy",
    "dataclasses",
    "typing",
    "collections.abc",           # abstract types for annotations (megablox.gmm's Callable); no I/O
    "__future__",
)
# Private modules a kernel may still import: dtype queries that JAX's own production kernels use
# (``from jax._src import dtypes`` in ragged paged attention, for ``itemsize_bits``). Nothing else
# below ``jax._src``: the rest is JAX's machinery, not a kernel's.
ALLOWED_PRIVATE = frozenset({"jax._src.dtypes"})
# `import jax` (the top-level package) is allowed as a name; its submodules are checked above.
ALLOWED_TOPLEVEL = {"jax"}
# Names that `from jax import NAME` may bring in besides the allowed submodules.
JAX_TOPLEVEL_NAMES = frozenset({"jit", "vmap", "lax", "numpy", "nn", "ShapeDtypeStruct", "Array",
                                "tree_util", "named_scope", "ensure_compile_time_eval"})


def _allowed(dotted: str) -> bool:
    return any(dotted == a or dotted.startswith(a + ".") for a in ALLOWED_IMPORTS)

FORBIDDEN_CALLS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr",
    "globals", "locals", "vars", "input", "breakpoint", "help", "exit", "quit", "memoryview",
})
FORBIDDEN_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "builtins"})
# Attributes of allowed modules that reach the file system or the OS (numpy's file I/O above all).
FORBIDDEN_ATTRIBUTES = frozenset({
    "save", "savez", "savez_compressed", "savetxt", "tofile", "fromfile", "memmap", "genfromtxt",
    "loadtxt", "ctypeslib", "DataSource", "f2py", "system", "popen", "compilation_cache", "profiler",
    "dump", "dumps", "load", "fromregex", "open_memmap", "environ", "putenv", "modules", "sys", "os",
    "builtins", "subprocess", "importlib", "ctypes", "callback", "pure_callback", "io_callback",
    "platform_dependent",
})
# Modules of the standard library: `from typing import sys` must not smuggle one in.
_STDLIB = frozenset(sys.stdlib_module_names)


@dataclasses.dataclass(frozen=True)
class ScreenResult:
    ok: bool
    error: str = ""


class _Screen(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.imported_modules: set[str] = set()   # local names bound to modules
        self.functions: dict[str, cst.FunctionDef] = {}
        self.depth = 0
        self._not_references: set[int] = set()   # Name nodes that are attribute or keyword names
        self._import_names: set[int] = set()     # Attribute nodes naming a module in an import
        self._scopes: list[str | None] = []      # per enclosing def/class: a method's ``self``, else None

    def _flag(self, node: cst.CSTNode, what: str) -> None:
        line = self.get_metadata(PositionProvider, node).start.line
        self.problems.append(f"line {line}: {what}")

    # -- imports --------------------------------------------------------------------------
    def _check_module(self, node: cst.CSTNode, dotted: str) -> None:
        private = [p for p in dotted.split(".") if p.startswith("_") and p != "__future__"]
        if private:
            if dotted not in ALLOWED_PRIVATE:
                self._flag(node, f"import of private module '{dotted}' is not allowed")
            return
        if dotted in ALLOWED_TOPLEVEL:
            return
        if not _allowed(dotted):
            self._flag(node, f"import of '{dotted}' is not allowed "
                             f"(allowed: jax, {', '.join(ALLOWED_IMPORTS[:-1])})")

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            dotted = cst.helpers.get_full_name_for_node(alias.name) or ""
            self._check_module(node, dotted)
            bound = alias.asname.name.value if alias.asname else dotted.split(".")[0]
            self.imported_modules.add(bound)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        # The module's dotted name is judged here, as an import, not as attribute accesses.
        part = node.module
        while isinstance(part, cst.Attribute):
            self._import_names.add(id(part))
            part = part.value
        if node.relative:
            self._flag(node, "relative imports are not allowed")
            return
        base = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
        if isinstance(node.names, cst.ImportStar):
            self._flag(node, f"'from {base} import *' is not allowed")
            return
        for alias in node.names:
            name = cst.helpers.get_full_name_for_node(alias.name) or ""
            full = f"{base}.{name}"
            if name in _STDLIB and not _allowed(name) and base != "__future__":
                self._flag(node, f"'from {base} import {name}' brings in the module '{name}', "
                                 "which is not allowed")
                continue
            if full in ALLOWED_PRIVATE:
                self.imported_modules.add(alias.asname.name.value if alias.asname else name)
                continue
            if name.startswith("_"):
                self._flag(node, f"import of private name '{full}' is not allowed")
                continue
            if base in ALLOWED_TOPLEVEL:
                # `from jax import numpy` imports a module; `from jax import jit` a function.
                if name not in JAX_TOPLEVEL_NAMES:
                    self._check_module(node, full)
            elif not _allowed(full):
                self._check_module(node, base)
            self.imported_modules.add(alias.asname.name.value if alias.asname else name)

    # -- dangerous names and calls ----------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._not_references:
            return
        if node.value in FORBIDDEN_NAMES:
            self._flag(node, f"use of '{node.value}' is not allowed")
        elif node.value in FORBIDDEN_CALLS:
            # Called or not: `_o = open` is as good as `open(...)`.
            self._flag(node, f"use of the builtin '{node.value}' is not allowed")

    def _own_attribute(self, node: cst.Call) -> bool:
        """``setattr(self, name, value)`` in a method whose first parameter is ``self``: the object
        setting its own attributes (KernelBench's ``set_weights``). Not a module, as far as a
        screen can tell; the jail and the trusted runner stand behind it either way."""
        return (isinstance(node.func, cst.Name) and node.func.value == "setattr" and len(node.args) == 3
                and bool(self._scopes) and self._scopes[-1] == "self"
                and isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == "self")

    def visit_Call(self, node: cst.Call) -> None:
        if self._own_attribute(node):
            self._not_references.add(id(node.func))
        elif isinstance(node.func, cst.Name) and node.func.value in FORBIDDEN_CALLS:
            self._not_references.add(id(node.func))
            self._flag(node, f"call of '{node.func.value}()' is not allowed")
        callee = node.func.attr.value if isinstance(node.func, cst.Attribute) else (
            node.func.value if isinstance(node.func, cst.Name) else "")
        if callee == "CompilerParams":
            self._check_compiler_params(node)

    def _check_compiler_params(self, node: cst.Call) -> None:
        """Only the compiler parameters the judge models (``compiler_params.ALLOWED``): the
        interpreter that checks a kernel ignores them all, the TPU compile obeys them."""
        allowed = ", ".join(ALLOWED_COMPILER_PARAMS)
        for i, arg in enumerate(node.args):
            name = arg.keyword.value if arg.keyword is not None else None
            if arg.star:
                self._flag(node, f"CompilerParams(**...) or (*...) is not allowed: name the parameters ({allowed})")
            elif name is None and i >= len(ALLOWED_COMPILER_PARAMS):
                self._flag(node, f"CompilerParams takes only {allowed} (by name)")
            elif name is not None and name not in ALLOWED_COMPILER_PARAMS:
                self._flag(node, f"compiler parameter '{name}' is not allowed (only {allowed}): the "
                                 "interpreter that checks a kernel ignores it, the TPU compile obeys it")

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_references.add(id(node.keyword))

    def visit_Param(self, node: cst.Param) -> None:
        self._not_references.add(id(node.name))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        for name in (node.name, node.asname.name if node.asname else None):
            if isinstance(name, cst.Name):
                self._not_references.add(id(name))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_references.add(id(node.attr))
        if id(node) in self._import_names:
            return
        attr = node.attr.value
        root = node.value
        while isinstance(root, cst.Attribute):
            root = root.value
        if attr.startswith("__") and attr.endswith("__"):
            self._flag(node, f"access to dunder attribute '.{attr}' is not allowed")
        elif attr in FORBIDDEN_ATTRIBUTES:
            self._flag(node, f"use of '.{attr}' (file system, OS or host access) is not allowed")
        elif (attr.startswith("_") and isinstance(root, cst.Name)
              and root.value in self.imported_modules):
            self._flag(node, f"access to private attribute '.{attr}' of module '{root.value}' "
                             "is not allowed")

    def visit_Global(self, node: cst.Global) -> None:
        self._flag(node, "'global' statements are not allowed")

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self._flag(node, "'nonlocal' statements are not allowed")

    # -- writes to other modules -------------------------------------------------------------
    def _check_target(self, target: cst.BaseExpression) -> None:
        node = target
        while isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        if (isinstance(node, cst.Name) and node.value in self.imported_modules
                and target is not node):
            dotted = cst.helpers.get_full_name_for_node(target) or node.value
            self._flag(target, f"assignment to '{dotted}', an attribute of imported module "
                               f"'{node.value}', is not allowed")

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        targets = node.target.elements if isinstance(node.target, cst.Tuple) else [node.target]
        for t in targets:
            self._check_target(t.value if isinstance(t, cst.Element) else t)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._check_target(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._check_target(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._check_target(node.target)

    # -- interface ---------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self.depth == 0:
            self.functions[node.name.value] = node
        self.depth += 1
        params = node.params.posonly_params + node.params.params
        in_class = bool(self._scopes) and self._scopes[-1] == "class"
        static = any(isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod")
                     for d in node.decorators)
        self._scopes.append("self" if in_class and not static and params and params[0].name.value == "self"
                            else None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1
        self._scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1
        self._scopes.append("class")

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.depth -= 1
        self._scopes.pop()


def _check_interface(functions: dict[str, cst.FunctionDef], entry: str,
                     params: tuple[str, ...], keywords: tuple[str, ...]) -> str:
    fn = functions.get(entry)
    if fn is None:
        return f"the kernel interface is missing: no top-level function '{entry}'"
    positional = [p.name.value for p in fn.params.posonly_params + fn.params.params]
    kwonly = [p.name.value for p in fn.params.kwonly_params]
    if positional[:len(params)] != list(params):
        return (f"'{entry}' must take ({', '.join(params)}) as its first arguments, "
                f"it takes ({', '.join(positional)})")
    has_kwargs = isinstance(fn.params.star_kwarg, cst.Param)
    missing = [k for k in keywords if k not in kwonly + positional and not has_kwargs]
    if missing:
        return f"'{entry}' must accept the keyword argument(s) {', '.join(missing)}"
    return ""


def screen_source(source: str, *, entry: str, params: tuple[str, ...], keywords: tuple[str, ...]) -> ScreenResult:
    """Screen a candidate's source for a task whose entry point ``entry`` takes ``params`` and the
    keyword arguments ``keywords``. Never raises; returns the first problem found."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return ScreenResult(False, f"syntax error: {str(exc).splitlines()[0]} "
                                   f"(line {exc.raw_line}, column {exc.raw_column})")
    except Exception as exc:  # noqa: BLE001 - any parser failure is the candidate's
        return ScreenResult(False, f"cannot parse the source: {exc}")
    visitor = _Screen()
    MetadataWrapper(module).visit(visitor)
    if visitor.problems:
        more = f" (and {len(visitor.problems) - 1} more)" if len(visitor.problems) > 1 else ""
        return ScreenResult(False, visitor.problems[0] + more)
    problem = _check_interface(visitor.functions, entry, params, keywords)
    return ScreenResult(not problem, problem)
