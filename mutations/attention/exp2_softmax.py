"""exp2 softmax: fold log2(e) into the logit scale and use exp2 (one VPU multiply less per logit)."""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite

LOG2_E = "1.4426950408889634"


def _is_scale(node: cst.CSTNode) -> bool:
    """``X = X * sm_scale`` (the logit scaling)."""
    pair = C.assigned_name(node)
    if pair is None or not isinstance(pair[1], cst.BinaryOperation):
        return False
    value = pair[1]
    return (isinstance(value.operator, cst.Multiply) and C.norm(value.right) == "sm_scale"
            and C.norm(value.left) == pair[0])


class Exp2Softmax(Rewrite):
    name = "exp2_softmax"
    description = ("Scale logits by sm_scale * log2(e) and use jnp.exp2 for every exponential of the "
                   "online softmax (same result, one multiply less per logit).")

    def _regions(self, fn: cst.FunctionDef) -> cst.Module:
        return cst.Module(body=C.compute_statements(fn))

    def _check(self, module, task) -> Applicability:
        if self._seed_idiom(module) or not self._production(module):
            return self._check_seed(module)
        return APPLICABLE

    def _seed_idiom(self, module) -> bool:
        """Whether the kernel has the seed's structure (then its own rules decide)."""
        try:
            self._regions(C.kernel(module))
            return True
        except NotApplicable:
            return False

    def _production(self, module) -> bool:
        """JAX's idiom instead of the seed's (a kernel that dispatches to its bodies)."""
        try:
            return production_reason(module) is None
        except NotApplicable:
            return False

    def _check_seed(self, module) -> Applicability:
        try:
            fn = C.kernel(module)
            region = self._regions(fn)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        if C.find_all(fn, lambda n: C.is_call(n, "jnp.exp2")):
            return Applicability(False, "the kernel already uses jnp.exp2")
        if "kv_splits" in C.names_in(C.wrapper(module)):
            return Applicability(False, "split-KV's combine already reads the kernel's maxima in natural-log units")
        if len(C.find_all(region, _is_scale)) != 1:
            return Applicability(False, "no single 's = s * sm_scale' logit scaling in the compute")
        if not C.find_all(region, lambda n: C.is_call(n, "jnp.exp")):
            return Applicability(False, "no jnp.exp in the compute")
        if C.find_all(fn, lambda n: isinstance(n, cst.Attribute) and C.norm(n) in ("jnp.log", "jax.nn.softmax")):
            return Applicability(False, "the kernel uses natural-log quantities elsewhere")
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        if not self._seed_idiom(module):
            return rewrite_production(module)
        fn = C.kernel(module)

        def rewrite(node):
            if _is_scale(node):
                line = node
                assign = line.body[0]
                value = assign.value.with_changes(right=C.expr(f"(sm_scale * {LOG2_E})"))
                comment = cst.EmptyLine(comment=cst.Comment(
                    "# Logits in base 2: exp2(x * log2(e)) == exp(x), one multiply less per logit."))
                return line.with_changes(body=[assign.with_changes(value=value)],
                                         leading_lines=[*line.leading_lines, comment])
            if C.is_call(node, "jnp.exp"):
                return node.with_changes(func=C.expr("jnp.exp2"))
            return None

        new_fn = C.replace_compute(fn, lambda stmts: [C.transform(s, rewrite) for s in stmts])
        return C.replace_function(module, fn.name.value, new_fn)


# ---- production kernels (JAX's flash attention) ------------------------------------------------
# There the scaling is ``if sm_scale != 1.0: s *= sm_scale`` in each kernel body, and the running
# max may be written out as a residual for the backward pass (``m_ref``): the residual is
# converted back to natural-log units (times ln 2) where it is written, so the backward kernels,
# which this rewrite leaves alone, read what they always read.
LN_2 = "0.6931471805599453"
_MAX_CALLS = ("jnp.max(", "jnp.maximum(")


def _scale_of(node: cst.CSTNode) -> str | None:
    """The scaled name of ``X *= sm_scale``, ``X = X * sm_scale`` or ``if sm_scale != 1.0:`` around
    one of those."""
    if isinstance(node, cst.If) and C.norm(node.test) == "sm_scale!=1.0" and node.orelse is None \
            and len(node.body.body) == 1:
        return _scale_of(node.body.body[0])
    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
        small = node.body[0]
        if (isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.MultiplyAssign)
                and C.norm(small.value) == "sm_scale" and isinstance(small.target, cst.Name)):
            return small.target.value
        pair = C.assigned_name(node)
        if pair and _is_scale(node):
            return pair[0]
    return None


