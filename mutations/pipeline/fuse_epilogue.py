"""Fuse the epilogue: elementwise work the entry does on the kernel's output moves into its store.

``gelu(matmul(x, w) + b)`` with the bias and gelu left to XLA sends the matmul's output through HBM
twice more (written by the kernel, read and written by XLA's fusion). This rewrite moves that work
into the kernel's final store, so the output makes one trip::

    def entry(x, w, b):                         def entry(x, w, b):
        y = matmul(x, w) + b            ->          return matmul(x, w, epilogue_b=b)
        return jax.nn.gelu(y)

``matmul`` defines the epilogue as a closure of the output block and the operand blocks, hands it
to the kernel (``functools.partial(kernel, epilogue=..., pre_dtype=...)``), passes each operand the
epilogue reads as a new kernel input whose BlockSpec follows the output's (a dimension the operand
broadcasts gets block 1, index 0), and every full-block store ``o_ref[...] = v`` becomes
``o_ref[...] = epilogue(v, b_ref[...]).astype(o_ref.dtype)``.

What it proves before it applies, and refuses otherwise (saying which):

* the epilogue is elementwise: every call in it is ``.astype`` or a function of ``ELEMENTWISE``
  (so a block of the output maps to the same block of the result), it indexes nothing and reads no
  ``.shape``; the output's shape is checked again at trace time (broadcasting must not grow it);
* the kernel only ever stores its output block whole (``o_ref[...] = v``): it never reads it,
  accumulates into it, slices it or hands it to a DMA;
* the wrapper is called once, from the entry, and returns ``pl.pallas_call(...)(...)`` of a single
  output with literal ``in_specs`` (no ``grid_spec``, no scalar prefetch, no aliasing).

The judge's reference is the whole workload, so what the kernel absorbs is checked like the rest.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite
from .._walk import walk

OUT = "_o"                       # the epilogue's name for the kernel's output block
HELPER = "_epilogue_operand_specs"
LOCALS = ("_epilogue", "_pre", "_out_spec", "_out", "_specs")
STATIC_ATTRS = ("dtype", "ndim")
ELEMENTWISE = frozenset(
    [f"jax.numpy.{n}" for n in (
        "exp", "exp2", "expm1", "log", "log1p", "log2", "tanh", "sin", "cos", "sqrt", "abs", "absolute",
        "maximum", "minimum", "where", "clip", "square", "sign", "negative", "reciprocal", "power",
        "add", "subtract", "multiply", "divide", "true_divide", "asarray", "float32", "bfloat16",
        "float16", "logaddexp", "floor", "ceil", "round", "isnan", "isfinite", "nan_to_num")]
    + [f"jax.nn.{n}" for n in (
        "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "log_sigmoid", "softplus", "elu", "selu",
        "celu", "leaky_relu", "hard_tanh", "hard_sigmoid", "hard_silu", "hard_swish", "mish", "tanh")]
    + [f"jax.lax.{n}" for n in (
        "exp", "exp2", "log", "log1p", "tanh", "logistic", "rsqrt", "sqrt", "erf", "max", "min", "select",
        "abs", "neg", "sign", "integer_pow", "pow", "square", "convert_element_type")]
    + ["jax.scipy.special.erf", "float", "int", "abs", "max", "min"])

_SPECS_HELPER = f'''
def {HELPER}(epilogue, pre, out_spec, operands):
    """The fused epilogue's output (shape and dtype) and a BlockSpec for each operand it reads: the
    output's block and index map, with block 1 at index 0 in each dimension the operand broadcasts."""
    out = jax.eval_shape(epilogue, pre, *operands)
    if tuple(out.shape) != tuple(pre.shape):
        raise ValueError(f"the fused epilogue changes the output's shape {{pre.shape}} to {{out.shape}}")
    specs = []
    for a in operands:
        lead = len(pre.shape) - a.ndim
        if lead < 0:
            raise ValueError(f"an epilogue operand {{a.shape}} has more dimensions than the output {{pre.shape}}")
        kept = tuple(d != 1 or o == 1 for d, o in zip(a.shape, pre.shape[lead:]))
        block = tuple(b if k else 1 for k, b in zip(kept, tuple(out_spec.block_shape)[lead:]))

        def index(*ids, _kept=kept, _lead=lead):
            return tuple(i if k else 0 for k, i in zip(_kept, tuple(out_spec.index_map(*ids))[_lead:]))

        specs.append(pl.BlockSpec(block, index))
    return out, specs
