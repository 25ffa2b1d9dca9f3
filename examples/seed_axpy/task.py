"""The trusted half of the axpy example seed: out = alpha * x + y on (M, N) arrays.

A complete seed in two files (this one and kernel.py); copy the directory to start your own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from seeds import SeedTask, parse_shape

TOLERANCES = {"float32": (1e-5, 1e-5), "bfloat16": (2e-2, 2e-2)}


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    name = "axpy"
    description = "out = alpha * x + y, elementwise on (M, N) arrays (memory-bound)"
    entry = "axpy"
    input_names = ("x", "y")
    shape_grammar = "M=1024,N=1024"
    distributions = ("normal", "large")
    correctness_inputs = (("normal", 0), ("large", 1))
    test_tasks = {"small": ("M=64,N=256", {})}     # what the tests run it at

    rows: int = 1024
    cols: int = 1024
    dtype: str = "float32"
    alpha: float = 2.0

    def __post_init__(self) -> None:
        if self.rows % 8 or self.cols % 128:
            raise ValueError(f"M={self.rows}, N={self.cols}: M must be a multiple of 8 and N of 128")
        if self.dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {', '.join(TOLERANCES)}, got {self.dtype!r}")

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        unknown = set(options) - {"dtype"}
        if unknown:
            raise ValueError(f"axpy takes no option {', '.join(sorted(unknown))}; its only option is dtype")
        return cls(**parse_shape(shape, {"M": "rows", "N": "cols"}, cls.shape_grammar), **options)

    @property
    def key(self) -> str:
        return f"axpy/M{self.rows}-N{self.cols}-{self.dtype}"

    def input_specs(self):
        return [((self.rows, self.cols), self.dtype)] * 2

    def kernel_kwargs(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def make_inputs(self, seed: int, distribution: str = "normal"):
        import ml_dtypes

        rng = np.random.default_rng(seed)
        scale = 1000.0 if distribution == "large" else 1.0
        dtype = ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.float32
        return tuple((rng.standard_normal((self.rows, self.cols)) * scale).astype(dtype) for _ in range(2))

    def reference(self, x, y):
        return self.alpha * np.asarray(x, np.float32) + np.asarray(y, np.float32)

    def reference_program(self):
        import jax.numpy as jnp

        def axpy(x, y):
            return (self.alpha * x.astype(jnp.float32) + y.astype(jnp.float32)).astype(x.dtype)

        return axpy

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.cols

    @property
    def bytes_moved(self) -> float:
        return 3.0 * self.rows * self.cols * np.dtype(np.float32 if self.dtype == "float32" else np.float16).itemsize

    @property
    def tolerance(self) -> tuple[float, float]:
        return TOLERANCES[self.dtype]

    def tiling_problem(self, tunables: dict[str, int]) -> str | None:
        block = tunables.get("BLOCK_ROWS")
        if block and self.rows > block and self.rows % block:
            return f"M={self.rows} cannot be tiled by the kernel's BLOCK_ROWS={block}; use a multiple of {block}"
        return None

    def legal_values(self, tunable: str) -> list[int] | None:
        if tunable == "BLOCK_ROWS":
            return [v for v in (8, 16, 32, 64, 128, 256, 512, 1024) if v <= self.rows and self.rows % v == 0]
        return None
