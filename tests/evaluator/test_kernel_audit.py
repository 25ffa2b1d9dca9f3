"""The trusted audit of exported programs: what it flags, and what it must let through."""

from __future__ import annotations

import importlib.util
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import export

from evaluator import traced
from evaluator.kernel_audit import audit_exported

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ROOT / "tests" / "evaluator" / "adversarial" / "candidates"
SPEC = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.bfloat16)


def _exported(path: Path, platform: str = "tpu"):
    spec = importlib.util.spec_from_file_location(f"k_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = functools.partial(module.flash_attention, causal=True, sm_scale=128 ** -0.5)
    programs = traced.trace_and_export(fn, (SPEC, SPEC, SPEC))
    return export.deserialize(bytearray(programs.tpu if platform == "tpu" else programs.cpu))


@pytest.mark.parametrize("path", [ROOT / "seeds" / "flash_attention" / "kernel.py",
                                  ROOT / "examples" / "jax_flash_attention.py"], ids=["seed", "jax"])
def test_kernels_with_program_id_control_flow_have_no_findings(path):
    assert audit_exported(_exported(path)) == []
    assert audit_exported(_exported(path, "cpu")) == []   # the interpreter's loops are not flagged


@pytest.mark.parametrize("name, construct", [
    ("c5_when_on_prefetched_flag", "data_dependent_branch"),
    ("c5_prefetch_loop_bound", "data_dependent_loop"),
    ("c5_xla_loop_over_heads", "xla_loop"),
])
def test_constructs_the_estimate_cannot_count_are_named(name, construct):
    findings = audit_exported(_exported(CANDIDATES / f"{name}.py"))
    assert [f.construct for f in findings] == [construct], findings
    assert findings[0].where and findings[0].detail


def test_a_static_loop_bound_inside_the_kernel_is_not_flagged(tmp_path):
    source = (CANDIDATES / "c5_prefetch_loop_bound.py").read_text()
    path = tmp_path / "static.py"
    path.write_text(source.replace("BOUND_FROM_PREFETCH = True", "BOUND_FROM_PREFETCH = False"))
    assert audit_exported(_exported(path)) == []


def test_host_callbacks_and_platform_branches_are_refused_at_the_trace():
    def callback(q, k, v):
        return jax.pure_callback(lambda x: x, jax.ShapeDtypeStruct(q.shape, q.dtype), q)

    def branch(q, k, v):
        return jax.lax.platform_dependent(q, tpu=lambda x: x * 2, default=lambda x: x)

    for fn, phrase in ((callback, "host callback"), (branch, "platform_dependent")):
        with pytest.raises(traced.Refused, match=phrase):
            traced.trace_and_export(fn, (SPEC, SPEC, SPEC))
