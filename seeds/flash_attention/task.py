"""The trusted half of the flash-attention seed: shape, inputs, reference, FLOPs, tolerances.

Nothing here is ever taken from a candidate. The judge imports this module in trusted
processes only; candidates see nothing but the input arrays it produces.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from seeds._contract import WIDE, SeedTask, check_positive_ints, wide_attention, wide_factor
from seeds._contract import parse_shape as _parse_shape

DTYPES = ("bfloat16", "float16", "float32")
DISTRIBUTIONS = ("normal", "outliers", "tempered", "wide")
# "tempered": the logits' temperature is itself drawn (log-uniform over this range) from the set's
# seed, which the judge draws in secret: a kernel tuned to the statistics of N(0, 1) logits fails.
# "wide": the timing input (a normal draw) with v scaled by a factor in seeds._contract.WIDE_FACTORS
# and the logits by half of it (seeds._contract.wide_attention).
TEMPERATURES = (0.25, 16.0)
SEQ_TILE = 128            # sequence blocks are multiples of the 128-lane tile
MAX_SEQ_BLOCK = 2048
# The (BLOCK_Q, BLOCK_KV) points a grid over this kernel tries: square blocks and the two
# lopsided largest ones (the ablation's grid; smaller blocks never won it).
GRID_BLOCKS = ((512, 512), (1024, 1024), (2048, 2048), (1024, 2048), (2048, 1024))
MAX_HEADS_PER_PROGRAM = 8

# |out - ref| <= atol + rtol * |ref|, elementwise, on top of strict shape / dtype / NaN checks.
# bf16 outputs round at 2**-8 relative; the kernel's own bf16 matmuls add about as much again.
TOLERANCES = {
    "bfloat16": (2e-2, 2e-2),
    "float16": (4e-3, 4e-3),
    "float32": (2e-4, 2e-4),
}


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    """One attention problem: (B, H, N, D) query, key and value of one dtype."""

    name = "flash_attention"
    description = "multi-head attention softmax(q k^T * sm_scale [causal mask]) v, forward"
    entry = "flash_attention"
    input_names = ("q", "k", "v")
    shape_grammar = "B=1,H=8,N=2048,D=128"
    distributions = DISTRIBUTIONS
    # The distributions every candidate is checked on; the judge draws each set's seed in secret
    # (evaluator/correctness/ground_truth.py). These seeds are public: only a judge given explicit sets uses them.
    correctness_inputs = (("normal", 0), ("outliers", 1), ("tempered", 2), WIDE)
    peers = {"JAX flash_attention (tuned blocks)": "../../examples/jax_flash_attention_tuned.py"}
    ablation_peers = {"JAX flash_attention (default blocks)": "../../examples/jax_flash_attention.py"}
    starts = {"jax": "jax.experimental.pallas.ops.tpu.flash_attention"}   # JAX's own, at its default blocks
    test_tasks = {"small": ("B=1,H=2,N=256,D=128", {}), "small-full": ("B=1,H=2,N=256,D=128", {"causal": False})}

    batch: int = 1
    heads: int = 8
    seq_len: int = 2048
    head_dim: int = 128
    causal: bool = True
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        check_positive_ints(self, ("batch", "heads", "seq_len", "head_dim"))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        unknown = set(options) - {"causal", "dtype"}
        if unknown:
            raise ValueError(f"flash_attention takes no option {', '.join(sorted(unknown))}; "
                             "its options are causal and dtype")
        return cls(**parse_shape(shape or ""), **{k: v for k, v in options.items() if v is not None})

    # ---- identity -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq_len, self.head_dim)

    @property
    def key(self) -> str:
        """A stable name for archives and MLflow experiments."""
        mask = "causal" if self.causal else "full"
        return (f"flash_attention/B{self.batch}-H{self.heads}-N{self.seq_len}-D{self.head_dim}"
                f"-{mask}-{self.dtype}")

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize if self.dtype != "bfloat16" else 2

    # ---- the work that counts ---------------------------------------------------------------
    @property
    def flops(self) -> float:
        """Useful FLOPs: 2 matmuls of 2*N*N*D each, causal counting only the unmasked pairs."""
        n = self.seq_len
        pairs = n * (n + 1) / 2 if self.causal else n * n
        return 4.0 * self.batch * self.heads * pairs * self.head_dim

    @property
    def bytes_moved(self) -> float:
        """The unavoidable HBM traffic: read q, k, v once, write o once."""
        return 4.0 * self.batch * self.heads * self.seq_len * self.head_dim * self.itemsize

    @property
    def tolerance(self) -> tuple[float, float]:
        return TOLERANCES[self.dtype]

    # ---- the contract's calls --------------------------------------------------------------------
    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(self.shape, self.dtype)] * 3

    def kernel_kwargs(self) -> dict[str, Any]:
        return {"causal": self.causal, "sm_scale": self.sm_scale}

    def make_inputs(self, seed: int, distribution: str = "normal"):
        return make_inputs(self, seed, distribution)

    def reference(self, q, k, v):
        return reference_f32(self, q, k, v)

    def magnitude(self, q, k, v):
        """softmax(q k^T) @ |v|: large where a few large values of v are summed (``outliers``)."""
        return reference_f32(self, q, k, np.abs(np.asarray(v, np.float32)))

    def truth(self, distribution, q, k, v):
        """The truth and the size from one softmax (the judge's setup makes both for every set)."""
        p, v32 = softmax_f32(self, q, k), np.asarray(v, np.float32)
        return tuple(np.einsum("bhqk,bhkd->bhqd", p, x) for x in (v32, np.abs(v32)))

    def reference_program(self):
        return reference_program(self)

    def tiling_problem(self, tunables: dict[str, int]) -> str | None:
        for name in ("BLOCK_Q", "BLOCK_KV"):
            block = tunables.get(name)
            if block and self.seq_len > block and self.seq_len % block:
                return (f"N={self.seq_len} cannot be tiled by the kernel's {name}={block}; "
                        f"use an N that is a multiple of {block}")
        if self.seq_len > SEQ_TILE and self.seq_len % SEQ_TILE:
            return (f"N={self.seq_len} is not a multiple of {SEQ_TILE}, the TPU's lane tile; "
                    f"use a multiple of {SEQ_TILE} (or N <= {SEQ_TILE})")
        return None

    def example_task(self, tunables: dict[str, int]) -> AttentionTask:
        """One sequence of 128 tokens (blocks larger than N are cut to N), as many heads as one
        program takes."""
        return dataclasses.replace(self, batch=1, heads=tunables.get("HEADS_PER_PROGRAM", 1),
                                   seq_len=min(self.seq_len, 128), dtype="float32")

    def grid_shapes(self) -> list[dict[str, int]]:
        return [{"BLOCK_Q": q, "BLOCK_KV": kv} for q, kv in GRID_BLOCKS]

    def legal_values(self, tunable: str) -> list[int] | None:
        """Sequence blocks: multiples of the 128-lane tile dividing N, up to 2048 (beyond it a
        block's f32 logits alone no longer fit scoped VMEM); heads per program: divisors of H up
        to 8."""
        if tunable in ("BLOCK_Q", "BLOCK_KV"):
            n = self.seq_len
            return [v for v in range(SEQ_TILE, min(n, MAX_SEQ_BLOCK) + 1, SEQ_TILE) if n % v == 0]
        if tunable == "HEADS_PER_PROGRAM":
            return [v for v in range(1, min(self.heads, MAX_HEADS_PER_PROGRAM) + 1) if self.heads % v == 0]
        return None


AttentionTask = Task   # the name the rest of this seed's code and its tests use


def parse_shape(text: str) -> dict[str, int]:
    """Parse ``B=1,H=8,N=2048,D=128`` (any subset) into task keyword arguments."""
    return _parse_shape(text, {"B": "batch", "H": "heads", "N": "seq_len", "D": "head_dim"},
                        Task.shape_grammar)


# ---- inputs -------------------------------------------------------------------------------
def make_inputs(task: AttentionTask, seed: int, distribution: str = "normal"):
    """q, k, v as numpy arrays of the task's dtype (bf16 via ml_dtypes).

    ``outliers`` adds a few large-magnitude entries to q and k (large logits test the running
    max) and to v (large values test the accumulator's scaling). ``tempered`` scales q and k so
    that the logits' temperature is t, drawn log-uniform in TEMPERATURES from the seed (t = 16:
    logits of standard deviation 16, a near one-hot softmax; t = 0.25: a near-uniform one).
    ``wide`` is the ``normal`` draw of the same seed with v scaled by f, drawn log-uniform in
    100..1000, and the logits by f / 2 (q and k each by sqrt(f / 2), rounded to whole numbers;
    ``seeds._contract.wide_attention``).
    """
    import ml_dtypes  # installed with jax

    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r}; use one of {DISTRIBUTIONS}")
    if distribution == "wide":
        return wide_attention(*make_inputs(task, seed, "normal"), wide_factor(seed))
    rng = np.random.default_rng(seed)
    scale = 1.0
    if distribution == "tempered":
        low, high = np.log(TEMPERATURES)
        scale = float(np.sqrt(np.exp(rng.uniform(low, high))))   # q and k each: logits scale by t
    arrays = []
    for x_scale in (scale, scale, 1.0):
        x = rng.standard_normal(task.shape, dtype=np.float32) * np.float32(x_scale)
        if distribution == "outliers":
            mask = rng.random(task.shape) < 0.002
            x = np.where(mask, x * 30.0, x)
        arrays.append(x)
    np_dtype = ml_dtypes.bfloat16 if task.dtype == "bfloat16" else np.dtype(task.dtype)
    return tuple(a.astype(np_dtype) for a in arrays)


