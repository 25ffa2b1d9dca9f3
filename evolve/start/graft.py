"""Graft a kernel into a larger workload: start from a seed's matmul on ``gelu(x @ w + b)``.

A kernel file that sits beside its own reference file (``seeds/matmul/kernel.py`` beside
``seeds/matmul/reference.py``) says what its entry computes: that file's ``workload``. When such a
kernel is brought to another reference file whose workload takes more inputs and holds that
computation inside it, the start becomes the kernel with the other workload appended, that
computation replaced by a call of the kernel's entry::

    # seeds/matmul/reference.py                 # R.py (--reference)
    def workload(a, b):                         def workload(x, w, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
                                                    y = jnp.dot(x, w, preferred_element_type=jnp.float32)
                                                    return jax.nn.gelu(y + b).astype(x.dtype)
    # the start: seeds/matmul/kernel.py, then
    def workload(x, w, b):
        y = matmul(x, w)
        return jax.nn.gelu(y + b).astype(x.dtype)

The computation matches the kernel's workload's one returned expression, its parameters standing
for any of the other workload's parameters or local names, or that expression without its final
``.astype(...)`` (the kernel's output is then in the kernel's dtype where the other workload kept
the core's, and the start says so: the judge's precision rule decides whether that stands, and on
a bf16 matmul under an epilogue it may not on some secret draws; ``fuse_epilogue`` then applies
the epilogue to the kernel's f32 accumulator, rounding once as XLA's program does). The epilogue
left in the appended entry is what ``fuse_epilogue`` moves into the kernel. No graft (one line
saying why) where the kernel's workload is not one expression, nothing in the other workload
matches it, or the other workload uses a name of its own file that is not an import.

A kernel whose workload is a product of its two inputs (``seeds/matmul``) also takes that product
written another way: ``x @ w``, ``jnp.matmul(x, w)``, ``jnp.dot(x, w)`` or ``jnp.einsum("mk,kn->mn",
x, w)`` (each in the inputs' dtype, as the kernel's is), or with a ``preferred_element_type`` (in
the accumulator's: the start then says it is rounded). The judge checks the grafted start against
the other workload as it is written, so a product that differs in more than rounding fails there.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
from pathlib import Path

GRAFT_NAMES = ("workload", "grafted_workload")


@dataclasses.dataclass(frozen=True)
class Graft:
    """A grafted start: the kernel's source with the workload appended, and what was replaced."""

    source: str
    entry: str                # the appended function's name
    replaced: tuple[str, ...]  # each expression of the workload that the kernel's entry now computes
    note: str                 # one line: what was grafted where


