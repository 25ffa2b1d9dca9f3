"""VMEM limit: raise or lower the kernel's scoped VMEM limit through CompilerParams."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator, parse
from .._tunables import _int_value, _is_tunable, module_ints, set_tunable

MIB = 1024 * 1024
# v5e: 128 MiB physical VMEM, 16 MiB default scoped limit (32 MiB on v6e). Leave headroom.
LIMITS_MIB = (16, 24, 32, 48, 64, 96)
# What the compiler says when a kernel is over the chip's VMEM itself, not over the scoped limit.
OVER_CAPACITY = "Exceeded vmem capacity"


class VmemLimit(Operator):
    name = "vmem_limit"
    tunables = ("VMEM_LIMIT_BYTES",)
    knob = True
    chain_rank = 1
    repairs = ("FAIL_VMEM",)
    fit_only = True
    description = ("Set the kernel's scoped VMEM limit (VMEM_LIMIT_BYTES passed as "
                   "pltpu.CompilerParams(vmem_limit_bytes=...)) to another value in 16..96 MiB.")

    def _params_call(self, module) -> cst.Call | None:
        """The site's CompilerParams(...) call; None when pallas_call takes no compiler_params at
        all (the rewrite then adds one)."""
        call = C.pallas_call(module)
        calls = params_calls(module)
        if len(calls) == 1:
            return calls[0]
        if not calls and C.call_kwarg(call, "compiler_params") is None:
            return None
        raise NotApplicable("pallas_call's compiler_params is not one pltpu.CompilerParams(...) to set the limit on")

    def _keyword(self, module, existing) -> cst.Param | None:
        """The wrapper's keyword parameter the call passes on (``vmem_limit_bytes=vmem_limit_bytes``,
        JAX's ragged paged attention), if its default is None (the compiler's own limit) or an
        integer: the limit lives in that default."""
        if not isinstance(existing, cst.Name):
            return None
        fn = C.wrapper(module)
        for param in (*fn.params.params, *fn.params.kwonly_params):
            if param.name.value == existing.value and param.default is not None and (
                    C.norm(param.default) == "None" or _int_value(param.default) is not None):
                return param
        return None

    def _current_mib(self, module) -> float | None:
        """The limit now: the module's VMEM_LIMIT_BYTES, else a literal in the call (a module
        without module-level tunables, e.g. JAX's own kernels, holds it there), else the default
        of the keyword the call passes on."""
        value = module_ints(module).get("VMEM_LIMIT_BYTES")
        if value is None:
            try:
                params = self._params_call(module)
            except NotApplicable:
                params = None
            existing = None if params is None else C.call_kwarg(params, "vmem_limit_bytes")
            keyword = self._keyword(module, existing)
            if keyword is not None:
                existing = keyword.default
            value = None if existing is None else _int_value(existing)
        return None if value is None else value / MIB

    def _check(self, module, task) -> Applicability:
        params = self._params_call(module)
        if params is None:
            return APPLICABLE
        existing = C.call_kwarg(params, "vmem_limit_bytes")
        if (existing is not None and C.norm(existing) != "VMEM_LIMIT_BYTES" and _int_value(existing) is None
                and self._keyword(module, existing) is None):
            return Applicability(False, "vmem_limit_bytes is set to an expression other than "
                                        "VMEM_LIMIT_BYTES, an integer or a keyword of the wrapper with "
                                        "a default of None or an integer")
        return APPLICABLE

    def repair_params(self, source: str, task: Any, error: str = "") -> dict[str, Any] | None:
        """The largest limit, if the kernel does not have it yet (a kernel over it is too big), and
        unless the compiler said the kernel is over the chip's VMEM itself, which no limit lifts."""
        if not self.check(source, task).ok or OVER_CAPACITY in error:
            return None
        current = self._current_mib(parse(source))
        return {"mib": LIMITS_MIB[-1]} if current is None or current < LIMITS_MIB[-1] else None

    def fit_key(self, source: str, task: Any) -> str:
        """The source at the largest limit: the limit decides whether a kernel fits, never its
        estimate (across the suite's archive, every set of kernels that differ only in their
        limit has one figure, or FAIL_VMEM)."""
        result = self.apply_params(source, task, {"mib": LIMITS_MIB[-1]})     # checks, never raises
        return result.source if result.applied else source

    def grid_settings(self, source: str, task: Any, tried: list[Any], best: Any | None
                      ) -> list[tuple[Any, ...]]:
        """The largest limit tried: a limit costs nothing but room, so the grid does not vary it."""
        if not tried:
            return [()]
        return [(max(tried, key=lambda edit: edit.params.get("mib", 0)),)]

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        current = self._current_mib(module)
        return {"mib": rng.choice([m for m in LIMITS_MIB if m != current])}

    def _rewrite(self, module, task, params) -> cst.Module:
        mib = params.get("mib")
        if mib not in LIMITS_MIB:
            raise NotApplicable(f"mib={mib!r} is not one of {LIMITS_MIB}")
        if self._params_call(module) is None:
            module = _with_compiler_params(module)
        call = self._params_call(module)
        assert call is not None
        existing = C.call_kwarg(call, "vmem_limit_bytes")
        if "VMEM_LIMIT_BYTES" in module_ints(module) or (
                existing is None and any(_is_tunable(n) for n in module_ints(module))):
            # The seed's idiom: a module-level tunable beside the others, passed by name.
            module = set_tunable(module, "VMEM_LIMIT_BYTES", f"{mib} * 1024 * 1024",
                                 comment="scoped VMEM limit (v5e default 16 MiB, physical 128 MiB)")
            call = self._params_call(module)
            assert call is not None
            new_call = C.add_call_kwarg(call, "vmem_limit_bytes", "VMEM_LIMIT_BYTES")
            return C.replace_node(module, call, new_call)  # type: ignore[return-value]
        # No tunables at module level (a production module): the limit goes into the site's call,
        # or into the default of the wrapper's keyword that the call passes on.
        value = f"{mib} * 1024 * 1024"
        keyword = self._keyword(module, existing)
        if keyword is not None:
            return C.replace_node(module, keyword, keyword.with_changes(default=C.expr(value)))  # type: ignore
        if existing is None:
            new_call = C.add_call_kwarg(call, "vmem_limit_bytes", value)
        else:
            new_call = C.replace_node(call, existing, C.expr(value))
        return C.replace_node(module, call, new_call)  # type: ignore[return-value]


# The class of the compiler parameters, by the names JAX has given it.
PARAMS_CLASSES = ("pltpu.CompilerParams", "pltpu.TPUCompilerParams")


def params_calls(module: cst.Module) -> list[cst.Call]:
    """The compiler-parameter calls in the kernel's pallas_call, by any name of their class."""
    call = C.pallas_call(module)
    return [c for name in PARAMS_CLASSES for c in C.iter_calls(call, name)]


def _with_compiler_params(module: cst.Module) -> cst.Module:
    """``module`` whose pallas_call takes ``compiler_params=pltpu.CompilerParams()`` (the compiler's
    defaults, which the limit then joins), with ``pltpu`` imported if it was not."""
    call = C.pallas_call(module)
    module = C.replace_node(module, call, C.add_call_kwarg(call, "compiler_params", "pltpu.CompilerParams()"))
    return C.with_import(module, C.PLTPU)
