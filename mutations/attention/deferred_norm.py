"""Deferred normalisation: keep the accumulator unnormalised, divide by l once at the end."""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite


def _subscript_of(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == name


def _terms(node: cst.BaseExpression, op: type) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, op):
        return node.left, node.right
    return None


class _Match:
    """What the rewrite needs, found in the kernel."""

    def __init__(self, module: cst.Module):
        self.fn = C.kernel(module)
        (_, _, _, self.o_ref), (_, self.l_ref, self.acc_ref) = C.kernel_refs(self.fn)
        region = C.compute_statements(self.fn)
        holder = cst.Module(body=region)
        # The acc update: ACC[i] = ACC[i] * A + PV * B, with B an inverse computed as 1.0 / l.
        self.update = None
        for line in C.find_all(holder, lambda n: isinstance(n, cst.SimpleStatementLine)):
            small = line.body[0] if len(line.body) == 1 else None  # type: ignore[attr-defined]
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                    and _subscript_of(small.targets[0].target, self.acc_ref)):
                continue
            add = _terms(small.value, cst.Add)
            if add is None:
                continue
            left, right = (_terms(t, cst.Multiply) for t in add)
            if left and right and _subscript_of(left[0], self.acc_ref) and isinstance(right[0], cst.Name):
                self.update, self.acc_term, self.pv = line, left[0], right[0].value
                self.inv_names = C.names_in(right[1])
        if self.update is None:
            raise NotApplicable(f"no normalising update '{self.acc_ref}[...] = {self.acc_ref}[...] * a "
                                "+ pv * b' in the kernel (already deferred?)")
        # The inverse definitions (INV = 1.0 / l) that only the normalisation used.
        self.inverse_lines = []
        for line in C.find_all(holder, lambda n: isinstance(n, cst.SimpleStatementLine)):
            pair = C.assigned_name(line)
            if pair and pair[0] in self.inv_names and _terms(pair[1], cst.Divide):
                self.inverse_lines.append(line)
        if not self.inverse_lines:
            raise NotApplicable("the accumulator update does not multiply by an inverse 1 / l")
        # alpha = jnp.exp(m_prev - m_next) (or exp2): the rescaling factor of the old accumulator.
        self.alpha = None
        for line in C.find_all(holder, lambda n: isinstance(n, cst.SimpleStatementLine)):
            pair = C.assigned_name(line)
            if (pair and (C.is_call(pair[1], "jnp.exp") or C.is_call(pair[1], "jnp.exp2"))
                    and _terms(pair[1].args[0].value, cst.Subtract)):  # type: ignore[attr-defined]
                sub = pair[1].args[0].value  # type: ignore[attr-defined]
                if isinstance(sub.left, cst.Name) and isinstance(sub.right, cst.Name):
                    self.alpha = pair[0]
                    break
        if self.alpha is None:
            raise NotApplicable("no 'alpha = jnp.exp(m_prev - m_next)' rescaling factor in the kernel")
        self.store = C.store_function(self.fn)
        reads = C.find_all(self.store, lambda n: _subscript_of(n, self.acc_ref))
        if len(reads) != 1:
            raise NotApplicable(f"_store reads {self.acc_ref} {len(reads)} times; expected once")
        self.store_read = reads[0]


