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
