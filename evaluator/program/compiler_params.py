"""The compiler parameters a kernel may set: an allow-list, read by the trusted runner.

Each ``pallas_call`` carries ``pltpu.CompilerParams``. Pallas' HLO interpreter (the program that
is checked for correctness) ignores all of them, and the TPU compile (the program that is timed)
obeys them. So a parameter that changes what the compiled kernel computes or how the compiler
builds it would make the program checked and the program timed two programs. Only the fields
whose effect is known and shows in the figure are allowed:

* ``vmem_limit_bytes``: how much VMEM the compiler may use; a kernel over it fails to compile
  (``FAIL_VMEM``), and what it buys (bigger blocks, deeper pipelines) is in the estimate;
* ``dimension_semantics``: which grid axes may run in any order or on another core; the
  interpreter runs the grid in order, and a wrong "parallel" is refused by Mosaic's own rules
  (parallel axes a prefix of the grid) and, on one TensorCore, changes no figure;
* ``allow_input_fusion``: lets XLA fuse an operand's producer into the kernel; the fused work is
  compiled into the program that is estimated.

Every other field must keep its default. Refused with its name (``FAIL_TIMING``): ``flags``
(free-form command-line flags for the kernel's compile), ``disable_bounds_checks``,
``disable_semaphore_checks``, ``internal_scratch_in_bytes``, ``serialization_format``,
``has_side_effects``, ``collective_id`` and the rest. Parameters for another backend, or an
object that is not the TPU's ``CompilerParams`` or carries attributes it does not declare (the
worker's jaxpr is rebuilt from data: it could), are refused too.

A declared ``pl.CostEstimate`` is dropped before either program is lowered (``traced.py``): the
judge's figures never read a kernel's own account of its cost.
"""

from __future__ import annotations

import dataclasses
import re

from evaluator.program.traced import kernel_name

ALLOWED = ("vmem_limit_bytes", "dimension_semantics", "allow_input_fusion")


class KnobRefused(Exception):
    """A kernel sets a compiler parameter whose effect the judge does not model (FAIL_TIMING)."""


def _kernels(jaxpr):
    """Every pallas_call equation in ``jaxpr``, at any depth outside kernels."""
    from evaluator.program.traced import _subjaxprs

    stack = [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            if eqn.primitive.name == "pallas_call":
                yield eqn
            else:
                stack.extend(_subjaxprs(eqn.params))


def _show(value) -> str:
    return re.sub(r"\s+", " ", repr(value))[:80]


def problems(closed) -> list[str]:
    """Every compiler parameter of every kernel in ``closed`` outside the allow-list, one line each."""
    from jax.experimental.pallas import tpu as pltpu

    found: list[str] = []
    for eqn in _kernels(closed.jaxpr):
        name = kernel_name(eqn)
        params = eqn.params.get("compiler_params")
        if params is None:
            continue
        if type(params) is not pltpu.CompilerParams:
            found.append(f"kernel '{name}': compiler parameters of type {type(params).__name__}, "
                         "not the TPU's pltpu.CompilerParams")
            continue
        declared = {f.name: f for f in dataclasses.fields(params)}
        extra = sorted(set(getattr(params, "__dict__", {})) - set(declared))
        if extra:
            found.append(f"kernel '{name}': undeclared compiler parameter(s) {', '.join(extra)}")
        for field in declared.values():
            if field.name in ALLOWED:
                continue
            default = field.default if field.default is not dataclasses.MISSING else (
                field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
            value = getattr(params, field.name)
            if value != default:
                found.append(f"kernel '{name}': compiler parameter {field.name}={_show(value)} "
                             f"(default {_show(default)})")
    return found


def check(closed) -> None:
    """Raise KnobRefused naming every parameter outside the allow-list."""
    found = problems(closed)
    if found:
        raise KnobRefused(
            "refused: " + "; ".join(found) + f". Only {', '.join(ALLOWED)} are allowed: the interpreter "
            "that checks a kernel ignores compiler parameters, so any other would make the program "
            "timed differ from the program checked in ways nobody measured")