class DeferredNormalisation(Rewrite):
    name = "deferred_norm"
    description = ("Stop normalising the accumulator every kv step (acc = alpha * acc + pv) and "
                   "divide by the running sum l once, at the last kv step.")

    def _check(self, module, task) -> Applicability:
        try:
            _Match(module)
        except NotApplicable:
            if not self._production(module):
                raise
        return APPLICABLE

    def _production(self, module) -> bool:
        """JAX's per-step normalisation by a guarded inverse, in the site's kernel functions."""
        try:
            return bool(production_matches(module))
        except NotApplicable:
            return False

    def _apply(self, module, task) -> cst.Module:
        try:
            match = _Match(module)
        except NotApplicable:
            if self._production(module):
                return rewrite_production(module)
            raise
        compact = C.stats_compact(module)
        lanes = "" if compact else "[:, :1]"
        acc = C.code(match.acc_term.with_changes(lpar=[], rpar=[]))
        new_update = cst.parse_statement(f"{acc} = {acc} * {match.alpha}{lanes} + {match.pv}\n")
        leading = list(match.update.leading_lines)
        # Move the comments of the removed lines onto the update, reworded.
        comment = cst.EmptyLine(comment=cst.Comment(
            "# Deferred normalisation: the accumulator stays unnormalised; _store divides by l."))
        for line in match.inverse_lines:
            leading = [x for x in line.leading_lines if x.comment is None] + leading
        new_update = new_update.with_changes(leading_lines=[*leading, comment])
        inverse_codes = {C.code(x) for x in match.inverse_lines}
        update_code = C.code(match.update)

        def rewrite(node):
            if isinstance(node, cst.IndentedBlock):
                body = []
                for stmt in node.body:
                    text = C.code(stmt)
                    if text in inverse_codes:
                        continue
                    body.append(new_update if text == update_code else stmt)
                return node.with_changes(body=body)
            return None

        fn = C.transform(match.fn, rewrite)
        # The store divides by l once.
        idx = ", ".join(C.code(s.slice) for s in match.store_read.slice)
        read = C.code(match.store_read.with_changes(lpar=[], rpar=[]))
        store = C.store_function(fn)
        old_read = C.find_all(store, lambda n: _subscript_of(n, match.acc_ref))[0]
        new_read = C.expr(f"({read} / {match.l_ref}[{idx}]{lanes})")
        new_store = C.replace_node(store, old_read, new_read)
        fn = C.replace_top(fn, store, new_store)  # type: ignore[arg-type]
        return C.replace_function(module, match.fn.name.value, fn)


# ---- production kernels (JAX's flash attention) ------------------------------------------------
# There every kv step computes ``INV = jnp.where(l_next == 0.0, 1.0, 1.0 / l_next)``, rescales the
# accumulator by ``F(l_corr * INV)`` and adds ``o_curr * F(INV)`` (F tiles the statistic's lanes
# over the head dimension). Deferred: the accumulator is rescaled by ``F(alpha)`` only (``l_corr =
# alpha * l_prev``), takes ``o_curr`` as it is, and the store divides by the l scratch once.
class _ProductionMatch:
    def __init__(self, fn: cst.FunctionDef):
        self.fn = fn
        guarded = [n for n in C.find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                                         and isinstance(n.targets[0].target, cst.Name)
                                         and _guarded_inverse(n.value))]
        if len(guarded) != 1:
            raise NotApplicable(f"no single guarded inverse 'inv = jnp.where(l == 0, 1, 1 / l)' in {fn.name.value}")
        self.inv_assign = guarded[0]
        self.inv = guarded[0].targets[0].target.value
        self.l_next = C.norm(guarded[0].value.args[2].value.right)
        augs = C.find_all(fn, lambda n: isinstance(n, cst.AugAssign) and self.inv in C.names_in(n.value))
        self.rescale = [a for a in augs if isinstance(a.operator, cst.MultiplyAssign)]
        self.add = [a for a in augs if isinstance(a.operator, cst.AddAssign)]
        if len(self.rescale) != 1 or len(self.add) != 1 or len(augs) != 2 \
                or C.norm(self.rescale[0].target) != C.norm(self.add[0].target):
            raise NotApplicable(f"no 'acc *= f(l_corr * inv)' and 'acc += pv * f(inv)' pair in {fn.name.value}")
        self.rescale, self.add = self.rescale[0], self.add[0]
        self.acc = self.rescale.target
        if not (isinstance(self.acc, cst.Subscript) and isinstance(self.acc.value, cst.Name)):
            raise NotApplicable("the accumulator is not a scratch ref's subscript")
        # The rescale's product l_corr * inv, and l_corr = alpha * l_prev.
        products = C.find_all(self.rescale.value, lambda n: isinstance(n, cst.BinaryOperation)
                              and isinstance(n.operator, cst.Multiply) and C.norm(n.right) == self.inv
                              and isinstance(n.left, cst.Name))
        if len(products) != 1:
            raise NotApplicable("the accumulator's rescaling is not f(l_corr * inv)")
        self.product = products[0]
        l_corr = products[0].left.value
        alphas = [n.value.left.value for n in C.find_all(fn, lambda n: isinstance(n, cst.Assign)
                  and len(n.targets) == 1 and C.norm(n.targets[0].target) == l_corr
                  and isinstance(n.value, cst.BinaryOperation) and isinstance(n.value.operator, cst.Multiply)
                  and isinstance(n.value.left, cst.Name))]
        if len(alphas) != 1:
            raise NotApplicable(f"no '{l_corr} = alpha * l_prev' in {fn.name.value}")
        self.alpha = alphas[0]
        # The added term: pv * f(inv) -> pv.
        if not (isinstance(self.add.value, cst.BinaryOperation) and isinstance(self.add.value.operator, cst.Multiply)
                and self.inv not in C.names_in(self.add.value.left)):
            raise NotApplicable("the accumulator's update is not 'pv * f(inv)'")
        # The l scratch: the ref written with l_next.
        writes = [n.targets[0].target for n in C.find_all(fn, lambda n: isinstance(n, cst.Assign)
                  and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Subscript)
                  and C.norm(n.value) == self.l_next)]
        if len(writes) != 1:
            raise NotApplicable(f"no single scratch write of {self.l_next}")
        self.l_read = C.code(writes[0])
        # The store: the one output write that reads the accumulator outside the kv loop.
        reads = C.find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                           and C.norm(self.acc) in {C.norm(s) for s in C.find_all(
                               n.value, lambda x: isinstance(x, cst.Subscript))})
        if len(reads) != 1:
            raise NotApplicable(f"{C.norm(self.acc)} is read by {len(reads)} assignments; expected one store")
        self.store = reads[0]


