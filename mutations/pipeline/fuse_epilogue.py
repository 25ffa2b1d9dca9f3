"""Fuse the epilogue: elementwise work done on the kernel's output moves into its store.

``gelu(matmul(x, w) + b)`` with the bias and gelu left to XLA sends the matmul's output through HBM
twice more (written by the kernel, read and written by XLA's fusion). This rewrite moves that work
into the kernel's final store, so the output makes one trip::

    def entry(x, w, b):                         def entry(x, w, b):
        y = matmul(x, w) + b            ->          return matmul(x, w, epilogue_b=b)
        return jax.nn.gelu(y)

The work may follow the pallas_call in the function that makes it (``y = pl.pallas_call(...)(x, w)``
then ``return jax.nn.gelu(y + b)``, or the call in place), or follow a call of that function (the
wrapper) in its one caller (the entry, or a function the entry reaches); either may be a method
(``Model.forward``) reading arrays held by ``self`` (``self.bias``): see ``_output.py``.

The function making the pallas_call defines the epilogue as a closure of the output block and the
operand blocks, hands it to the kernel (``functools.partial(kernel, epilogue=..., pre_dtype=...)``),
passes each operand the epilogue reads as a new kernel input whose BlockSpec follows the output's
(a dimension the operand broadcasts gets block 1, index 0; an operand of lower rank, such as a bias
of shape (N,), gets leading dimensions of 1, so its block follows the output's column block), and
every full-block store ``o_ref[...] = v`` becomes
``o_ref[...] = epilogue(v, b_ref[...]).astype(o_ref.dtype)``. A kernel that accumulates into its
output block over a grid axis (``@pl.when(pl.program_id(k) == 0)`` zeroes it, every step adds to
it) keeps doing so in the output's own dtype, and the epilogue runs once, at the axis' last step.

What it proves before it applies, and refuses otherwise (saying which):

* the epilogue is elementwise: every call in it is ``.astype`` or a function of ``ELEMENTWISE``
  (so a block of the output maps to the same block of the result), it indexes nothing and reads no
  ``.shape``; the output's shape is checked again at trace time (broadcasting must not grow it);
* the kernel only ever stores its output block whole (``o_ref[...] = v``), or accumulates into it
  whole as above: it never slices it or hands it to a DMA;
* the pallas_call makes a single output with no ``grid_spec``, scalar prefetch or aliasing.

The judge's reference is the whole workload, so what the kernel absorbs is checked like the rest.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite
from .._walk import walk
from ._output import (OUT, Site, accumulation_axis, aliases, dotted, find, fresh, is_whole, module_names,
                      output_mode, rebuild, with_comma)

HELPER = "_epilogue_operand_specs"
LOCALS = ("_epilogue", "_pre", "_out_spec", "_out", "_specs", "_args")
STATIC_ATTRS = ("dtype", "ndim")
# An attribute that ends a ``self.a.b`` chain: what follows is not an array ``self`` holds.
STOP_ATTRS = frozenset({"dtype", "ndim", "shape", "astype", "T", "reshape", "size"})
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

_SPECS_HELPER = f"""
def {HELPER}(epilogue, pre, out_spec, operands):
    \"\"\"The fused epilogue's output (shape and dtype), a BlockSpec for each operand it reads, and the
    operands as the kernel takes them: each of the output's rank (a scalar, or a bias of shape (N,),
    gets leading dimensions of 1), its block the output's, with block 1 at index 0 in each dimension
    it broadcasts.\"\"\"
    out = jax.eval_shape(epilogue, pre, *operands)
    if tuple(out.shape) != tuple(pre.shape):
        raise ValueError(f"the fused epilogue changes the output's shape {{pre.shape}} to {{out.shape}}")
    block_shape = tuple(pre.shape) if out_spec.block_shape is None else tuple(out_spec.block_shape)
    index_map = out_spec.index_map or (lambda *ids: (0,) * len(pre.shape))
    specs, args = [], []
    for a in operands:
        a = jax.numpy.asarray(a)
        lead = len(pre.shape) - a.ndim
        if lead < 0:
            raise ValueError(f"an epilogue operand {{a.shape}} has more dimensions than the output {{pre.shape}}")
        a = a.reshape((1,) * lead + tuple(a.shape))
        kept = tuple(d != 1 or o == 1 for d, o in zip(a.shape, pre.shape))
        block = tuple(b if k or not isinstance(b, int) else 1 for k, b in zip(kept, block_shape))

        def index(*ids, _kept=kept):
            at = index_map(*ids)
            at = tuple(at) if isinstance(at, (tuple, list)) else (at,)
            return tuple(i if k else 0 for k, i in zip(_kept, at))

        specs.append(pl.BlockSpec(block, index))
        args.append(a)
    return out, specs, args
