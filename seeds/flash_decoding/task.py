"""The trusted half of the FlashDecoding seed: decode attention against a long, ragged KV cache.

A few query tokens per sequence (T) attend to that sequence's cache ``k[b], v[b]`` up to its own
length ``lengths[b]`` (ragged batches). Query heads may share K/V heads (GQA: H a multiple of
H_KV). Decode is memory-bound: the figure that matters is HBM bandwidth utilisation.

Nothing here is ever taken from a candidate; the judge runs it in trusted processes only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from seeds import WIDE, SeedTask, check_positive_ints, parse_shape, wide_attention, wide_factor

DTYPES = ("bfloat16", "float16", "float32")
TOLERANCES = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3), "float32": (2e-4, 2e-4)}
SEQ_TILE = 128
MAX_KV_BLOCK = 8192
KV_SPLITS = (1, 2, 4, 8, 16)
TEMPERATURES = (0.25, 16.0)    # the "tempered" distribution's logit scale: log-uniform in this range
_SHAPE_KEYS = {"B": "batch", "H": "heads", "HKV": "kv_heads", "N": "kv_len", "D": "head_dim", "T": "q_len"}


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    """One decode problem: q (B, H, T, D); k, v (B, H_KV, N, D); lengths (B,) int32 in 1..N."""

    name = "flash_decoding"
    description = ("decode attention: T query tokens per sequence against its KV cache up to a "
                   "per-sequence length (ragged), GQA allowed; memory-bound")
    entry = "flash_decoding"
    input_names = ("q", "k", "v", "lengths")
    shape_grammar = "B=8,H=8,HKV=8,N=32768,D=128,T=1"
    # ragged: lengths drawn in 1..N with the edge cases 1 and N always present; full: every
    # sequence uses the whole cache; outliers: ragged, with a few large-magnitude q, k, v entries;
    # tempered: ragged, with the logits' temperature drawn log-uniform in TEMPERATURES; wide: the
    # ragged draw of the same seed (its lengths too) with the logits and v scaled as flash
    # attention's wide set scales them (seeds._contract.wide_attention).
    distributions = ("ragged", "full", "outliers", "tempered", "wide")
    # The judge draws each set's seed in secret (evaluator/correctness/ground_truth.py); the first set keeps the
    # public timing input's lengths (ragged, seed 0), which the figures are of. The wide set repeats the first
    # set's seed: it is the timing input scaled, so it adds no work a figure could follow.
    correctness_inputs = (("ragged", 0), ("outliers", 1), ("tempered", 2), WIDE)
    # --chips 4: a v5e 2x2. The cache is split along its length: chip c holds entries
    # [c N/4, (c+1) N/4) of every sequence, and its own lengths clip(lengths - c N/4, 0, N/4)
    # (0 for a chip past a sequence's end); q is on every chip.
    mesh_sizes = (1, 4)
    # GQA (H=4 over HKV=2), so that grouped_heads applies (at N=1024 libtpu's static profiler
    # aborts); and a v5e 2x2 (chip_split applies), each chip's share long enough for the profiler.
    test_tasks = {"small": ("B=2,H=4,HKV=2,N=2048,D=128,T=1", {}),
                  "small-4chips": ("B=2,H=4,HKV=2,N=8192,D=128,T=1", {"chips": 4})}

    batch: int = 8
    heads: int = 8
    kv_heads: int = 8
    kv_len: int = 32768
    head_dim: int = 128
    q_len: int = 1
    dtype: str = "bfloat16"
    chips: int = 1
    # The judge's timing input's lengths (a secret draw, ``measured_on``); None: the first
    # correctness set's, made with its public seed. Not part of the task's identity.
    timed_lengths: tuple[int, ...] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_positive_ints(self, ("batch", "heads", "kv_heads", "kv_len", "head_dim", "q_len", "chips"))
        if self.chips not in self.mesh_sizes:
            raise ValueError(f"chips must be one of {', '.join(map(str, self.mesh_sizes))} (4: a v5e 2x2), "
                             f"got {self.chips}")
        if self.chips > 1 and self.kv_len % (self.chips * SEQ_TILE):
            raise ValueError(f"N={self.kv_len} does not split over {self.chips} chips into whole "
                             f"{SEQ_TILE}-entry tiles; use an N that is a multiple of {self.chips * SEQ_TILE}")
        if self.heads % self.kv_heads:
            raise ValueError(f"H={self.heads} must be a multiple of HKV={self.kv_heads} (GQA groups)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        unknown = set(options) - {"dtype", "chips"}
        if unknown:
            raise ValueError(f"flash_decoding takes no option {', '.join(sorted(unknown))}; its options "
                             "are dtype and chips")
        fields = parse_shape(shape, _SHAPE_KEYS, cls.shape_grammar)
        return cls(**fields, **{k: v for k, v in options.items() if v is not None})

    # ---- identity and work ---------------------------------------------------------------------
    @property
    def key(self) -> str:
        return (f"flash_decoding/B{self.batch}-H{self.heads}-HKV{self.kv_heads}-N{self.kv_len}"
                f"-D{self.head_dim}-T{self.q_len}-{self.dtype}" + (f"-{self.chips}chips" if self.chips > 1 else ""))

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype in ("bfloat16", "float16") else 4

    @property
    def timing_lengths(self) -> np.ndarray:
        """The cache lengths of the judge's timing input (its first input set, ``measured_on``):
        the useful work and the unavoidable bytes below are those of the problem the figure is of.
        Without a judge's: those of the first correctness set with its public seed."""
        if self.timed_lengths is not None:
            return np.asarray(self.timed_lengths, np.int32)
        distribution, seed = self.correctness_inputs[0]
        return self.lengths(seed, distribution)

    def measured_on(self, arrays):
        return dataclasses.replace(self, timed_lengths=tuple(int(x) for x in arrays["lengths"])) \
            if "lengths" in arrays else self

    @property
    def flops(self) -> float:
        """Two matmuls over each sequence's valid cache entries, for the timing input."""
        return 4.0 * self.heads * self.q_len * self.head_dim * float(self.timing_lengths.sum())

    @property
    def bytes_moved(self) -> float:
        """Each sequence's valid cache entries read once (K and V), q read and the output written
        once, for the timing input. Blocks past a sequence's length are avoidable."""
        cache = 2 * self.kv_heads * self.head_dim * int(self.timing_lengths.sum())
        return float((cache + 2 * self.batch * self.heads * self.q_len * self.head_dim) * self.itemsize)

    @property
    def tolerance(self) -> tuple[float, float]:
        return TOLERANCES[self.dtype]

    # ---- the contract's calls --------------------------------------------------------------------
    def input_specs(self):
        cache = ((self.batch, self.kv_heads, self.kv_len, self.head_dim), self.dtype)
        return [((self.batch, self.heads, self.q_len, self.head_dim), self.dtype), cache, cache,
                ((self.batch,), "int32")]

    def kernel_kwargs(self) -> dict[str, Any]:
        return {"sm_scale": self.sm_scale}

    def chip_specs(self, chips: int):
        q, cache, _, lengths = self.input_specs()
        share = ((self.batch, self.kv_heads, self.kv_len // chips, self.head_dim), self.dtype)
        return [q, share, share, lengths]

    def chip_split(self, name: str, array, chips: int):
        """k, v: each chip its quarter of the cache's length; lengths: each chip its own (clipped
        to its quarter, 0 where a sequence ends before it); q: every chip all of it."""
        array = np.asarray(array)
        share = self.kv_len // chips
        if name in ("k", "v"):
            b, h, n, d = array.shape
            return np.ascontiguousarray(array.reshape(b, h, chips, share, d).transpose(2, 0, 1, 3, 4))
        if name == "lengths":
            starts = np.arange(chips, dtype=np.int64)[:, None] * share
            return np.clip(array[None].astype(np.int64) - starts, 0, share).astype(np.int32)
        return super().chip_split(name, array, chips)

    def make_inputs(self, seed: int, distribution: str = "ragged"):
        import ml_dtypes

        if distribution not in self.distributions:
            raise ValueError(f"unknown distribution {distribution!r}; use one of {self.distributions}")
        if distribution == "wide":
            *floats, lengths = self.make_inputs(seed, "ragged")
            return (*wide_attention(*floats, wide_factor(seed)), lengths)
        rng = np.random.default_rng(seed)
        np_dtype = ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.dtype(self.dtype)
        temperature = 1.0
        if distribution == "tempered":
            temperature = float(np.exp(rng.uniform(*np.log(TEMPERATURES))))
        arrays = []
        for i, (shape, _) in enumerate(self.input_specs()[:3]):
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(temperature if i == 0 else 1.0)
            if distribution == "outliers":
                x = np.where(rng.random(shape) < 0.002, x * 30.0, x)
            arrays.append(x.astype(np_dtype))
        return (*arrays, self.lengths(seed, distribution))

    def small_inputs(self, seed: int, distribution: str = "ragged") -> dict[str, np.ndarray]:
        """Only the lengths: the cache need not be made (at B=32, N=131072 it is 17 GB)."""
        return {"lengths": self.lengths(seed, distribution)}

    def lengths(self, seed: int, distribution: str = "ragged") -> np.ndarray:
        """The per-sequence cache lengths of input (``distribution``, ``seed``), from their own
        random stream (cheap to recompute without the cache)."""
        if distribution == "full":
            return np.full(self.batch, self.kv_len, np.int32)
        lengths = np.random.default_rng([seed, 1]).integers(1, self.kv_len + 1, self.batch).astype(np.int32)
        lengths[0] = 1                                       # the edge cases, always present
        lengths[-1] = self.kv_len
        return lengths

    def reference(self, q, k, v, lengths):
        """f32 numpy: softmax over each sequence's first lengths[b] cache entries."""
        return self._weighted(self._softmax(q, k, lengths), v)

    def truth(self, distribution, q, k, v, lengths):
        """The truth and the size from one softmax (the judge's setup makes both for every set)."""
        p = self._softmax(q, k, lengths)
        return self._weighted(p, v), self._weighted(p, np.abs(np.asarray(v, np.float32)))

    def _weighted(self, p, v):
        v32 = np.repeat(np.asarray(v, np.float32), self.heads // self.kv_heads, axis=1)
        return np.einsum("bhtn,bhnd->bhtd", p, v32)

    def _softmax(self, q, k, lengths):
        """The attention weights, the row max subtracted before the logits are scaled (as flash
        attention's truth does, and why)."""
        group = self.heads // self.kv_heads
        q32 = np.asarray(q, np.float32)
        k32 = np.repeat(np.asarray(k, np.float32), group, axis=1)
        s = np.einsum("bhtd,bhnd->bhtn", q32, k32)
        valid = np.arange(self.kv_len)[None, :] < np.asarray(lengths)[:, None]      # (B, N)
        s = np.where(valid[:, None, None, :], s, -np.inf)
        s = (s - s.max(axis=-1, keepdims=True)) * np.float32(self.sm_scale)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        return p

    def magnitude(self, q, k, v, lengths):
        """softmax(q k^T) @ |v| over each sequence's valid entries."""
        return self.reference(q, k, np.abs(np.asarray(v, np.float32)), lengths)

    def reference_program(self):
        """The plain XLA program speedups are quoted against (jnp, f32 softmax). The query heads
        sharing a K/V head are grouped by a reshape, so the cache is never copied per head (a
        ``jnp.repeat`` of K and V would make XLA write and read the cache ``group`` times)."""
        import jax
        import jax.numpy as jnp

        b, h, t, d, hkv, n = self.batch, self.heads, self.q_len, self.head_dim, self.kv_heads, self.kv_len

        def decode(q, k, v, lengths):
            qg = q.reshape(b, hkv, h // hkv, t, d)
            s = jnp.einsum("bkgtd,bknd->bkgtn", qg, k, preferred_element_type=jnp.float32) * self.sm_scale
            valid = jax.lax.broadcasted_iota(jnp.int32, (b, 1, 1, 1, n), 4) < lengths[:, None, None, None, None]
            p = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), axis=-1)
            o = jnp.einsum("bkgtn,bknd->bkgtd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            return o.reshape(b, h, t, d).astype(q.dtype)

        return decode

    # ---- tiling ------------------------------------------------------------------------------------
    def tiling_problem(self, tunables: dict[str, int]) -> str | None:
        block, chips = tunables.get("BLOCK_KV"), tunables.get("CHIPS", 1)
        if chips != 1 and chips != self.chips:
            return (f"the kernel uses CHIPS={chips}, but the task has {self.chips} chip(s); "
                    f"run with --chips {chips} or use a 1-chip kernel")
        share = self.kv_len // chips
        if block and share > block and share % block:
            per_chip = f" ({share} per chip)" if chips > 1 else ""
            return (f"N={self.kv_len}{per_chip} cannot be tiled by the kernel's BLOCK_KV={block}; "
                    f"use an N that is a multiple of {block * chips}")
        if self.kv_len > SEQ_TILE and self.kv_len % SEQ_TILE:
            return f"N={self.kv_len} is not a multiple of {SEQ_TILE}; use a multiple of {SEQ_TILE}"
        return None

    def example_task(self, tunables: dict[str, int]) -> Task:
        """Two sequences, one K/V head with its query heads, a 256-entry cache (blocks larger than
        N are cut to N)."""
        return dataclasses.replace(self, batch=2, heads=self.heads // self.kv_heads, kv_heads=1,
                                   kv_len=min(self.kv_len, 256), dtype="float32", chips=1)

    def legal_values(self, tunable: str) -> list[int] | None:
        """KV blocks: multiples of 128 dividing N, up to 8192; KV splits: 1 to 16."""
        if tunable == "BLOCK_KV":     # a per-chip kernel cuts a block to its share (min(BLOCK_KV, share))
            n = self.kv_len
            return [v for v in range(SEQ_TILE, min(n, MAX_KV_BLOCK) + 1, SEQ_TILE) if n % v == 0]
        if tunable == "KV_SPLITS":     # split-KV: the kernel uses gcd(KV_SPLITS, its kv blocks)
            return list(KV_SPLITS)
        return None
