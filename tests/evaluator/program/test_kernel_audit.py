"""The trusted audit of exported programs: what it flags, and what it must let through.

Real jax, tiny shapes, no libtpu: a TPU export needs only Pallas' Mosaic lowering, not the compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.program import traced, wire
from evaluator.program.kernel_audit import Finding, audit_exported

ROOT = Path(__file__).resolve().parents[3]
QKV = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.bfloat16)
X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"audited_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tpu(fn, *args) -> export.Exported:
    """``fn`` exported for TPU, through the bytes, as the trusted runner receives it."""
    exported = export.export(jax.jit(fn), platforms=["tpu"])(*args)
    return export.deserialize(exported.serialize())


def _constructs(exported) -> list[str]:
    findings = audit_exported(exported)
    assert all(isinstance(f, Finding) and f.where and f.detail for f in findings), findings
    return [f.construct for f in findings]


# Small kernels, one construct each.

def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _plain(x):
    return pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _with_prefetch(kernel, value, x):
    """``kernel(scalar_ref, x_ref, o_ref)`` with one scalar-prefetch operand (= ``value``)."""
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(1,),
            in_specs=[pl.BlockSpec(x.shape, lambda i, s: (0, 0))],
            out_specs=pl.BlockSpec(x.shape, lambda i, s: (0, 0))),
    )(jnp.array([value], jnp.int32), x)


def _loop(bound_from_prefetch: bool):
    def kernel(n_ref, x_ref, o_ref):
        bound = n_ref[0] if bound_from_prefetch else 4
        o_ref[...] = jax.lax.fori_loop(0, bound, lambda i, a: a + x_ref[...], jnp.zeros(x_ref.shape, x_ref.dtype))
    return functools.partial(_with_prefetch, kernel, 4)


def _when_on_prefetched_flag(x):
    def kernel(flag_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(flag_ref[0] == 1)
        def _():
            o_ref[...] = x_ref[...] * 2
    return _with_prefetch(kernel, 1, x)


def _when_on_vmem_value(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(jnp.sum(x_ref[...]) > 0)
        def _():
            o_ref[...] = x_ref[...] * 2
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _while(condition: str):
    """A ``lax.while_loop`` in a kernel, its exit condition on a constant, a prefetched value, or data
    the loop itself accumulates (a loop-carried value)."""
    def kernel(n_ref, x_ref, o_ref):
        def keep_going(c):
            if condition == "constant":
                return c[0] < 3
            if condition == "prefetch":
                return c[0] < n_ref[0]
            return jnp.sum(c[1]) < 100.0
        o_ref[...] = jax.lax.while_loop(keep_going, lambda c: (c[0] + 1, c[1] + x_ref[...]),
                                        (0, jnp.zeros(x_ref.shape, x_ref.dtype)))[1]
    return functools.partial(_with_prefetch, kernel, 3)


def _program_id_control_flow(x):
    """Branches and a loop bound on grid indices and constants: what the estimate simulates exactly."""
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[...]

        @pl.when(i * 8 <= (pl.num_programs(0) - 1) * 8)
        def _():
            o_ref[...] = x_ref[...] * 2

        def body(j, acc):   # bounded by the grid index; a branch on the induction variable
            return jax.lax.cond(j == 0, lambda: acc + 1.0, lambda: acc * 1.0)
        o_ref[...] += jax.lax.fori_loop(0, i + 1, body, jnp.zeros(x_ref.shape, jnp.float32))
        o_ref[...] = jax.lax.switch(i, [lambda a: a, lambda a: a * 3], o_ref[...])
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(x)


@pytest.mark.parametrize("path", [ROOT / "seeds" / "flash_attention" / "kernel.py",
                                  ROOT / "examples" / "jax_flash_attention.py"], ids=["seed", "jax"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_kernels_with_program_id_control_flow_have_no_findings(path, causal):
    fn = functools.partial(_load(path).flash_attention, causal=causal, sm_scale=128 ** -0.5)
    closed = wire.loads(wire.dumps(traced.trace(fn, (QKV, QKV, QKV))))   # as the runner gets it
    programs = traced.programs(closed, (QKV, QKV, QKV))
    tpu, cpu = programs.tpu, programs.cpu
    assert audit_exported(tpu) == []
    assert audit_exported(cpu) == []   # the interpreter's grid loop is not the candidate's


@pytest.mark.parametrize("fn, construct", [
    (_loop(bound_from_prefetch=True), "data_dependent_loop"),
    (_while("prefetch"), "data_dependent_loop"),
    (_while("carried_data"), "data_dependent_loop"),
    (_when_on_prefetched_flag, "data_dependent_branch"),
    (_when_on_vmem_value, "data_dependent_branch"),
    (lambda x: jax.lax.fori_loop(0, 2, lambda i, a: _plain(a), x), "xla_loop"),
    (lambda x: jax.lax.cond(x[0, 0] > 0, _plain, lambda a: a, x), "xla_branch"),
], ids=["prefetch_bound_loop", "while_on_prefetch", "while_on_carried_data", "when_prefetched_flag",
        "when_vmem_value", "xla_fori_loop", "xla_cond"])
def test_constructs_the_estimate_cannot_count_are_named(fn, construct):
    findings = audit_exported(_tpu(fn, X))
    assert [f.construct for f in findings] == [construct], findings
    if construct.startswith("data_dependent"):   # the kernel's own source line is named
        assert "(Mosaic): scf." in findings[0].where and "test_kernel_audit.py:" in findings[0].where


@pytest.mark.parametrize("fn", [_plain, _loop(bound_from_prefetch=False), _while("constant"),
                                _program_id_control_flow],
                         ids=["plain", "static_bound_loop", "static_while_loop", "program_id_control_flow"])
def test_static_control_flow_is_not_flagged(fn):
    # The estimate simulates these exactly (scripts/estimator_constructs.py: a while loop up to a
    # constant costs what the same fori_loop does).
    assert audit_exported(_tpu(fn, X)) == []


def test_the_audit_is_fast():
    exported = _tpu(functools.partial(_load(ROOT / "seeds" / "flash_attention" / "kernel.py").flash_attention,
                                      causal=True, sm_scale=0.1), QKV, QKV, QKV)
    t0 = time.perf_counter()
    audit_exported(exported)
    assert time.perf_counter() - t0 < 0.5


def _pure_callback(x):
    return jax.pure_callback(lambda a: a * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def _io_callback(x, ordered=False):
    return io_callback(lambda a: a * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=ordered)


@pytest.mark.parametrize("fn", [_pure_callback, _io_callback], ids=["pure_callback", "io_callback"])
@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_jax_export_itself_refuses_host_callbacks(fn, platform):
    # CPU: "serialization of host_callbacks is not yet implemented"; TPU, on a host with no TPU
    # backend: "the platform for the specified backend cpu is different from the lowering platform".
    with pytest.raises((NotImplementedError, ValueError)):
        export.export(jax.jit(fn), platforms=[platform])(X)


def _forged(fn, platforms: tuple[str, ...], *args) -> export.Exported:
    """An ``Exported`` built by hand around ``fn``'s CPU lowering, as a hostile worker could build one:
    ``jax.export`` would refuse it, so the audit is tested on the unserialized object."""
    from jax._src.export import _export

    base = export.export(jax.jit(lambda x: x * 2), platforms=["cpu"])(*args)
    lowered = jax.jit(fn).lower(*args)
    compile_args = lowered._lowering.compile_args
    return dataclasses.replace(
        base, platforms=platforms,
        mlir_module_serialized=_export._module_to_bytecode(lowered.compiler_ir("stablehlo")),
        ordered_effects=tuple(compile_args["ordered_effects"]),
        unordered_effects=tuple(compile_args["unordered_effects"]))


@pytest.mark.parametrize("fn, constructs", [
    (_pure_callback, ["host_callback"]),
    (_io_callback, ["effects", "host_callback"]),
    (functools.partial(_io_callback, ordered=True), ["effects", "host_callback"]),
], ids=["pure_callback", "io_callback", "ordered_io_callback"])
@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_host_callbacks_are_named_even_in_a_forged_export(fn, constructs, platform):
    assert _constructs(_forged(fn, (platform,), X)) == constructs


def test_a_program_for_two_platforms_is_named():
    exported = export.export(jax.jit(lambda x: x * 2), platforms=["tpu", "cpu"])(X)
    assert _constructs(exported) == ["multi_platform"]


def test_an_unreadable_kernel_is_a_finding_not_a_crash():
    from jax._src.export import _export
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    exported = _tpu(_plain, X)
    text = exported.mlir_module()
    start = text.index('\\22body\\22: \\22') + len('\\22body\\22: \\22')
    end = text.index('\\22', start)
    with mlir.make_ir_context():
        broken = _export._module_to_bytecode(ir.Module.parse(text[:start] + "AAAA" + text[end:]))
    findings = audit_exported(dataclasses.replace(exported, mlir_module_serialized=broken))
    assert [f.construct for f in findings] == ["unparsed_kernel"], findings
    garbage = audit_exported(dataclasses.replace(exported, mlir_module_serialized=b"not a program"))
    assert [f.construct for f in garbage] == ["unparsed_kernel"], garbage


def test_host_callbacks_and_platform_branches_are_refused_at_the_trace():
    # The jailed worker refuses these at the trace (traced.check), and the runner again before it
    # lowers what a (possibly subverted) worker shipped; the audit above is a further look.
    def callback(q, k, v):
        return jax.pure_callback(lambda x: x, jax.ShapeDtypeStruct(q.shape, q.dtype), q)

    def branch(q, k, v):
        return jax.lax.platform_dependent(q, tpu=lambda x: x * 2, default=lambda x: x)

    for fn, phrase in ((callback, "host callback"), (branch, "platform_dependent")):
        with pytest.raises(traced.Refused, match=phrase):
            traced.trace(fn, (QKV, QKV, QKV))
    shipped = wire.loads(wire.dumps(jax.make_jaxpr(branch)(QKV, QKV, QKV)))   # check skipped
    with pytest.raises(traced.Refused, match="platform_dependent"):
        traced.programs(shipped, (QKV, QKV, QKV))
