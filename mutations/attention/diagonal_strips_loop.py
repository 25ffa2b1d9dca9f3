"""Diagonal strips on a kernel that loops over kv sub-blocks (JAX's flash attention idiom).

JAX's forward kernel already skips kv blocks above the diagonal (``@pl.when(should_run)``) and,
inside a block, runs ``@pl.loop(0, block_k_major, step=block_k)`` over ``block_k``-wide
sub-blocks, each reading the whole q block and the m / l / acc scratch as ``ref[batch_idx]`` and
masking with iotas. A block that straddles the diagonal still computes every sub-block for every
row, half of it masked away.

The rewrite makes the sub-block body a function of the rows it works on (``row0``, ``rows``, and
views of the row-indexed refs, defaulting to the whole block, so the loop calls it unchanged),
and, on a causal block that straddles the diagonal, runs it tile by tile: the q block is cut into
row strips of ``diagonal_strip`` rows, and a strip runs only the sub-blocks whose first column is
at or left of its last row (``pl.when`` on program ids, which the estimate simulates). Blocks
entirely below the diagonal keep the one loop over full-height sub-blocks. Its guard is static:
non-causal calls, a strip that does not divide the q block, or operands the strips do not slice
(an attention bias, segment ids) run the loop as before, so any later block sizes stay correct.

The tunable is a literal in the site's kernel function, ``diagonal_strip = S``: applying the
operator again sets it.
"""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import NotApplicable

STRIP_NAME = "diagonal_strip"
# Names the rewrite introduces in the kernel function (refused if already used).
_NEW_NAMES = {STRIP_NAME, "strip", "row0", "rows", "_below_diagonal", "_on_diagonal",
              "strip_index", "sub_block", "unsliced"}

_DISPATCH = """\
{strip_name} = {strip}  # rows per strip of a causal diagonal block (diagonal_strips)
strip = min({strip_name}, {block_q}){unsliced}
if causal and {block_q} == {upper} and {block_q} % strip == 0{none_guard}:
    # Causal diagonal strips. With square blocks the block on the diagonal is the one whose kv
    # index is the q index; the others that run lie below it and run the sub-block loop. The
    # diagonal block runs row strips, each only over the sub-blocks that reach its last row:
    # the tiles above the diagonal are never computed, and which they are is known at trace time.

    @pl.when({kvi} != {qi})
    def _below_diagonal():
        {loop}({body})

    @pl.when({kvi} == {qi})
    def _on_diagonal():
        for strip_index in range({block_q} // strip):
            for sub_block in range(0, (strip_index + 1) * strip, {step}):
                {body}(sub_block, strip_index * strip, strip,{views})
else:
    {loop}({body})
"""