def workload_def(source: str) -> ast.FunctionDef | None:
    """The top-level ``workload`` function of a reference file's source, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "workload"), None)


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _returned(fn: ast.FunctionDef) -> ast.expr | None:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value else None


def _patterns(own: ast.FunctionDef) -> list[ast.expr]:
    """What the kernel computes: its workload's returned expression, then that expression without
    a final ``.astype(...)``."""
    returned = _returned(own)
    if returned is None:
        return []
    found = [returned]
    if (isinstance(returned, ast.Call) and isinstance(returned.func, ast.Attribute)
            and returned.func.attr == "astype"):
        found.append(returned.func.value)
    return found


# The calls that multiply two matrices (any module's: jnp.dot, jnp.matmul, lax.dot, np.matmul) and
# the keywords that leave the product what it is (the accumulator's dtype aside).
PRODUCTS = ("dot", "matmul")
PRODUCT_KEYWORDS = ("preferred_element_type", "precision")


def _product(node: ast.AST) -> tuple[ast.expr, ast.expr, bool] | None:
    """``(a, b, accumulates)`` where ``node`` multiplies two matrices in one of the ways a workload
    writes it: ``a @ b``, ``jnp.dot(a, b)``, ``jnp.matmul(a, b)`` (also with ``precision=``), or
    ``jnp.einsum("mk,kn->mn", a, b)``; ``accumulates``: it names a ``preferred_element_type`` (f32,
    the kernel's accumulator), so its result is in that dtype, not the inputs'. None for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right, False
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    args, keywords = node.args, {k.arg for k in node.keywords}
    if node.func.attr == "einsum" and len(args) == 3 and not keywords and isinstance(args[0], ast.Constant):
        ins, _, out = str(args[0].value).replace(" ", "").partition("->")
        sides = ins.split(",")
        if len(sides) != 2 or [len(side) for side in sides] != [2, 2] or len(out) != 2:
            return None
        (i, j), (j2, k) = sides
        return (args[1], args[2], False) if j == j2 and out == i + k and len({i, j, k}) == 3 else None
    if node.func.attr in PRODUCTS and len(args) == 2 and None not in keywords and keywords <= set(PRODUCT_KEYWORDS):
        accumulator = next((k.value for k in node.keywords if k.arg == "preferred_element_type"), None)
        if accumulator is not None and not ast.unparse(accumulator).endswith("float32"):
            return None                  # another accumulator (int32) is another product
        return args[0], args[1], accumulator is not None
    return None


def _product_spans(own: ast.FunctionDef, target: ast.FunctionDef, targets: set[str]
                   ) -> tuple[list[tuple[ast.expr, dict[str, str]]], bool]:
    """Where the kernel's workload is a product of its two parameters (rounded to the first's dtype
    or not): each product of two of ``targets`` in the other workload, however it is written, and
    whether any of them keeps the accumulator's dtype (the kernel then rounds where it did not)."""
    params, patterns = _params(own), _patterns(own)
    mine = _product(patterns[-1]) if patterns else None       # the expression without its final cast
    if len(params) != 2 or mine is None or [getattr(x, "id", None) for x in mine[:2]] != params:
        return [], False
    spans, rounded = [], False
    for node in ast.walk(target):
        found = _product(node)
        if found is None or not all(isinstance(x, ast.Name) and x.id in targets for x in found[:2]):
            continue
        if not any(_inside(node, taken) for taken, _ in spans):
            spans.append((node, {params[0]: found[0].id, params[1]: found[1].id}))
            rounded |= found[2]
    return spans, rounded


def _unify(pattern: ast.AST, node: ast.AST, params: set[str], targets: set[str], bound: dict[str, str]) -> bool:
    """Whether ``node`` is ``pattern`` with each of ``params`` standing for one of ``targets``
    (the same one wherever it appears); ``bound`` collects the binding."""
    if isinstance(pattern, ast.Name) and pattern.id in params:
        return isinstance(node, ast.Name) and node.id in targets and bound.setdefault(pattern.id, node.id) == node.id
    if type(pattern) is not type(node):
        return False
    for field, value in ast.iter_fields(pattern):
        if field == "ctx":
            continue
        other = getattr(node, field, None)
        if isinstance(value, list):
            if not isinstance(other, list) or len(other) != len(value):
                return False
            if not all(_unify(p, n, params, targets, bound) if isinstance(p, ast.AST) else p == n
                       for p, n in zip(value, other)):
                return False
        elif isinstance(value, ast.AST):
            if not isinstance(other, ast.AST) or not _unify(value, other, params, targets, bound):
                return False
        elif value != other:
            return False
    return True


def _module_names(tree: ast.Module) -> dict[str, str]:
    """Each top-level name of a module and how it is bound: an import's source text, else ""."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:        # each name as its own import statement
                one = ast.Import(names=[alias]) if isinstance(node, ast.Import) else \
                    ast.ImportFrom(module=node.module, names=[alias], level=node.level)
                names[(alias.asname or alias.name).partition(".")[0]] = ast.unparse(one)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = ""
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = ""
    return names


def _free_names(fn: ast.FunctionDef) -> set[str]:
    local = set(_params(fn)) | {a.arg for a in fn.args.kwonlyargs}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - local - set(dir(builtins))


def graft(kernel_source: str, kernel_entry: str, own_reference: str, reference: str,
          reference_name: str = "the reference file") -> Graft | str:
    """``kernel_source`` (whose ``kernel_entry`` computes ``own_reference``'s workload) grafted into
    ``reference``'s workload; else one line saying why not."""
    own, target = workload_def(own_reference), workload_def(reference)
    if own is None or target is None:
        return "a reference file without a workload function"
    patterns = _patterns(own)
    if not patterns:
        return "the kernel's own workload is not one returned expression"
    params = _params(own)
    targets = set(_params(target)) | {n.id for n in ast.walk(target) if isinstance(n, ast.Name)
                                      and isinstance(n.ctx, ast.Store)}
    spans: list[tuple[ast.expr, dict[str, str]]] = []
    for pattern in patterns:            # the whole expression first, then without its cast
        for node in ast.walk(target):
            bound: dict[str, str] = {}
            if (isinstance(node, ast.expr) and _unify(pattern, node, set(params), targets, bound)
                    and len(bound) == len(params)
                    and not any(_inside(node, taken) for taken, _ in spans)):
                spans.append((node, bound))
        if spans:
            break
    rounded = pattern is not patterns[0]         # matched without the kernel's final cast
    if not spans:                                # the same product written another way (x @ w)
        spans, rounded = _product_spans(own, target, targets)
    if not spans:
        return (f"nothing in {reference_name}'s workload computes what the kernel's entry does "
                f"({ast.unparse(patterns[-1])}, or a product of two matrices written otherwise)")
    kernel = ast.parse(kernel_source)
    have, theirs = _module_names(kernel), _module_names(ast.parse(reference))
    imports = []
    for name in sorted(_free_names(target)):
        bound_there = theirs.get(name)
        if bound_there is None:
            return f"{reference_name}'s workload uses {name!r}, which its file does not define"
        if bound_there == "":
            return f"{reference_name}'s workload uses {name!r} of its own file (not an import); inline it"
        if name in have and have[name] != bound_there:
            return f"{reference_name}'s workload's {name!r} ({bound_there}) is another thing in the kernel"
        if name not in have:
            imports.append(bound_there)
    name = next((n for n in GRAFT_NAMES if n not in have), None)
    if name is None:
        return "the kernel already defines " + " and ".join(GRAFT_NAMES)
    lines = [line.encode() for line in reference.splitlines(keepends=True)[target.lineno - 1:target.end_lineno]]

    def at(line: int, col: int) -> int:     # a node's (line, utf-8 column) in the function's bytes
        return sum(len(x) for x in lines[:line - target.lineno]) + col

    raw, replaced = b"".join(lines), []
    for node, bound in sorted(spans, key=lambda s: (s[0].lineno, s[0].col_offset), reverse=True):
        start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
        replaced.append(raw[start:end].decode())
        raw = raw[:start] + f"{kernel_entry}({', '.join(bound[p] for p in params)})".encode() + raw[end:]
    body = raw.decode().rstrip("\n")
    body = body.replace(f"def {target.name}(", f"def {name}(", 1)
    note = (f"grafted into {reference_name}'s workload: {' ; '.join(reversed(replaced))} -> "
            f"{kernel_entry}(...)" + (", rounded to the kernel's output dtype" if rounded else ""))
    source = kernel_source.rstrip("\n") + "\n" + "".join(f"{i}\n" for i in imports) + f"\n\n# {note}\n{body}\n"
    return Graft(source=source, entry=name, replaced=tuple(reversed(replaced)), note=note)


def _inside(node: ast.expr, outer: ast.expr) -> bool:
    return (outer.lineno, outer.col_offset) <= (node.lineno, node.col_offset) and \
        (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


def own_reference(kernel_path: str | Path) -> Path | None:
    """The reference file beside a kernel file (its directory's ``reference.py``), if any."""
    path = Path(kernel_path).parent / "reference.py"
    return path if path.is_file() else None


def graft_file(kernel_source: str, kernel_path: str | Path, reference_path: str | Path) -> Graft | str | None:
    """The graft of the kernel at ``kernel_path`` into the workload of ``reference_path``: None
    where none is wanted (the kernel has an entry taking the workload's inputs, or no reference file
    of its own beside it, or it is that file's kernel), else the Graft or one line saying why not."""
    from seeds import ReferenceError, kernel_entry

    own = own_reference(kernel_path)
    reference_path = Path(reference_path)
    if own is None or own.resolve() == reference_path.resolve():
        return None
    reference, own_source = reference_path.read_text(), own.read_text()
    target, mine = workload_def(reference), workload_def(own_source)
    if target is None or mine is None:
        return None
    try:
        kernel_entry(kernel_source, len(_params(target)))
        return None                    # it takes the workload's inputs itself
    except ReferenceError:
        pass
    try:
        entry = kernel_entry(kernel_source, len(_params(mine)))
    except ReferenceError as exc:
        return str(exc)
    shown = f"{reference_path.parent.name}/{reference_path.name}" if reference_path.name == "reference.py" \
        else reference_path.name
    return graft(kernel_source, entry, own_source, reference, shown)