def _exp_functions(module: cst.Module) -> list[cst.FunctionDef]:
    """The site's kernel functions computing an exponential."""
    return [fn for fn in C.site_kernels(module) if C.find_all(fn, lambda n: C.is_call(n, "jnp.exp"))]


def production_reason(module: cst.Module) -> str | None:
    """Why the production rewrite does not apply, or None."""
    fns = _exp_functions(module)
    if not fns:
        return "no jnp.exp in the site's kernel functions"
    for fn in fns:
        if C.find_all(fn, lambda n: C.is_call(n, "jnp.exp2")):
            return f"{fn.name.value} already uses jnp.exp2"
        if len(_scalings(fn)) != 1:
            return f"no single 's *= sm_scale' logit scaling in {fn.name.value}"
        if C.find_all(fn, lambda n: isinstance(n, cst.Attribute) and C.norm(n) in ("jnp.log", "jax.nn.softmax")):
            return f"{fn.name.value} uses natural-log quantities elsewhere"
    return None


def _scalings(fn: cst.FunctionDef) -> list[cst.CSTNode]:
    """The outermost scaling statements (an ``if`` around one counts once)."""
    ifs = C.find_all(fn, lambda n: isinstance(n, cst.If) and _scale_of(n) is not None)
    inner = {id(n.body.body[0]) for n in ifs}   # type: ignore[attr-defined]
    lines = C.find_all(fn, lambda n: isinstance(n, cst.SimpleStatementLine) and _scale_of(n) is not None)
    return ifs + [n for n in lines if id(n) not in inner]


def _residual_writes(fn: cst.FunctionDef):
    """(max names, max scratch refs) of a kernel function."""
    maxima = C.assigned_from(fn, _MAX_CALLS)
    scratch = set()
    for node in C.find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1):
        target = node.targets[0].target   # type: ignore[attr-defined]
        if (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name)
                and isinstance(node.value, cst.Name) and node.value.value in maxima):  # type: ignore[attr-defined]
            scratch.add(target.value.value)
    return maxima, scratch


class _ToNatural(cst.CSTTransformer):
    """Multiply every read of a max (a max name, a read of a max scratch) by ln 2."""

    def __init__(self, maxima: set[str], scratch: set[str]):
        super().__init__()
        self.maxima, self.scratch, self.skip = maxima, scratch, set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.skip.add(id(node.attr))

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        return not (isinstance(node.value, cst.Name) and node.value.value in self.scratch)

    def _natural(self, node: cst.BaseExpression) -> cst.BaseExpression:
        return cst.BinaryOperation(left=node, operator=cst.Multiply(), right=C.expr(LN_2),
                                   lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def leave_Subscript(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value in self.scratch:
            return self._natural(updated)
        return updated

    def leave_Name(self, original, updated):
        if id(original) not in self.skip and updated.value in self.maxima:
            return self._natural(updated)
        return updated


def _rewrite_function(fn: cst.FunctionDef) -> cst.FunctionDef:
    params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    maxima, scratch = _residual_writes(fn)
    scalings = {id(n) for n in _scalings(fn)}
    comment = cst.EmptyLine(comment=cst.Comment(
        "# Logits in base 2: exp2(x * log2(e)) == exp(x), one multiply less per logit."))

    def rewrite(node):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = node.targets[0].target
            if (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name)
                    and target.value.value in params and target.value.value not in scratch
                    and (C.names_in(node.value) & (maxima | scratch))):
                # A residual max written out: back to natural-log units.
                return node.with_changes(value=node.value.visit(_ToNatural(maxima, scratch)))
        if C.is_call(node, "jnp.exp"):
            return node.with_changes(func=C.expr("jnp.exp2"))
        return None

    # The scalings first (by identity, on the original tree), then the rest bottom-up.
    class Scale(cst.CSTTransformer):
        def leave_If(self, original, updated):
            if id(original) in scalings:
                name = _scale_of(original)
                return cst.parse_statement(f"{name} *= sm_scale * {LOG2_E}\n").with_changes(
                    leading_lines=[*original.leading_lines, comment])
            return updated

        def leave_SimpleStatementLine(self, original, updated):
            if id(original) in scalings:
                name = _scale_of(original)
                return cst.parse_statement(f"{name} = {name} * (sm_scale * {LOG2_E})\n").with_changes(
                    leading_lines=[*original.leading_lines, comment])
            return updated

    return C.transform(fn.visit(Scale()), rewrite)


def rewrite_production(module: cst.Module) -> cst.Module:
    for fn in _exp_functions(module):
        current = C.module_function(module, fn.name.value)
        module = C.replace_function(module, fn.name.value, _rewrite_function(current))
    return module
