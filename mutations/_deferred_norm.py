"""Deferred normalisation: keep the accumulator unnormalised, divide by l once at the end."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from . import _cst as C
from ._base import APPLICABLE, Applicability, NotApplicable, Operator


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


class DeferredNormalisation(Operator):
    name = "deferred_norm"
    description = ("Stop normalising the accumulator every kv step (acc = alpha * acc + pv) and "
                   "divide by the running sum l once, at the last kv step.")

    def _check(self, module, task) -> Applicability:
        _Match(module)
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {}

    def _rewrite(self, module, task, params) -> cst.Module:
        match = _Match(module)
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
        new_store = store.deep_replace(old_read, new_read)
        fn = C.replace_top(fn, store, new_store)  # type: ignore[arg-type]
        return C.replace_function(module, match.fn.name.value, fn)
