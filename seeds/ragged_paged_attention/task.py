"""The trusted half of the ragged paged attention seed: a serving step over a paged KV cache.

A built-in seed (``--seed ragged_paged_attention``), judged on v6e unless --chip says otherwise
(``default_chip``): libtpu 0.0.42.1's static profiler refuses the kernel's DMAs on v5e
("Unsupported DMA direction: 10 on VL/VLP").

The problem vLLM's TPU backend runs every step (JAX's ``ragged_paged_attention``): a batch of
sequences, each with its own KV cache length, whose K and V live in fixed-size pages of one shared
pool (``kv_pages``: K and V of each KV head interleaved, K at even and V at odd combined heads),
found through a page table. The batch is mixed: ``S`` decode sequences (one query token each,
attending to their whole cache) and, with ``PREFILL=n``, one more sequence that prefills its
last ``n`` tokens causally against the longest cache. Default: a Llama-3.1-8B layer (32 query
heads, 8 KV heads, D=128, bf16) on pages of 32 tokens, caches up to 512 tokens, 32 decode
sequences and a 480-token prefill chunk: 512 tokens in the step, a case the module's own tuned
table holds for v6e (16 KV pages and 32 queries per block).

The work that counts is each sequence's valid cache, read once (FLOPs and unavoidable bytes of
the judge's timing input, ``measured_on``). Nothing here is ever taken from a candidate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from seeds import WIDE, SeedTask, check_positive_ints, parse_shape, wide_attention, wide_factor

TOLERANCES = {"bfloat16": (2e-2, 2e-2), "float32": (2e-4, 2e-4)}
TEMPERATURES = (0.25, 16.0)
_SHAPE_KEYS = {"S": "seqs", "PREFILL": "prefill", "HQ": "q_heads", "HKV": "kv_heads", "D": "head_dim",
               "PAGE": "page", "LEN": "max_len"}
# The module's block sizes (its tunables here): KV pages per block and query tokens per block.
BLOCK_TUNABLES = ("NUM_KV_PAGES_PER_BLOCK", "NUM_QUERIES_PER_BLOCK")


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    """q (T, HQ, D); kv_pages (P, PAGE, 2 HKV, D); kv_lens (S'); page_indices (S', LEN/PAGE);
    cu_q_lens (S'+1); num_seqs (1,): S' = S decode sequences (+1 with a prefill chunk)."""

    name = "ragged_paged_attention"
    description = ("ragged paged attention: a mixed prefill-and-decode serving step over a paged KV "
                   "cache (JAX's / vLLM's TPU kernel); memory-bound")
    entry = "ragged_paged_attention"
    input_names = ("q", "kv_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
    shape_grammar = "S=32,PREFILL=480,HQ=32,HKV=8,D=128,PAGE=32,LEN=512"
    # ragged: decode lengths drawn in 1..LEN with 1 and LEN always present (the prefill sequence
    # has the longest cache); the page table a random permutation of the pool. outliers / tempered
    # as for flash attention; wide: the ragged draw of the same seed (lengths and page table too),
    # its logits and V scaled as flash attention's (seeds._contract.wide_attention). Repeating the
    # first set's seed, it is the timing input scaled: it adds no work a figure could follow.
    distributions = ("ragged", "outliers", "tempered", "wide")
    correctness_inputs = (("ragged", 0), ("outliers", 1), ("tempered", 2), WIDE)
    # The module's own source (``--start jax``): its code, for operators to rewrite; traced as on the
    # judged chip, it looks its block sizes up in its own tuned table, as on a TPU.
    starts = {"jax": "jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel"}
    peers = {"JAX ragged_paged_attention (tuned blocks)": "../../examples/jax_ragged_paged_attention_tuned.py"}
    default_chip = "v6e"
    test_tasks = {"small": ("S=3,PREFILL=13,HQ=8,HKV=2,D=128,PAGE=16,LEN=64", {})}

    seqs: int = 32
    prefill: int = 480
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page: int = 32
    max_len: int = 512
    dtype: str = "bfloat16"
    timed_lens: tuple[int, ...] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_positive_ints(self, ("seqs", "q_heads", "kv_heads", "head_dim", "page", "max_len"))
        if self.prefill < 0 or self.prefill > self.max_len:
            raise ValueError(f"PREFILL={self.prefill} must be in 0..LEN={self.max_len}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"HQ={self.q_heads} must be a multiple of HKV={self.kv_heads}")
        if self.max_len % self.page:
            raise ValueError(f"LEN={self.max_len} must be a multiple of PAGE={self.page}")
        if self.dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {', '.join(TOLERANCES)}, got {self.dtype!r}")

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        unknown = set(options) - {"dtype"}
        if unknown:
            raise ValueError(f"ragged_paged_attention takes no option {', '.join(sorted(unknown))}; "
                             "its option is dtype")
        fields = parse_shape(shape, _SHAPE_KEYS, cls.shape_grammar)
        return cls(**fields, **{k: v for k, v in options.items() if v is not None})

    # ---- identity and work ---------------------------------------------------------------------
    @property
    def key(self) -> str:
        return (f"ragged_paged_attention/S{self.seqs}-PREFILL{self.prefill}-HQ{self.q_heads}-HKV{self.kv_heads}"
                f"-D{self.head_dim}-PAGE{self.page}-LEN{self.max_len}-{self.dtype}")

    @property
    def num_seqs(self) -> int:
        return self.seqs + (1 if self.prefill else 0)

    @property
    def q_lens(self) -> np.ndarray:
        return np.array([1] * self.seqs + ([self.prefill] if self.prefill else []), np.int32)

    @property
    def tokens(self) -> int:
        return int(self.q_lens.sum())

    @property
    def pages_per_seq(self) -> int:
        return self.max_len // self.page

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4

    def kv_lens(self, seed: int, distribution: str = "ragged") -> np.ndarray:
        """Each sequence's cache length (its own random stream): decode lengths in 1..LEN with 1
        and LEN present; the prefill sequence's is LEN."""
        lens = np.random.default_rng([seed, 1]).integers(1, self.max_len + 1, self.num_seqs).astype(np.int32)
        lens[-1] = self.max_len                  # the longest (the prefill sequence's, if any)
        if self.seqs > 1:
            lens[0], lens[self.seqs - 1] = 1, self.max_len
        return lens

    @property
    def timing_lens(self) -> np.ndarray:
        if self.timed_lens is not None:
            return np.asarray(self.timed_lens, np.int32)
        distribution, seed = self.correctness_inputs[0]
        return self.kv_lens(seed, distribution)

    def measured_on(self, arrays):
        return dataclasses.replace(self, timed_lens=tuple(int(x) for x in arrays["kv_lens"])) \
            if "kv_lens" in arrays else self

    @property
    def flops(self) -> float:
        """Two matmuls per (query token, key it may see): a decode token sees its whole cache, a
        prefill token the cache up to its own position."""
        seen = 0
        for n, t in zip(self.timing_lens, self.q_lens, strict=True):
            seen += sum(int(n) - int(t) + i + 1 for i in range(int(t)))
        return 4.0 * self.q_heads * self.head_dim * seen

    @property
    def bytes_moved(self) -> float:
        """Each sequence's valid cache read once (K and V), q read and the output written once."""
        cache = 2 * self.kv_heads * self.head_dim * int(self.timing_lens.sum())
        return float((cache + 2 * self.tokens * self.q_heads * self.head_dim) * self.itemsize)

    @property
    def tolerance(self) -> tuple[float, float]:
        return TOLERANCES[self.dtype]

    # ---- the contract's calls --------------------------------------------------------------------
    def input_specs(self):
        pages = self.num_seqs * self.pages_per_seq
        return [((self.tokens, self.q_heads, self.head_dim), self.dtype),
                ((pages, self.page, 2 * self.kv_heads, self.head_dim), self.dtype),
                ((self.num_seqs,), "int32"), ((self.num_seqs, self.pages_per_seq), "int32"),
                ((self.num_seqs + 1,), "int32"), ((1,), "int32")]

    def kernel_kwargs(self) -> dict[str, Any]:
        return {"sm_scale": self.sm_scale}

    def small_inputs(self, seed: int, distribution: str = "ragged") -> dict[str, np.ndarray]:
        """The integers alone (the pool of pages need not be made)."""
        return dict(zip(self.input_names[2:], self._integers(seed, distribution), strict=True))

    def _integers(self, seed: int, distribution: str):
        table = np.random.default_rng([seed, 2]).permutation(self.num_seqs * self.pages_per_seq)
        cu = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        return (self.kv_lens(seed, distribution), table.reshape(self.num_seqs, self.pages_per_seq).astype(np.int32),
                cu, np.array([self.num_seqs], np.int32))

    def make_inputs(self, seed: int, distribution: str = "ragged"):
        import ml_dtypes

        if distribution not in self.distributions:
            raise ValueError(f"unknown distribution {distribution!r}; use one of {self.distributions}")
        if distribution == "wide":
            return self._wide(seed)
        rng = np.random.default_rng(seed)
        np_dtype = ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.dtype(self.dtype)
        temperature = float(np.exp(rng.uniform(*np.log(TEMPERATURES)))) if distribution == "tempered" else 1.0
        arrays = []
        for i, (shape, _) in enumerate(self.input_specs()[:2]):
            x = rng.standard_normal(shape, dtype=np.float32) * np.float32(temperature if i == 0 else 1.0)
            if distribution == "outliers":
                x = np.where(rng.random(shape) < 0.002, x * 30.0, x)
            arrays.append(x.astype(np_dtype))
        return (*arrays, *self._integers(seed, distribution))

    def _wide(self, seed: int):
        """The ragged draw of ``seed`` with its logits and V scaled (K at the pool's even combined
        heads, V at its odd ones)."""
        q, kv_pages, *integers = self.make_inputs(seed, "ragged")
        q, k, v = wide_attention(q, kv_pages[:, :, 0::2], kv_pages[:, :, 1::2], wide_factor(seed))
        kv_pages = kv_pages.copy()
        kv_pages[:, :, 0::2], kv_pages[:, :, 1::2] = k, v
        return (q, kv_pages, *integers)

    def _attention(self, q, kv_pages, kv_lens, page_indices, cu_q_lens, v_map=None):
        group = self.q_heads // self.kv_heads
        q32, pool = np.asarray(q, np.float32), np.asarray(kv_pages, np.float32)
        out = np.zeros(q32.shape, np.float32)
        for i in range(self.num_seqs):
            n, lo, hi = int(kv_lens[i]), int(cu_q_lens[i]), int(cu_q_lens[i + 1])
            cache = pool[np.asarray(page_indices[i])].reshape(-1, 2 * self.kv_heads, self.head_dim)[:n]
            k = np.repeat(cache[:, 0::2], group, axis=1)
            v = np.repeat(cache[:, 1::2], group, axis=1)
            v = v_map(v) if v_map else v
            s = np.einsum("qhd,khd->hqk", q32[lo:hi], k)
            pos = n - (hi - lo) + np.arange(hi - lo)                    # each query token's position
            s = np.where(np.arange(n)[None, None, :] <= pos[None, :, None], s, -np.inf)
            # the row max subtracted before the scale, as flash attention's truth does (and why)
            p = np.exp((s - s.max(axis=-1, keepdims=True)) * np.float32(self.sm_scale))
            out[lo:hi] = np.einsum("hqk,khd->qhd", p / p.sum(axis=-1, keepdims=True), v)
        return out

    def reference(self, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        """f32 numpy: each sequence's query tokens against its own pages, causal at their positions."""
        return self._attention(q, kv_pages, kv_lens, page_indices, cu_q_lens)

    def magnitude(self, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        return self._attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, v_map=np.abs)

    def reference_program(self):
        """The plain XLA program: every sequence's pages read whole, masked attention (f32
        softmax), one sequence after another (their number and query lengths are the task's)."""
        import jax
        import jax.numpy as jnp

        group, hkv, d = self.q_heads // self.kv_heads, self.kv_heads, self.head_dim
        q_lens, n_max, pages = [int(t) for t in self.q_lens], self.max_len, self.pages_per_seq

        def attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
            outs, start = [], 0
            for i, t in enumerate(q_lens):
                # page by page (dynamic slices): libtpu 0.0.42.1's static profiler refuses the
                # gather that kv_pages[page_indices[i]] becomes ("Unsupported DMA direction")
                cache = jnp.concatenate([jax.lax.dynamic_index_in_dim(kv_pages, page_indices[i, j], keepdims=False)
                                         for j in range(pages)], axis=0).reshape(n_max, 2 * hkv, d)
                k, v = cache[:, 0::2], cache[:, 1::2]
                qi = q[start:start + t].reshape(t, hkv, group, d)
                s = jnp.einsum("tkgd,nkd->kgtn", qi, k, preferred_element_type=jnp.float32) * self.sm_scale
                pos = kv_lens[i] - t + jax.lax.broadcasted_iota(jnp.int32, (1, 1, t, n_max), 2)
                keys = jax.lax.broadcasted_iota(jnp.int32, (1, 1, t, n_max), 3)
                s = jnp.where(keys <= pos, s, -jnp.inf)
                p = jax.nn.softmax(s, axis=-1)
                o = jnp.einsum("kgtn,nkd->tkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
                outs.append(o.reshape(t, hkv * group, d).astype(q.dtype))
                start += t
            return jnp.concatenate(outs, axis=0)

        return attention

    def looked_up(self, tunable: str) -> int | None:
        """The module's tuned table's entry for this problem on v6e (read from the installed
        package at run time, as its own lookup keys it; the module's defaults where the table has
        none), clamped as the module clamps them."""
        if tunable not in BLOCK_TUNABLES:
            return None
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned

        dtype = jnp.dtype(self.dtype)
        q_heads, kv_heads = rpa.get_min_heads_per_blk(self.q_heads, 2 * self.kv_heads, dtype, dtype)
        key = tuned.simplify_key((dtype, dtype, q_heads, kv_heads // 2, self.head_dim, self.page, self.tokens,
                                  self.pages_per_seq))
        kv_blk, q_blk = tuned.TUNED_BLOCK_SIZES.get("TPU v6", {}).get(key, (128, 32))
        return min(self.pages_per_seq, kv_blk) if tunable == BLOCK_TUNABLES[0] else min(self.tokens, q_blk)

    def legal_values(self, tunable: str) -> list[int] | None:
        if tunable == "NUM_KV_PAGES_PER_BLOCK":
            return [p for p in (1, 2, 4, 8, 16, 32, 64, 128) if p <= self.pages_per_seq]
        if tunable == "NUM_QUERIES_PER_BLOCK":
            return [q for q in (8, 16, 32, 64, 128, 256) if q <= max(8, self.tokens)]
        return None


RaggedPagedAttentionTask = Task