# ---- references ------------------------------------------------------------------------------
def reference_f32(task: AttentionTask, q, k, v):
    """Plain attention in f32 numpy: the ground truth every candidate is compared with."""
    return np.einsum("bhqk,bhkd->bhqd", softmax_f32(task, q, k), np.asarray(v, np.float32))


def softmax_f32(task: AttentionTask, q, k):
    """The attention weights in f32 numpy, softmax(q k^T * sm_scale [causal mask]). The row
    max is subtracted before the logits are scaled: the gaps the softmax depends on are then exact
    where q . k is (the wide set's whole q and k), where scaling first rounds every logit by up to
    half its ulp, the rounding the task's XLA program makes (3e-5 at a logit of 1,000), and a truth
    that made it too would hold a kernel that fuses the scale into exp's argument (one rounding
    fewer, as XLA:CPU does inside a kernel) to the program's error rather than to the answer: the
    f32 seed without a causal mask measured 10 to 40 times the program's 99th-percentile error
    against such a truth on wide draws, and a tenth of it against this one."""
    q32, k32 = (np.asarray(x, dtype=np.float32) for x in (q, k))
    s = np.einsum("bhqd,bhkd->bhqk", q32, k32)
    if task.causal:
        n = task.seq_len
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s = (s - s.max(axis=-1, keepdims=True)) * np.float32(task.sm_scale)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p


def reference_program(task: AttentionTask):
    """The plain XLA program the speedups are quoted against (jnp, task dtype, f32 softmax)."""
    import jax
    import jax.numpy as jnp

    def attention(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
        s = s * task.sm_scale
        if task.causal:
            n = task.seq_len
            s = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v,
                          preferred_element_type=jnp.float32).astype(q.dtype)

    return attention