class Match:
    """The pieces of one kernel function the rewrite needs."""

    def __init__(self, fn: cst.FunctionDef):
        self.fn = fn
        params = [p.name.value for p in fn.params.params]
        if not params:
            raise NotApplicable(f"{fn.name.value} has no positional parameters")
        self.batch_idx = params[0]
        self.ref_params = set(params[1:])
        runs = [s for s in fn.body.body if isinstance(s, cst.FunctionDef)
                and any(C.is_call(d.decorator, "pl.when") for d in s.decorators)
                and _loop_body(s) is not None]
        if len(runs) != 1:
            raise NotApplicable(f"no single @pl.when function running a @pl.loop over kv sub-blocks "
                                f"in {fn.name.value}")
        self.run = runs[0]
        self.body, self.loop = _loop_body(self.run)  # type: ignore[misc]
        args = self.loop.args
        if (len(args) != 4 or C.norm(args[0].value) != "0" or args[2].keyword is None
                or args[2].keyword.value != "step"):
            raise NotApplicable("the sub-block loop is not pl.loop(0, <block>, step=<sub-block>, ...)")
        self.upper, self.step = C.code(args[1].value), C.code(args[2].value)
        if [p.name.value for p in self.body.params.params] != [self.body.params.params[0].name.value] \
                or self.body.params.kwonly_params:
            raise NotApplicable("the sub-block body takes more than its start")
        self.start = self.body.params.params[0].name.value
        ids = C.program_id_names(fn)
        if 2 not in ids or 3 not in ids:
            raise NotApplicable(f"{fn.name.value} does not name pl.program_id(2) and pl.program_id(3)")
        self.qi, self.kvi = ids[2], ids[3]
        if "causal" not in C.kernel_kwonly(fn):
            raise NotApplicable(f"{fn.name.value} takes no causal keyword")
        block_q = [n for n, v in _assigns(fn) if C.norm(v).endswith(".shape[2]")
                   and C.norm(v).split(".")[0] in self.ref_params and n == "block_q"]
        if not block_q:
            raise NotApplicable(f"{fn.name.value} does not name its q block 'block_q = <ref>.shape[2]'")
        self.block_q = "block_q"
        taken = _NEW_NAMES & (C.names_in(fn) | set(C.kernel_kwonly(fn)))
        if taken:
            raise NotApplicable(f"the kernel already uses the names {sorted(taken)}")
        self._classify()
        self.new_body = self._strip_body()

    def _classify(self) -> None:
        """Row refs (``ref[batch_idx]``: q and the scratch), kv refs (sliced at the sub-block's
        start) and the rest (to be None where strips run)."""
        self.rows_refs: list[str] = []
        kv, other = set(), set()
        for node in C.find_all(self.body, lambda n: isinstance(n, cst.Subscript)
                               and isinstance(n.value, cst.Name) and n.value.value in self.ref_params):
            name = node.value.value
            index = C.norm(cst.Tuple([cst.Element(e.slice.value) for e in node.slice])) \
                if all(isinstance(e.slice, cst.Index) for e in node.slice) else ""
            if index in (f"({self.batch_idx},)", f"({self.batch_idx})"):
                if name not in self.rows_refs:
                    self.rows_refs.append(name)
            elif index.startswith((f"((*{self.batch_idx},pl.dslice({self.start},",
                                   f"((*{self.batch_idx},pl.ds({self.start},")):
                kv.add(name)
            else:
                other.add(name)
        used = C.names_in(self.body) & self.ref_params
        other |= used - set(self.rows_refs) - kv
        if other & set(self.rows_refs) or other & kv:
            raise NotApplicable(f"refs {sorted(other & (set(self.rows_refs) | kv))} are indexed "
                                "both by the row block and otherwise")
        if not self.rows_refs:
            raise NotApplicable(f"the sub-block body reads no ref as ref[{self.batch_idx}]")
        self.others = sorted(other)

    def _strip_body(self) -> cst.FunctionDef:
        """The body on rows [row0, row0 + rows): its mask's row shape and row ids follow."""
        row_iotas = C.find_all(self.body, lambda n: C.is_call(n, "jax.lax.broadcasted_iota")
                               and len(n.args) == 3 and C.norm(n.args[2].value) == "0")
        if len(row_iotas) != 1:
            raise NotApplicable(f"expected one row iota (broadcasted_iota(..., 0)) in the sub-block "
                                f"body, found {len(row_iotas)}")
        iota = row_iotas[0]
        body = C.replace_node(self.body, iota, C.expr(f"row0 + {C.code(iota)}"))
        shape_tuples = C.find_all(body, lambda n: isinstance(n, cst.Tuple) and len(n.elements) == 2
                                  and C.norm(n.elements[0].value) == self.block_q)
        for shape in shape_tuples:
            els = list(shape.elements)
            els[0] = els[0].with_changes(value=cst.Name("rows"))
            text = C.norm(shape)
            body = C.replace_node(
                body,
                C.find_all(body, lambda n, text=text: isinstance(n, cst.Tuple) and C.norm(n) == text)[0],
                shape.with_changes(elements=els))
        left = [n for n in C.find_all(body, lambda n: isinstance(n, cst.Name) and n.value == self.block_q)]
        offsets = C.find_all(body, lambda n: isinstance(n, cst.BinaryOperation)
                             and isinstance(n.operator, cst.Multiply)
                             and C.norm(n) == f"{self.qi}*{self.block_q}")
        if not shape_tuples or len(left) != len(offsets):
            raise NotApplicable("the sub-block body uses block_q other than as its mask's row count "
                                "and the q block's offset")
        return body.with_changes(decorators=[])

    def header(self) -> cst.Parameters:
        """The body's parameters: its start, its rows and the row refs (whole by default), one
        ref a line, aligned after ``def <name>(`` (libcst indents continuation lines with their
        block)."""
        gap = " " * len(f"def {self.body.name.value}(")
        defaults = f",\n{gap}".join(f"{r}={r}" for r in self.rows_refs)
        header = cst.parse_statement(
            f"def f({self.start}, row0=0, rows={self.block_q}, *,\n{gap}{defaults}):\n    pass\n")
        return header.params  # type: ignore[attr-defined]