"""


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    """What the rewrite needs, found (and proved) from the module."""

    s: Site
    mode: str                          # "store" or "accumulate" (output_mode)
    axis: int | None                   # accumulate: the grid axis the kernel sums over
    tail: list[cst.BaseStatement]      # the epilogue's statements, the output as _o, ending in return
    operands: list[str]                # the epilogue's names of its array operands, first use first
    exprs: dict[str, str]              # such a name -> the user's expression for it (b, self.bias)
    names: dict[str, str]              # a name the epilogue reads -> the site's name for it
    new_params: list[tuple[str, str]]  # caller style: (a new wrapper parameter, the user's expression)
    refs: list[str]                    # the kernel's refs of the operands


def _plan(module: cst.Module, task: Any) -> _Plan:
    s = find(module, task, "epilogue")
    names = aliases(module)
    mode = output_mode(s.kernel, s.o_ref, names)
    axis = accumulation_axis(s) if mode == "accumulate" else None
    tail, values, statics, exprs = _epilogue(s, module, names, task)
    mapping = {n: n for n in values + statics}
    new_params: list[tuple[str, str]] = []
    taken = C.names_in(s.site) | {p.name.value for p in s.site.params.kwonly_params}
    if not s.inline:
        mapping, new_params = _wrapper_names(s, values + statics, exprs, taken)
    clash = [n for n in LOCALS if n in taken]
    if clash:
        raise NotApplicable(f"{s.site_name}() already uses the name {clash[0]} (already fused?)")
    k = s.kernel
    ktaken = C.names_in(k) | {p.name.value for p in (*k.params.params, *k.params.kwonly_params)}
    if {"epilogue", "pre_dtype"} & ktaken:
        raise NotApplicable("the kernel already takes an epilogue")
    refs = [fresh(f"{mapping[n] if not s.inline else 'epilogue_' + n}_ref", ktaken) for n in values]
    return _Plan(s, mode, axis, tail, values, exprs, mapping, new_params, refs)


def _epilogue(s: Site, module: cst.Module, names: dict[str, str], task: Any
              ) -> tuple[list[cst.BaseStatement], list[str], list[str], dict[str, str]]:
    """The user's statements from the kernel's output on, as the epilogue: (its statements, the names
    it reads as values, those it reads only statically (``x.dtype``), each name's expression)."""
    user, where = s.user, f"{s.user_name}()"
    if s.user_name == getattr(task, "entry", None):
        where = "the entry"
    tail = s.tail()
    for st in tail:
        small = st.body[0] if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1 else None
        if not (isinstance(small, cst.Return) or (isinstance(small, cst.Assign) and len(small.targets) == 1
                                                  and isinstance(small.targets[0].target, cst.Name))):
            raise NotApplicable(f"{where}'s statement after the kernel is not NAME = ... or return: "
                                f"{C.code(st).strip()}")
    if not isinstance(tail[-1].body[0], cst.Return):  # type: ignore[attr-defined]
        raise NotApplicable(f"{where} does not end in a return after the kernel")
    last = tail[-1].body[0].value  # type: ignore[attr-defined]
    if len(tail) == 1 and isinstance(last, cst.Name) and last.value == OUT:
        raise NotApplicable(f"nothing follows the kernel in {where}: there is no epilogue to fuse")
    before = list(user.body.body)[:s.at]
    params = [p.name.value for p in (*user.params.params, *user.params.kwonly_params)]
    if OUT in params or OUT in C.names_in(cst.Module(body=before)):
        raise NotApplicable(f"{where} already uses the name {OUT}")
    for node in walk(cst.Module(body=tail)):
        if isinstance(node, cst.Subscript):
            raise NotApplicable(f"the epilogue indexes a value ({C.code(node)}): not elementwise")
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "astype":
                continue
            if dotted(func, names) not in ELEMENTWISE:
                raise NotApplicable(f"the epilogue calls {C.code(func)}, not a known elementwise function")
        if isinstance(node, cst.Attribute) and node.attr.value in ("shape", "T", "mT"):
            raise NotApplicable(f"the epilogue reads {C.code(node)}: in the kernel it would be the block's")
    # self.bias: an array the method's object holds, a value like a parameter (under a name of its own).
    chains: dict[str, str] = {}
    if s.self_name is not None:
        attrs = {id(n.attr) for n in walk(user) if isinstance(n, cst.Attribute)}
        taken = {n.value for n in walk(user) if isinstance(n, cst.Name) and id(n) not in attrs} | set(params)
        for code in _self_chains(tail, s.self_name):
            chains[code] = fresh(code.rsplit(".", 1)[1], taken)
        tail = [_replace_chains(st, chains) for st in tail]
    assigned = {OUT} | {st.body[0].targets[0].target.value for st in tail[:-1]}  # type: ignore[attr-defined]
    available = (set(params) | set(chains.values())) - {s.self_name}
    if s.inline:       # the closure sits where the output was taken: what was defined before is in scope
        available |= _bound(before) - {s.self_name}
    known = module_names(module)
    values: list[str] = []
    static: list[str] = []
    for name, kind in _name_uses(cst.Module(body=tail)):
        if name in assigned or (name not in available and (name in known or name in vars(builtins))):
            continue
        if name == s.self_name:
            raise NotApplicable(f"the epilogue reads {name} itself, not an array it holds")
        if name not in available:
            raise NotApplicable(f"the epilogue reads {name}, computed in {where} before the kernel")
        if kind == "dtype" and not s.inline:
            raise NotApplicable(f"the epilogue takes {name} as a dtype: it cannot be handed to the wrapper")
        if kind != "dtype":         # a dtype the closure takes where it sits (inline): nothing to pass
            (static if kind == "static" else values).append(name)
    values = list(dict.fromkeys(values))
    statics = [n for n in dict.fromkeys(static) if n not in values]
    exprs = {n: n for n in values + statics} | {ph: code for code, ph in chains.items()}
    if s.inline:       # captured by the closure: only a self attribute read for its dtype needs its name back
        back = {ph: code for code, ph in chains.items() if ph in statics}
        tail = [_rename(st, back) for st in tail]
        statics = []
    return tail, values, statics, exprs


def _bound(stmts: list[cst.BaseStatement]) -> set[str]:
    """The names the statements bind in their function's scope (assigned, looped over, defined)."""
    out: set[str] = set()
    for st in stmts:
        if isinstance(st, (cst.FunctionDef, cst.ClassDef)):
            out.add(st.name.value)
            continue
        for n in walk(st):
            target = (n.target if isinstance(n, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For,
                                                 cst.NamedExpr)) else None)
            if target is not None:
                out.update(x.value for x in walk(target) if isinstance(x, cst.Name))
    return out