'''


def _aliases(module: cst.Module) -> dict[str, str]:
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


def _dotted(node: cst.BaseExpression, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    head = aliases.get(node.value, node.value)
    return ".".join([head, *reversed(parts)])


def _module_names(module: cst.Module) -> set[str]:
    names = set(_aliases(module))
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif (pair := C.assigned_name(stmt)) is not None:
            names.add(pair[0])
    return names


class _Plan:
    """What the rewrite needs, found (and proved) from the module; NotApplicable when it cannot."""

    def __init__(self, module: cst.Module, task: Any):
        self.module = module
        self.wrapper = C.wrapper(module)
        w = self.wrapper.name.value
        entry = getattr(task, "entry", None)
        self.entry = C.module_function(module, entry or "")
        if self.entry is self.wrapper:
            raise NotApplicable(f"no epilogue to move: the entry {w}() is the kernel's wrapper and returns "
                                "the pallas_call's output as it is (the epilogue must follow the wrapper in the entry)")
        if self.entry is None:
            raise NotApplicable(f"the epilogue must follow the kernel's wrapper {w}() in the entry; "
                                f"the entry is {entry or 'not named'}")
        uses = [n for n in walk(module) if isinstance(n, cst.Name) and n.value == w]
        calls = [c for c in C.find_all(self.entry, lambda n: isinstance(n, cst.Call)
                                       and isinstance(n.func, cst.Name) and n.func.value == w)]
        if len(calls) != 1 or len(uses) != 2:          # its def and the one call
            raise NotApplicable(f"{w}() must be called exactly once, from the entry (it is named {len(uses) - 1} "
                                "times): fusing changes what it returns")
        self.call: cst.Call = calls[0]
        self._epilogue(module)
        self._wrapper_call()
        self._kernel_store()

    # -- the entry's statements after the call ---------------------------------------------------
    def _epilogue(self, module: cst.Module) -> None:
        body = list(self.entry.body.body)
        at = next(i for i, s in enumerate(body) if C.find_all(s, lambda n: n is self.call))
        tail = body[at:]
        for s in tail:
            small = s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None
            ok = isinstance(small, cst.Return) or (isinstance(small, cst.Assign) and len(small.targets) == 1
                                                   and isinstance(small.targets[0].target, cst.Name))
            if not ok:
                raise NotApplicable(f"the entry's statement after the kernel is not NAME = ... or return: "
                                    f"{C.code(s).strip()}")
        if not isinstance(tail[-1].body[0], cst.Return):  # type: ignore[attr-defined]
            raise NotApplicable("the entry does not end in a return after the kernel")
        self.before, self.at = body[:at], at
        tail[0] = tail[0].deep_replace(self.call, cst.Name(OUT))  # type: ignore[assignment]
        last = tail[-1].body[0].value  # type: ignore[attr-defined]
        if len(tail) == 1 and isinstance(last, cst.Name) and last.value == OUT:
            raise NotApplicable("nothing follows the kernel in the entry: there is no epilogue to fuse")
        params = [p.name.value for p in (*self.entry.params.params, *self.entry.params.kwonly_params)]
        if OUT in params or OUT in C.names_in(cst.Module(body=body[:at])):
            raise NotApplicable(f"the entry already uses the name {OUT}")
        aliases, known = _aliases(module), _module_names(module)
        assigned = {OUT} | {s.body[0].targets[0].target.value for s in tail[:-1]}  # type: ignore[attr-defined]
        values: list[str] = []
        static: list[str] = []
        for node in walk(cst.Module(body=tail)):
            if isinstance(node, cst.Subscript):
                raise NotApplicable(f"the epilogue indexes a value ({C.code(node)}): not elementwise")
            if isinstance(node, cst.Call):
                func = node.func
                if isinstance(func, cst.Attribute) and func.attr.value == "astype":
                    continue
                name = _dotted(func, aliases)
                if name not in ELEMENTWISE:
                    raise NotApplicable(f"the epilogue calls {C.code(func)}, not a known elementwise function")
            if isinstance(node, cst.Attribute) and node.attr.value == "shape":
                raise NotApplicable(f"the epilogue reads {C.code(node)}: in the kernel it would be the block's")
        for name, is_static in _name_uses(cst.Module(body=tail)):
            if name in assigned or name in known:
                continue
            if name not in params:
                raise NotApplicable(f"the epilogue reads {name}, computed in the entry before the kernel")
            (static if is_static else values).append(name)
        self.tail = tail
        self.operands = list(dict.fromkeys(values))                  # entry names, in first use order
        self.statics = [n for n in dict.fromkeys(static) if n not in self.operands]

    # -- the wrapper: its parameters, its return of pl.pallas_call(...)(...) ----------------------
    def _wrapper_call(self) -> None:
        w = self.wrapper
        positional = [p.name.value for p in w.params.params]
        if not isinstance(w.params.star_arg, (cst.MaybeSentinel, cst.ParamStar)) or w.params.star_kwarg:
            raise NotApplicable(f"{w.name.value}() takes *args or **kwargs")
        passed: dict[str, str] = {}             # entry name -> wrapper name
        for i, arg in enumerate(self.call.args):
            if arg.star:
                raise NotApplicable("the entry calls the wrapper with *args")
            if isinstance(arg.value, cst.Name):
                target = arg.keyword.value if arg.keyword is not None else (
                    positional[i] if i < len(positional) else None)
                if target is not None:
                    passed.setdefault(arg.value.value, target)
        taken = C.names_in(w) | {p.name.value for p in w.params.kwonly_params}
        self.names: dict[str, str] = {}
        self.new_params: list[tuple[str, str]] = []               # (wrapper param, entry name)
        for name in self.operands + self.statics:
            if name in passed:
                self.names[name] = passed[name]
                continue
            new = f"epilogue_{name}"
            while new in taken:
                new += "_"
            taken.add(new)
            self.names[name] = new
            self.new_params.append((new, name))
        clash = [n for n in LOCALS if n in taken]
        if clash:
            raise NotApplicable(f"the wrapper already uses the name {clash[0]} (already fused?)")
        last = w.body.body[-1]
        ret = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 else None
        outer = ret.value if isinstance(ret, cst.Return) else None
        if not (isinstance(outer, cst.Call) and isinstance(outer.func, cst.Call)
                and C.is_call(outer.func, "pl.pallas_call")):
            raise NotApplicable(f"{w.name.value}() does not end in return pl.pallas_call(...)(...)")
        self.outer, self.pallas = outer, outer.func
        for bad in ("grid_spec", "input_output_aliases"):
            if C.call_kwarg(self.pallas, bad) is not None:
                raise NotApplicable(f"pallas_call takes {bad}=: not handled")
        specs = C.call_kwarg(self.pallas, "in_specs")
        if not isinstance(specs, (cst.List, cst.Tuple)) or any(e.star for e in specs.elements
                                                                 if isinstance(e, cst.StarredElement)):
            raise NotApplicable("pallas_call's in_specs is not a literal list of BlockSpecs")
        for kw in ("out_specs", "out_shape"):
            value = C.call_kwarg(self.pallas, kw)
            if value is None or isinstance(value, (cst.List, cst.Tuple, cst.Dict)):
                raise NotApplicable(f"pallas_call's {kw} is missing or not a single output's")
        self.in_specs, self.n_in = specs, len(specs.elements)
        first = self.pallas.args[0].value if self.pallas.args else None
        if isinstance(first, cst.Call) and C.is_call(first, "functools.partial") and first.args:
            first = first.args[0].value
        if not isinstance(first, cst.Name) or C.module_function(self.module, first.value) is None:
            raise NotApplicable("pallas_call's kernel is not a module-level function (or a functools.partial of one)")
        self.kernel = C.module_function(self.module, first.value)

    # -- the kernel: the output block only ever stored whole --------------------------------------
    def _kernel_store(self) -> None:
        k = self.kernel
        params = k.params.params
        if k.params.star_arg not in (cst.MaybeSentinel.DEFAULT,) and not isinstance(k.params.star_arg, cst.ParamStar) \
                or len(params) <= self.n_in:
            raise NotApplicable(f"the kernel {k.name.value}() does not name its output ref as parameter {self.n_in}")
        self.o_ref = params[self.n_in].name.value
        stores = 0
        for node in walk(k.body):
            if isinstance(node, cst.Assign) and any(_is_whole(t.target, self.o_ref) for t in node.targets):
                stores += 1
        uses = [n for n in walk(k.body) if isinstance(n, cst.Name) and n.value == self.o_ref]
        dtype_reads = [n for n in walk(k.body) if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name)
                       and n.value.value == self.o_ref and n.attr.value in ("dtype", "shape")]
        if not stores:
            raise NotApplicable(f"the kernel never stores its output block {self.o_ref}[...] whole")
        if len(uses) != stores + len(dtype_reads):
            raise NotApplicable(f"the kernel reads, slices or hands on its output block {self.o_ref}: the epilogue "
                                "could only follow a whole-block store")
        taken = C.names_in(k) | {p.name.value for p in (*params, *k.params.kwonly_params)}
        if {"epilogue", "pre_dtype"} & taken:
            raise NotApplicable("the kernel already takes an epilogue")
        self.refs = []
        for name in self.operands:
            ref = f"{self.names[name]}_ref"
            while ref in taken:
                ref += "_"
            taken.add(ref)
            self.refs.append(ref)


def _is_whole(target: cst.BaseExpression, ref: str) -> bool:
    """``ref[...]``, ``ref[:]`` or ``ref[:, :]``: a store of the whole block."""
    if not (isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value == ref):
        return False
    parts = [e.slice for e in target.slice]
    return all((isinstance(p, cst.Index) and isinstance(p.value, cst.Ellipsis))
               or (isinstance(p, cst.Slice) and p.lower is None and p.upper is None and p.step is None) for p in parts)


def _name_uses(node: cst.CSTNode) -> list[tuple[str, bool]]:
    """Each name read in ``node``, with whether the read is static (``x.dtype``, ``x.ndim``)."""
    out: list[tuple[str, bool]] = []
    static_heads: set[int] = set()
    skip: set[int] = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
            if isinstance(n.value, cst.Name) and n.attr.value in STATIC_ATTRS:
                static_heads.add(id(n.value))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
        elif isinstance(n, cst.AssignTarget):
            skip.update(id(x) for x in walk(n.target) if isinstance(x, cst.Name))
    for n in walk(node):
        if isinstance(n, cst.Name) and id(n) not in skip:
            out.append((n.value, id(n) in static_heads))
    return out


def _rename(node: cst.CSTNode, names: dict[str, str]) -> Any:
    """Every read of an entry name in ``node`` as the wrapper's name for it."""
    def fn(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Name) and n.value in names:
            return n.with_changes(value=names[n.value])
        return None
    return C.transform(node, fn)


class FuseEpilogue(Rewrite):
    name = "fuse_epilogue"
    exact = False        # the output is rounded once, after the epilogue, not also before it
    description = ("Move elementwise work the entry does on the kernel's output (a bias, an activation, a scale, "
                   "a cast) into the kernel's store, its operands passed in as blocks that follow the output's: "
                   "the output makes one trip through HBM instead of three.")

    def _check(self, module, task) -> Applicability:
        if C.module_function(module, HELPER) is not None:
            return Applicability(False, "the kernel's epilogue is already fused")
        _Plan(module, task)
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        return _fuse(_Plan(module, task))


def _fuse(p: _Plan) -> cst.Module:
    w_name, k_name = p.wrapper.name.value, p.kernel.name.value
    wnames = [p.names[n] for n in p.operands]
    # The kernel: new operand refs after the inputs; each whole store through the epilogue.
    k = p.kernel
    params = list(k.params.params)
    params[p.n_in:p.n_in] = [cst.Param(cst.Name(r), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                             for r in p.refs]
    k = k.with_changes(params=k.params.with_changes(params=params))
    k = C.add_kwonly_param(C.add_kwonly_param(k, "epilogue"), "pre_dtype")
    reads = "".join(f", {r}[...]" for r in p.refs)
    o = p.o_ref

    def store(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == o \
                and n.attr.value == "dtype":
            return cst.Name("pre_dtype")
        return None

    def wrap(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Assign) and any(_is_whole(t.target, o) for t in n.targets):
            value = n.value
            # acc.astype(o_ref.dtype): the epilogue takes acc itself, rounded once at the end, as
            # XLA's fusion does (rounding twice is what made the unfused kernel less precise).
            if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value == "astype" and len(value.args) == 1
                    and C.code(value.args[0].value) == "pre_dtype"):
                value = value.func.value
            return n.with_changes(value=C.expr(f"epilogue({C.code(value)}{reads}).astype({o}.dtype)"))
        return None

    body = C.transform(C.transform(k.body, store), wrap)
    k = k.with_changes(body=body)
    # The wrapper: the epilogue as a closure, the operands' specs, the pallas_call fed them.
    w = p.wrapper
    for new, _ in p.new_params:
        w = C.add_kwonly_param(w, new)
    tail = [_rename(s, p.names) for s in p.tail]
    header = f"def _epilogue({OUT}{''.join(', ' + n for n in wnames)}):\n    pass\n"
    epi = C.with_block(header, tail).with_changes(leading_lines=[cst.EmptyLine()])
    pallas = p.pallas
    first = pallas.args[0].value
    if C.is_call(first, "functools.partial"):
        new_first = C.add_call_kwarg(C.add_call_kwarg(first, "epilogue", "_epilogue"), "pre_dtype", "_pre.dtype")
    else:
        new_first = C.expr(f"functools.partial({C.code(first)}, epilogue=_epilogue, pre_dtype=_pre.dtype)")
    specs = p.in_specs.with_changes(elements=[
        *p.in_specs.elements[:-1],
        p.in_specs.elements[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
        cst.StarredElement(cst.Name("_specs"))])
    args = [a if a.keyword is None or a.keyword.value not in ("in_specs", "out_specs", "out_shape") else
            a.with_changes(value={"in_specs": specs, "out_specs": cst.Name("_out_spec"),
                                  "out_shape": cst.Name("_out")}[a.keyword.value]) for a in pallas.args]
    args[0] = args[0].with_changes(value=new_first)
    outer = p.outer.with_changes(func=pallas.with_changes(args=args))
    for n in wnames:
        outer = outer.with_changes(args=[*outer.args[:-1], outer.args[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(cst.Name(n))])
    setup = C.stmts(f"\n_pre = {C.code(C.call_kwarg(pallas, 'out_shape'))}\n"
                    f"_out_spec = {C.code(C.call_kwarg(pallas, 'out_specs'))}\n"
                    f"_out, _specs = {HELPER}(_epilogue, _pre, _out_spec, ({''.join(n + ', ' for n in wnames)}))\n")
    last = w.body.body[-1]
    ret = last.with_changes(body=[last.body[0].with_changes(value=outer)])  # type: ignore[attr-defined]
    w = w.with_changes(body=w.body.with_changes(body=[*w.body.body[:-1], epi, *setup, ret]))
    # The entry: everything from the call on is one call of the wrapper, fed the new operands.
    call = p.call
    for new, name in p.new_params:
        call = C.add_call_kwarg(call, new, name)
    e = p.entry.with_changes(body=p.entry.body.with_changes(
        body=[*p.before, cst.SimpleStatementLine([cst.Return(call)])]))
    body = []
    for stmt in p.module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value in (w_name, k_name, e.name.value):
            if stmt.name.value == w_name:
                helper = C.stmts(_SPECS_HELPER)
                body.append(helper[0].with_changes(leading_lines=[cst.EmptyLine()] * 2))
            stmt = {w_name: w, k_name: k, e.name.value: e}[stmt.name.value]
        body.append(stmt)
    module = p.module.with_changes(body=body)
    if "functools" not in _aliases(module):
        at = next((i for i, s in enumerate(module.body) if isinstance(s, cst.SimpleStatementLine)
                   and isinstance(s.body[0], (cst.Import, cst.ImportFrom))
                   and C.code(s).strip() != "from __future__ import annotations"), 0)
        module = module.with_changes(body=[*module.body[:at], *C.stmts("import functools\n"), *module.body[at:]])
    return module