def _assigns(fn: cst.FunctionDef) -> list[tuple[str, cst.BaseExpression]]:
    return [p for p in (C.assigned_name(s) for s in fn.body.body) if p]


def _loop_body(run: cst.FunctionDef) -> tuple[cst.FunctionDef, cst.Call] | None:
    for stmt in run.body.body:
        if isinstance(stmt, cst.FunctionDef):
            loops = [d.decorator for d in stmt.decorators if C.is_call(d.decorator, "pl.loop")]
            if len(loops) == 1 and len(stmt.decorators) == 1:
                return stmt, loops[0]  # type: ignore[return-value]
    return None


def find(module: cst.Module) -> Match:
    """The site's kernel function with a sub-block loop to strip (exactly one)."""
    found, reasons = [], []
    for fn in C.site_kernels(module):
        try:
            found.append(Match(fn))
        except NotApplicable as exc:
            reasons.append(f"{fn.name.value}: {exc}")
    if len(found) != 1:
        raise NotApplicable("no kernel function with a @pl.loop over kv sub-blocks to strip"
                            + (f" ({'; '.join(reasons)})" if reasons else ""))
    return found[0]


def current(module: cst.Module) -> int | None:
    """The strip height already set in the site's kernel functions (``diagonal_strip = S``)."""
    for fn in C.site_kernels(module):
        for node in C.find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                               and C.norm(n.targets[0].target) == STRIP_NAME
                               and isinstance(n.value, cst.Integer)):
            return int(node.value.evaluated_value)  # type: ignore[attr-defined]
    return None


def set_strip(module: cst.Module, strip: int) -> cst.Module:
    for fn in C.site_kernels(module):
        assigns = C.find_all(fn, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                             and C.norm(n.targets[0].target) == STRIP_NAME)
        if assigns:
            new = C.replace_node(fn, assigns[0], assigns[0].with_changes(value=cst.Integer(str(strip))))
            return C.replace_function(module, fn.name.value, new)
    raise NotApplicable(f"no '{STRIP_NAME} = ...' in the site's kernel functions")


def rewrite(module: cst.Module, strip: int) -> cst.Module:
    if current(module) is not None:
        return set_strip(module, strip)
    m = find(module)
    body_name = m.body.name.value
    # Continuation lines are relative to their block's indentation: the tile's call is four
    # blocks into the template (four spaces each).
    call_gap = " " * (4 * 4 + len(f"{body_name}("))
    views = f",\n{call_gap}".join(f"{r}={r}.at[:, :, pl.ds(strip_index * strip, strip), :]"
                                  for r in m.rows_refs)
    unsliced = (f"\nunsliced = ({', '.join(m.others)},)  # operands the strips do not slice"
                if m.others else "")
    text = _DISPATCH.format(strip_name=STRIP_NAME, strip=strip, block_q=m.block_q, qi=m.qi, kvi=m.kvi,
                            upper=m.upper, step=m.step, loop=C.code(m.loop), body=body_name,
                            views=f"\n{call_gap}{views}", unsliced=unsliced,
                            none_guard=" and all(r is None for r in unsliced)" if m.others else "")
    dispatch = C.stmts(text)
    dispatch[0] = dispatch[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    run_body = []
    for stmt in m.run.body.body:
        if stmt is m.body:
            run_body.extend([m.new_body.with_changes(params=m.header()), *dispatch])
        else:
            run_body.append(stmt)
    run = m.run.with_changes(body=m.run.body.with_changes(body=run_body))
    fn = C.replace_node(m.fn, m.run, run)
    return C.replace_function(module, m.fn.name.value, fn)  # type: ignore[arg-type]
