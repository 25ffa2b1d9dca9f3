"""Trusted comparison of a candidate's output with the reference. Runs in the parent only."""

from __future__ import annotations

import dataclasses

import numpy as np

QUANTILE = 0.99   # the error the baseline comparison holds a kernel to, besides the mean
NOISE_ULPS = 8    # an error below 8 f32 ulps of the largest output is summation order, never "less precise"


@dataclasses.dataclass(frozen=True)
class Comparison:
    ok: bool
    error: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    baseline_abs_error: float | None = None   # the task's own XLA program on the same input


def held(ref: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Where the f32 truth is a finite number as an output of ``dtype`` holds it: the elements a
    kernel is held to. Elsewhere the reference itself gives no number (its f32 result overflows
    or is NaN, or is past the output dtype's range, where an honest kernel's cast overflows as the
    task's own program's does), so there is nothing to match."""
    finite = np.isfinite(ref)
    if np.dtype(dtype).kind in "iub":
        return finite
    with np.errstate(over="ignore", invalid="ignore"):
        return finite & np.isfinite(ref.astype(dtype).astype(np.float32))


def compare(out: np.ndarray, ref: np.ndarray, *, expected_dtype: str, atol: float, rtol: float,
            label: str = "", baseline: np.ndarray | None = None,
            baseline_factor: float = 1.5, magnitude: np.ndarray | None = None) -> Comparison:
    """Strict: shape and dtype must match exactly; only the elements where the reference's own
    output is a number (:func:`held`) are compared (the ``wide`` set's inputs, 100 to 1000 times the
    example's, can drive the truth past f32's range, where no kernel owes one), and any NaN or Inf
    there fails (a softmax without its max subtracted gives NaN where the truth is finite); then
    elementwise ``|out - ref| <= atol * max(1, magnitude) + rtol * |ref|`` (``magnitude``: the size
    of what the element sums, ``SeedTask.magnitude``; a rounding error scales with it, and ``|ref|`` can
    cancel to about 0 where large terms meet: JAX's own flash attention failed a secret
    ``outliers`` draw at H=32 by 0.0001, an error of 0.0225 on a sum of 0.12, and such draws'
    worst errors sit where the terms' size is 10-20); then, given the task's own XLA program's output on the
    same input (``baseline``), the 99th-percentile and the mean error over the same elements may be
    at most ``baseline_factor`` times the baseline's, so that a less precise kernel cannot hide
    inside a loose tolerance."""
    where = f" on {label}" if label else ""
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}{where}")
    if str(out.dtype) != expected_dtype:
        return Comparison(False, f"output dtype {out.dtype} != expected {expected_dtype}{where}")
    out32 = out.astype(np.float32)
    compared = held(ref, out.dtype)
    bad = int((compared & ~np.isfinite(out32)).sum())
    if bad:
        return Comparison(False, f"{bad} NaN/Inf value(s) in the output where the reference's is finite{where}")
    if not compared.all():      # nothing is owed where the truth has no number: no error there
        out32, ref = np.where(compared, out32, 0.0), np.where(compared, ref, 0.0)
    diff = np.abs(out32 - ref)
    max_abs = float(diff.max()) if diff.size else 0.0
    rel = diff / np.maximum(np.abs(ref), 1e-6)
    max_rel = float(rel.max()) if rel.size else 0.0
    scale = 1.0
    if magnitude is not None:   # a size that is not a number scales nothing (it would excuse any error)
        magnitude = np.asarray(magnitude, np.float32)
        scale = np.where(np.isfinite(magnitude), np.maximum(1.0, magnitude), 1.0)
    excess = diff - (atol * scale + rtol * np.abs(ref))
    if (excess > 0).any():
        idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
        scaled = "" if magnitude is None else f" x the size of the terms summed, {float(scale[idx]):.3g} there"
        return Comparison(False, (f"max abs error {max_abs:.4g} exceeds tolerance (atol={atol}{scaled}, "
                                  f"rtol={rtol}){where}; worst at index {tuple(int(i) for i in idx)}: "
                                  f"got {out32[idx]:.5g}, expected {ref[idx]:.5g}"),
                          max_abs, max_rel)
    if baseline is None:
        return Comparison(True, "", max_abs, max_rel)
    base_diff = np.abs(baseline.astype(np.float32) - ref)
    # Like with like: the kernel's errors and the program's over the same elements, those held
    # whose program output is a number (a program that overflows where the truth does not would
    # otherwise excuse any error with its own infinite one).
    both = compared & np.isfinite(base_diff)
    diff, base_diff = diff[both], base_diff[both]
    if not diff.size:
        return Comparison(True, "", max_abs, max_rel)
    base_abs = float(base_diff.max())
    # Nearly every element and the typical one: a kernel that loses precision everywhere (bf16
    # accumulation) shows in the mean long before it shows in the max. Not the max itself: on
    # inputs drawn afresh by every judge, the largest of 10^5 errors is an extreme value that
    # swings with the draw (scripts/precision_spread.py: an approximate reciprocal's max-error ratio
    # ranged 0.68-3.28 over 30 secret sets, its 99th percentile 1.04-1.28); every element is still
    # held to atol/rtol.
    # Below NOISE_ULPS of f32 at the output's largest value, an error is the order of an f32 sum,
    # not precision lost: an f32-output grouped matmul summing K in blocks of 1024 was 1.6x the
    # XLA program's p99 at 9.5e-07 on outputs up to about 5, both exact in any sense bf16 knows.
    noise = NOISE_ULPS * float(np.finfo(np.float32).eps) * float(np.abs(ref).max(initial=0.0))
    for name, ours, theirs in (("99th-percentile", float(np.quantile(diff, QUANTILE)),
                                float(np.quantile(base_diff, QUANTILE))),
                               ("mean", float(diff.mean()), float(base_diff.mean()))):
        if ours > baseline_factor * theirs and ours > noise:
            return Comparison(False, (f"{name} abs error {ours:.4g} is more than {baseline_factor:g}x "
                                      f"that of the task's own XLA program ({theirs:.4g}){where}: the "
                                      "kernel is less precise than the reference program it competes with"),
                              max_abs, max_rel, base_abs)
    return Comparison(True, "", max_abs, max_rel, base_abs)
