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


def compare(out: np.ndarray, ref: np.ndarray, *, expected_dtype: str, atol: float, rtol: float,
            label: str = "", baseline: np.ndarray | None = None,
            baseline_factor: float = 1.5, magnitude: np.ndarray | None = None) -> Comparison:
    """Strict: shape and dtype must match exactly; any NaN or Inf fails; then elementwise
    ``|out - ref| <= atol * max(1, magnitude) + rtol * |ref|`` (``magnitude``: the size of what
    the element sums, ``SeedTask.magnitude``; a rounding error scales with it, and ``|ref|`` can
    cancel to about 0 where large terms meet: JAX's own flash attention failed a secret
    ``outliers`` draw at H=32 by 0.0001, an error of 0.0225 on a sum of 0.12, and such draws'
    worst errors sit where the terms' size is 10-20); then, given the task's own XLA program's output on the
    same input (``baseline``), the 99th-percentile and the mean error may be at most
    ``baseline_factor`` times the baseline's, so that a less precise kernel cannot hide inside a
    loose tolerance."""
    where = f" on {label}" if label else ""
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}{where}")
    if str(out.dtype) != expected_dtype:
        return Comparison(False, f"output dtype {out.dtype} != expected {expected_dtype}{where}")
    out32 = out.astype(np.float32)
    finite = np.isfinite(out32)
    if not finite.all():
        bad = int((~finite).sum())
        return Comparison(False, f"{bad} NaN/Inf value(s) in the output{where}")
    diff = np.abs(out32 - ref)
    max_abs = float(diff.max()) if diff.size else 0.0
    rel = diff / np.maximum(np.abs(ref), 1e-6)
    max_rel = float(rel.max()) if rel.size else 0.0
    scale = 1.0 if magnitude is None else np.maximum(1.0, np.asarray(magnitude, np.float32))
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
    base_abs = float(base_diff.max()) if diff.size else 0.0
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
