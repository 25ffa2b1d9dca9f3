"""The precision rule (evaluator/correctness/compare.py): a kernel may not be less precise than the
task's XLA program, but f32 summation-order noise is not lost precision."""

from __future__ import annotations

import numpy as np

from evaluator.correctness.compare import compare


def _case(kernel_error: float, xla_error: float, n: int = 4096):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n).astype(np.float32) * 4
    signs = rng.choice([-1.0, 1.0], size=n).astype(np.float32)
    return ref, (ref + kernel_error * signs).astype(np.float32), (ref + xla_error * signs).astype(np.float32)


def test_an_f32_kernel_at_the_noise_of_an_f32_sum_passes_beside_an_xla_program_nearer_still():
    ref, out, xla = _case(9.5e-7, 3e-7)         # outputs up to ~15: 8 ulps there is ~1.4e-5
    result = compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, baseline=xla)
    assert result.ok, result.error


def test_a_kernel_less_precise_than_xla_above_the_noise_still_fails():
    ref, out, xla = _case(1e-4, 2e-5)           # bf16-like loss: well inside atol, 5x XLA's error
    result = compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, baseline=xla)
    assert not result.ok and "less precise" in result.error


def test_where_the_truth_is_not_a_number_nothing_is_owed_and_elsewhere_nan_fails_by_set():
    """The wide set can drive the f32 truth past f32's range: those elements are not compared.
    A NaN where the truth is a number fails, naming the set."""
    ref = np.array([0.5, np.inf, -np.inf, np.nan, 2.0], np.float32)
    out = np.array([0.5, np.nan, 3.0, np.inf, 2.0], np.float32)
    assert compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, baseline=ref).ok
    out[4] = np.nan
    result = compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, label="input set 4 (wide, secret draw)")
    assert not result.ok and result.error == ("1 NaN/Inf value(s) in the output where the reference's is finite on "
                                              "input set 4 (wide, secret draw)")


def test_a_truth_past_the_output_dtypes_range_is_not_owed_but_one_inside_it_is():
    ref = np.array([1.0, 1e5, 6.0e4], np.float32)           # float16 ends at 65504
    out = np.array([1.0, np.inf, 6.0e4], np.float16)
    assert compare(out, ref, expected_dtype="float16", atol=4e-3, rtol=4e-3).ok
    out[2] = np.inf
    assert not compare(out, ref, expected_dtype="float16", atol=4e-3, rtol=4e-3).ok


def test_the_precision_rule_compares_the_same_elements_and_an_overflowing_program_excuses_nothing():
    ref, out, xla = _case(1e-4, 2e-5)
    ref[:100], xla[100:200] = np.inf, np.inf      # no truth there; the program overflows there
    result = compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, baseline=xla)
    assert not result.ok and "less precise" in result.error


def test_a_size_that_is_not_a_number_excuses_no_error():
    ref = np.zeros(4, np.float32)
    out = np.array([0.0, 0.0, 0.0, 5.0], np.float32)
    size = np.array([1.0, 1.0, 1.0, np.nan], np.float32)
    assert not compare(out, ref, expected_dtype="float32", atol=2e-4, rtol=2e-4, magnitude=size).ok



def test_a_child_out_of_host_memory_is_oom_not_a_verdict_on_the_kernel():
    # XLA:CPU's words when the child's address space runs out (seen in the correctness stage of
    # Mamba-2 at its model shape, after the profile in the same runner): no verdict on the kernel
    from evaluator.correctness.verdicts import classify_error
    from evaluator.result import Status

    message = "RESOURCE_EXHAUSTED: Out of memory allocating 134217728 bytes."
    assert classify_error("correctness", "JaxRuntimeError", message) is Status.OOM
    assert classify_error("correctness", "JaxRuntimeError", "RESOURCE_EXHAUSTED: VMEM out of memory") \
        is Status.FAIL_VMEM
    assert classify_error("correctness", "AssertionError", "wrong values") is Status.FAIL_CORRECTNESS