def _guarded_inverse(node: cst.CSTNode) -> bool:
    from .approx_reciprocal import _guarded_inverse as guarded

    return guarded(node)


def production_matches(module: cst.Module) -> list[_ProductionMatch]:
    out = []
    for fn in C.site_kernels(module):
        try:
            out.append(_ProductionMatch(fn))
        except NotApplicable:
            continue
    return out


def rewrite_production(module: cst.Module) -> cst.Module:
    for match in production_matches(module):
        fn = C.module_function(module, match.fn.name.value)
        module = C.replace_function(module, fn.name.value, fn.visit(_Deferral(match)))
    return module


class _Deferral(cst.CSTTransformer):
    """One kernel function's rewrite, statement by statement."""

    def __init__(self, match: _ProductionMatch):
        super().__init__()
        self.m = match
        acc = C.code(match.acc)
        # The store scales by the guarded inverse of the lane-replicated l, its lanes tiled over
        # (or cut to) the head dimension, as the per-step rescale does: dividing the (block_q, D)
        # accumulator by a broadcast l[:, :1] instead costs some 114K more cycles at Autocomp's v6e
        # shape than JAX's own loop (scripts/fidelity.py prints the figure).
        l_val = match.l_read
        self.new_read = C.expr(
            f"({acc} * (lambda inv, d: jnp.tile(inv, (1, d // inv.shape[-1])) if d >= inv.shape[-1] "
            f"else inv[:, :d])(jnp.where({l_val} == 0.0, 1.0, 1.0 / {l_val}), {acc}.shape[-1]))")
        self.comment = cst.EmptyLine(comment=cst.Comment(
            "# Deferred normalisation: the accumulator stays unnormalised; the store scales by 1 / l."))
        self.acc = C.norm(match.acc)

    def leave_SimpleStatementLine(self, original, node):
        if len(node.body) != 1:
            return node
        small, m = node.body[0], self.m
        if C.norm(small) == C.norm(m.inv_assign):
            return cst.RemovalSentinel.REMOVE
        if isinstance(small, cst.AugAssign) and C.norm(small.target) == self.acc:
            if isinstance(small.operator, cst.MultiplyAssign):
                product = C.find_all(small.value, lambda n: isinstance(n, cst.BinaryOperation)
                                     and C.norm(n) == C.norm(m.product))[0]
                value = C.replace_node(small.value, product, cst.Name(m.alpha))
                return node.with_changes(body=[small.with_changes(value=value)],
                                         leading_lines=[*node.leading_lines, self.comment])
            if isinstance(small.operator, cst.AddAssign):
                return node.with_changes(body=[small.with_changes(value=small.value.left)])
        if C.norm(small) == C.norm(m.store):
            read = C.find_all(small.value, lambda n: isinstance(n, cst.Subscript) and C.norm(n) == self.acc)[0]
            return node.with_changes(body=[small.with_changes(value=C.replace_node(small.value, read, self.new_read))])
        return node