def _self_chains(tail: list[cst.BaseStatement], self_name: str) -> list[str]:
    """The ``self.a`` (``self.a.b``) the statements read as arrays, in first use order (not a method
    called, not ``self.a.dtype`` split: the chain stops before such an attribute)."""
    module = cst.Module(body=tail)
    calls = {id(n.func) for n in walk(module) if isinstance(n, cst.Call)}
    inner = {id(n.value) for n in walk(module) if isinstance(n, cst.Attribute) and n.attr.value not in STOP_ATTRS
             and id(n) not in calls}
    found: list[str] = []
    for node in walk(module):
        if not isinstance(node, cst.Attribute) or id(node) in calls or id(node) in inner:
            continue
        parts, head = [], node
        while isinstance(head, cst.Attribute):
            parts.append(head.attr.value)
            head = head.value
        if isinstance(head, cst.Name) and head.value == self_name and not STOP_ATTRS & set(parts):
            code = ".".join([self_name, *reversed(parts)])
            if code not in found:
                found.append(code)
    return found


def _replace_chains(node: cst.CSTNode, chains: dict[str, str]) -> Any:
    def fn(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Attribute) and (name := chains.get(C.code(n))) is not None:
            return cst.Name(name)
        return None
    return C.transform(node, fn)


def _wrapper_names(s: Site, names: list[str], exprs: dict[str, str], taken: set[str]
                   ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The wrapper's name for each name the epilogue reads: the parameter the user already passes it
    in, or a new keyword-only parameter ``epilogue_<name>``."""
    w = s.site
    positional = [p.name.value for p in w.params.params]
    if not isinstance(w.params.star_arg, (cst.MaybeSentinel, cst.ParamStar)) or w.params.star_kwarg:
        raise NotApplicable(f"{s.site_name}() takes *args or **kwargs")
    passed: dict[str, str] = {}             # the user's expression -> the wrapper's parameter
    for i, arg in enumerate(s.call.args):
        if arg.star:
            raise NotApplicable(f"{s.user_name}() calls the wrapper with *args")
        target = arg.keyword.value if arg.keyword is not None else (positional[i] if i < len(positional) else None)
        if target is not None:
            passed.setdefault(C.code(arg.value), target)
    mapping: dict[str, str] = {}
    new_params: list[tuple[str, str]] = []
    for name in names:
        if exprs[name] in passed:
            mapping[name] = passed[exprs[name]]
            continue
        mapping[name] = fresh(f"epilogue_{name}", taken)
        new_params.append((mapping[name], exprs[name]))
    return mapping, new_params


def _name_uses(node: cst.CSTNode) -> list[tuple[str, str]]:
    """Each name read in ``node``, with how: ``"static"`` (``x.dtype``, ``x.ndim``), ``"dtype"`` (the
    dtype of ``.astype(dt)`` or ``dtype=dt``) or ``"value"``."""
    out: list[tuple[str, str]] = []
    kinds: dict[int, str] = {}
    skip: set[int] = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
            if isinstance(n.value, cst.Name) and n.attr.value in STATIC_ATTRS:
                kinds[id(n.value)] = "static"
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
            if n.keyword.value == "dtype" and isinstance(n.value, cst.Name):
                kinds[id(n.value)] = "dtype"
        elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "astype" \
                and len(n.args) == 1 and isinstance(n.args[0].value, cst.Name):
            kinds[id(n.args[0].value)] = "dtype"
        elif isinstance(n, cst.AssignTarget):
            skip.update(id(x) for x in walk(n.target) if isinstance(x, cst.Name))
    for n in walk(node):
        if isinstance(n, cst.Name) and id(n) not in skip:
            out.append((n.value, kinds.get(id(n), "value")))
    return out


def _rename(node: cst.CSTNode, names: dict[str, str]) -> Any:
    """Every read of a name in ``node`` as ``names`` maps it (to a name, or a dotted expression)."""
    def fn(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Name) and n.value in names and names[n.value] != n.value:
            return C.expr(names[n.value])
        return None
    return C.transform(node, fn)


class FuseEpilogue(Rewrite):
    name = "fuse_epilogue"
    exact = False        # the output is rounded once, after the epilogue, not also before it
    description = ("Move elementwise work done on the kernel's output (a bias, an activation, a scale, a cast), "
                   "after its pallas_call or after a call of its wrapper, into the kernel's store, its operands "
                   "passed in as blocks that follow the output's: the output makes one trip through HBM "
                   "instead of three.")

    def _check(self, module, task) -> Applicability:
        if C.module_function(module, HELPER) is not None:
            return Applicability(False, "the kernel's epilogue is already fused")
        _plan(module, task)
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        return _fuse(_plan(module, task))


def _fuse(p: _Plan) -> cst.Module:
    s = p.s
    closure = [p.names[n] for n in p.operands]        # the epilogue's parameters, in the site
    k = _kernel(p)
    # The site: the epilogue as a closure, the operands' specs, the pallas_call fed them.
    tail = p.tail if s.inline else [_rename(st, p.names) for st in p.tail]
    header = f"def _epilogue({OUT}{''.join(', ' + n for n in closure)}):\n    pass\n"
    epi = C.with_block(header, tail).with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    given = [p.exprs[n] for n in p.operands] if s.inline else closure
    pallas = s.pallas
    first = pallas.args[0].value
    kwargs = {"epilogue": "_epilogue"} if p.mode == "accumulate" else {"epilogue": "_epilogue",
                                                                      "pre_dtype": "_pre.dtype"}
    if C.is_call(first, "functools.partial"):
        new_first = first
        for key, value in kwargs.items():
            new_first = C.add_call_kwarg(new_first, key, value)  # type: ignore[arg-type]
    else:
        new_first = C.expr(f"functools.partial({C.code(first)}, "
                           f"{', '.join(f'{key}={value}' for key, value in kwargs.items())})")
    in_specs = s.kwarg("in_specs")
    if isinstance(in_specs, (cst.List, cst.Tuple)):
        specs: cst.BaseExpression = in_specs.with_changes(
            elements=with_comma(list(in_specs.elements), cst.StarredElement(cst.Name("_specs"))))
    else:
        specs = C.expr(f"[*{C.code(in_specs)}, *_specs]")  # type: ignore[arg-type]
    out_shape = "_out" if p.mode == "store" else "_pre"
    replaced = {"in_specs": specs, "out_specs": cst.Name("_out_spec"), "out_shape": cst.Name(out_shape)}
    args = [a if a.keyword is None or a.keyword.value not in replaced else
            a.with_changes(value=replaced[a.keyword.value]) for a in pallas.args]
    args[0] = args[0].with_changes(value=new_first)
    outer: cst.BaseExpression = s.outer.with_changes(
        func=pallas.with_changes(args=args),
        args=with_comma(list(s.outer.args), cst.Arg(cst.Name("_args"), star="*")))
    if p.mode == "accumulate":     # summed in the output's dtype; the epilogue's result cast once after
        outer = C.expr(f"({C.code(outer)}).astype(_out.dtype)")
    setup = C.stmts(f"\n_pre = {C.code(s.kwarg('out_shape'))}\n"  # type: ignore[arg-type]
                    f"_out_spec = {C.code(s.kwarg('out_specs'))}\n"  # type: ignore[arg-type]
                    f"_out, _specs, _args = {HELPER}(_epilogue, _pre, _out_spec, "
                    f"({''.join(n + ', ' for n in given)}))\n")
    ret = cst.SimpleStatementLine([cst.Return(outer)])
    site_at = s.at if s.inline else next(i for i, st in enumerate(s.site.body.body)
                                         if C.find_all(st, lambda n: n is s.outer))
    site_body = [*list(s.site.body.body)[:site_at], epi, *setup, ret]
    site = s.site.with_changes(body=s.site.body.with_changes(body=site_body))
    for param, _ in p.new_params:
        site = C.add_kwonly_param(site, param)
    user = None
    if not s.inline:    # the user: everything from the call on is one call of the wrapper, fed the operands
        call = s.call
        for new, code in p.new_params:
            call = C.add_call_kwarg(call, new, code)
        user = s.user.with_changes(body=s.user.body.with_changes(
            body=[*list(s.user.body.body)[:s.at], cst.SimpleStatementLine([cst.Return(call)])]))
    return rebuild(s, k, site, user, _SPECS_HELPER)


def _kernel(p: _Plan) -> cst.FunctionDef:
    """The kernel with the operands' refs after its inputs, taking the epilogue: each whole store
    through it, or (accumulating) the sum through it at the reduction's last step."""
    s, k, o = p.s, p.s.kernel, p.s.o_ref
    params = list(k.params.params)
    params[s.n_in:s.n_in] = [cst.Param(cst.Name(r), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                             for r in p.refs]
    k = C.add_kwonly_param(k.with_changes(params=k.params.with_changes(params=params)), "epilogue")
    reads = "".join(f", {r}[...]" for r in p.refs)
    if p.mode == "accumulate":
        last = f"pl.program_id({p.axis}) == pl.num_programs({p.axis}) - 1"
        block = C.stmts(f"@pl.when({last})\ndef _epilogue_store():\n"
                        f"    {o}[...] = epilogue({o}[...]{reads}).astype({o}.dtype)\n")
        block[0] = block[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])  # type: ignore[call-arg]
        return k.with_changes(body=k.body.with_changes(body=[*k.body.body, *block]))
    k = C.add_kwonly_param(k, "pre_dtype")

    def store(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == o \
                and n.attr.value == "dtype":
            return cst.Name("pre_dtype")
        return None

    def wrap(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Assign) and any(is_whole(t.target, o) for t in n.targets):
            value = n.value
            # acc.astype(o_ref.dtype): the epilogue takes acc itself, rounded once at the end, as
            # XLA's fusion does (rounding twice is what made the unfused kernel less precise).
            if (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value == "astype" and len(value.args) == 1
                    and C.code(value.args[0].value) == "pre_dtype"):
                value = value.func.value
            return n.with_changes(value=C.expr(f"epilogue({C.code(value)}{reads}).astype({o}.dtype)"))
        return None

    return k.with_changes(body=C.transform(C.transform(k.body, store), wrap))
