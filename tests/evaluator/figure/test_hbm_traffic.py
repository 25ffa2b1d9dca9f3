"""The HBM traffic model: bytes read from the kernel's own Mosaic grid, windows and index maps;
the compiler estimate never faster than that traffic at the chip's bandwidth."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.chips import get_chip
from evaluator.figure.hbm_traffic import program_traffic
from evaluator.figure.timing import get_timing_source
from mutations import get_operator
from seeds import load_seed

from .test_timing import write

SHAPE = "B=2,H=4,HKV=2,N=2048,D=128,T=1"


def _export(source: str, task):
    namespace: dict = {}
    exec(compile(source, "<kernel>", "exec"), namespace)
    specs = [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in task.input_specs()]
    fn = namespace[task.entry]
    return jax.export.export(jax.jit(lambda *a: fn(*a, **task.kernel_kwargs())), platforms=["tpu"])(*specs)


@pytest.fixture(scope="module")
def decode():
    seed = load_seed("flash_decoding")
    return seed, seed.task(SHAPE)


def _cache_bytes(task, entries_per_sequence) -> int:
    """K and V bytes for the given number of cache entries per sequence, for every K/V head."""
    return 2 * task.kv_heads * task.head_dim * 2 * int(np.sum(entries_per_sequence))


def test_the_naive_kernel_reads_each_kv_block_once_per_query_head(decode):
    seed, task = decode
    traffic = program_traffic(_export(seed.kernel_source, task))
    group = task.heads // task.kv_heads
    q_and_o = 2 * task.batch * task.heads * task.q_len * task.head_dim * 2
    assert not traffic.blind and traffic.notes == ()
    assert traffic.kernel_bytes == group * _cache_bytes(task, [task.kv_len] * task.batch) + q_and_o


def test_grouped_heads_read_each_kv_block_once(decode):
    seed, task = decode
    grouped = get_operator("grouped_heads").apply(seed.kernel_source, task, random.Random(0))
    assert grouped.applied
    traffic = program_traffic(_export(grouped.source, task))
    q_and_o = 2 * task.batch * task.heads * task.q_len * task.head_dim * 2
    assert traffic.kernel_bytes == _cache_bytes(task, [task.kv_len] * task.batch) + q_and_o


def test_clamped_index_maps_are_evaluated_on_the_real_lengths(decode):
    seed, task = decode
    clamped = get_operator("length_skip").apply_params(seed.kernel_source, task, {"compute": False})
    assert clamped.applied
    exported = _export(clamped.source, task)
    lengths = np.array([1, 1100], np.int32)
    block_bytes = 512 * task.head_dim * 2        # the seed's BLOCK_KV, bf16
    # Sequence 0 needs block 0 only, and its index stays 0 from one query head of a group to the
    # next: one fetch per K/V head (2). Sequence 1 needs blocks 0, 1, 2 (then 2 again: no fetch),
    # and query heads move between them: 3 fetches per query head (4 x 3). K and V alike.
    fetches = 2 * 1 + 4 * 3
    q_and_o = 2 * task.batch * task.heads * task.q_len * task.head_dim * 2
    traffic = program_traffic(exported, lambda i: lengths)
    assert traffic.kernel_bytes == 2 * fetches * block_bytes + q_and_o
    # Unknown lengths: every step counts as a fetch (an upper bound), and a note says so.
    unknown = program_traffic(exported, None)
    group = task.heads // task.kv_heads
    assert unknown.kernel_bytes == group * _cache_bytes(task, [task.kv_len] * task.batch) + q_and_o
    assert unknown.notes and "upper bound" in unknown.notes[0]


def test_a_kernel_that_moves_hbm_data_itself_is_blind():
    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm, buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...] * 2

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA])(x)

    exported = jax.export.export(jax.jit(f), platforms=["tpu"])(jax.ShapeDtypeStruct((8, 128), jnp.float32))
    traffic = program_traffic(exported)
    assert traffic.blind and "memory_space=ANY" in traffic.notes[0]


def test_the_estimate_is_never_faster_than_the_hbm_traffic(tmp_path):
    (tmp_path / "llo").mkdir()
    write(tmp_path / "llo", "k.1", 1_000)
    chip = get_chip("v5e")
    source = get_timing_source("compiler_estimate")
    moved = int(chip.hbm_bytes_per_s / chip.clock_hz * 5_000)          # 5,000 cycles of traffic
    timing = source.read(tmp_path, {"compile": {"hbm_bytes": moved}}, chip)
    assert (timing.compute_cycles, timing.hbm_cycles, timing.cycles) == (1_000, 5_000, 5_000)
    small = source.read(tmp_path, {"compile": {"hbm_bytes": 10}}, chip)
    assert small.cycles == 1_000 and small.hbm_cycles == 1


def test_ops_without_an_estimate_are_refused_unless_the_program_is_trusted(tmp_path):
    (tmp_path / "llo").mkdir()
    write(tmp_path / "llo", "fusion.1", 1_000)
    write(tmp_path / "llo", "fusion.2", 0, "DMA_INSTRUCTION_TYPE_REMOTE")
    chip, source = get_chip("v5e"), get_timing_source("compiler_estimate")
    candidate = source.read(tmp_path, {"compile": {"hbm_bytes": 10**9}}, chip)
    assert candidate.latency_s is None and "fusion.2" in candidate.error
    reference = source.read(tmp_path, {"compile": {"hbm_bytes": 10**9, "trusted": True}}, chip)
    assert reference.cycles == reference.hbm_cycles > 1_000 and "fusion.2" in reference.note


def test_blind_traffic_is_no_figure(tmp_path):
    (tmp_path / "llo").mkdir()
    write(tmp_path / "llo", "k.1", 1_000)
    timing = get_timing_source("compiler_estimate").read(
        tmp_path, {"compile": {"hbm_bytes": 0, "hbm_blind": True, "hbm_notes": ["input 0 stays in HBM"]}},
        get_chip("v5e"))
    assert timing.latency_s is None and "input 0 stays in HBM" in timing.error


def test_a_kernel_without_a_grid_moves_each_operand_once():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    exported = jax.export.export(jax.jit(f), platforms=["tpu"])(jax.ShapeDtypeStruct((64, 128), jnp.float32))
    traffic = program_traffic(exported)
    assert not traffic.blind and traffic.kernel_bytes == 2 * 64 * 128 * 4


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _rows(index_map, *, element: bool = False, rows: int = 32, block: int = 8, grid: int = 4) -> int:
    """Kernel bytes of a copy of ``rows`` x 128 f32 whose input is read through ``index_map``."""
    shape = (pl.Element(block), pl.Element(128)) if element else (block, 128)

    def f(x):
        return pl.pallas_call(_copy, grid=(grid,), in_specs=[pl.BlockSpec(shape, index_map)],
                              out_specs=pl.BlockSpec((block, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((block * grid, 128), x.dtype))(x)

    exported = jax.export.export(jax.jit(f), platforms=["tpu"])(jax.ShapeDtypeStruct((rows, 128), jnp.float32))
    traffic = program_traffic(exported)
    assert not traffic.blind and traffic.notes == (), traffic.notes
    return traffic.kernel_bytes


def test_element_windows_are_read_as_element_offsets():
    """``pl.Element`` dims take element offsets from the index map, not block indices: the same
    copy written with element windows moves the same bytes as with blocks (it was charged one
    block: every offset past the first read as an out-of-range block index, 0 bytes)."""
    plain = _rows(lambda i: (i, 0))
    assert plain == 2 * 32 * 128 * 4
    assert _rows(lambda i: (i * 8, 0), element=True) == plain
    assert _rows(lambda i: (i * 4, 0), element=True) == plain       # overlapping windows: each fetched


def test_index_arithmetic_wraps_as_int32_does_on_the_chip():
    """An index map that adds (i + 1) * 2**32 (0 in int32, on the chip and in the interpreter)
    reads the same blocks as the plain one; unbounded integers called them out of range."""
    plain = _rows(lambda i: (i, 0))
    assert _rows(lambda i: (i + (i + 1) * 65536 * 65536, 0)) == plain
    assert _rows(lambda i: ((i + 1) * 65536 * 65536 + i * 8, 0), element=True) == plain


def test_an_out_of_range_block_is_never_free():
    """A block index past the array is clamped, as the interpreter's slice clamps it: the block
    the kernel was checked with is the block counted (it was 0 bytes)."""
    block = 8 * 128 * 4
    out = 4 * block
    assert _rows(lambda i: (i + 4, 0)) == out + block                 # every step the last block, fetched once
    # indices 0, 4, 7, 11: 4, 7 and 11 are all the last block (3), fetched once after block 0
    assert _rows(lambda i: (4 * jax.lax.rem(i, 2) + 7 * jax.lax.div(i, 2), 0)) == out + 2 * block
    assert _rows(lambda i: (i - 8, 0)) == out + block                 # below zero: the first block


def test_unsigned_and_truncating_ops_follow_their_types():
    from evaluator.figure import index_maps as h

    assert h._wrap(2 ** 32 + 5, 32) == 5 and h._wrap(2 ** 31, 32) == -2 ** 31 and h._wrap(3, 1) == 1
    assert h._BINARY["arith.divui"](-1, 2, 32) == (2 ** 32 - 1) // 2          # -1 read as 2**32 - 1
    assert h._BINARY["arith.divsi"](-7, 2, 32) == -3 and h._BINARY["arith.remsi"](-7, 2, 32) == -1
    assert h._BINARY["arith.floordivsi"](-7, 2, 32) == -4
    assert h._BINARY["arith.maxui"](-1, 5, 32) == -1 and h._BINARY["arith.minsi"](-1, 5, 32) == -1
    assert h._BINARY["arith.shrui"](-8, 1, 32) == (2 ** 32 - 8) >> 1
    less, unsigned = h._CMP[6]                                               # ult
    assert unsigned and less(h._unsigned(5, 32), h._unsigned(-1, 32))
    with pytest.raises(h._Unknown):
        h._BINARY["arith.shli"](1, 40, 32)                                   # poison: refused, not guessed


def test_an_output_that_comes_back_to_a_block_is_read_back_only_where_declared():
    """Out blocks 0, 1, 0, 1: each change writes a block back (4). Declared
    ``RevisitMode.ANY``, the pipeline also reads a block back when it returns to it (2 more)."""
    def f(x, mode):
        return pl.pallas_call(_copy, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (jax.lax.rem(i, 2), 0), pipeline_mode=mode),
                              out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype))(x)

    block = 8 * 128 * 4
    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    for mode, blocks in ((None, 1 + 4), (pl.Buffered(1, revisit=pl.RevisitMode.ANY), 1 + 4 + 2)):
        exported = jax.export.export(jax.jit(lambda x, m=mode: f(x, m)), platforms=["tpu"])(spec)
        assert program_traffic(exported).kernel_bytes == blocks * block


def test_index_maps_on_prefetch_the_program_computes_are_walked_on_its_counted_values():
    """A prefetch operand worked out in the program (megablox's group metadata) is unknown to the
    model, which counts a fetch at every step (an upper bound); given its values as the counting
    run computed them (``dynamic_grid.with_data``), the walk is exact."""
    def fn(x):
        idx = jnp.zeros((4,), jnp.int32) + (x[0, 0] > 1e30).astype(jnp.int32)     # data: all 0 here
        return pl.pallas_call(
            lambda idx_ref, x_ref, o_ref: _copy(x_ref, o_ref), out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, idx: (0, 0))))(idx, x)

    exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(jax.ShapeDtypeStruct((32, 128), jnp.float32))
    block = 8 * 128 * 4
    unknown = program_traffic(exported)
    assert unknown.kernel_bytes == 4 * block + block and "upper bound" in " ".join(unknown.notes)
    walked = program_traffic(exported, prefetch=[[np.zeros(4, np.int32)]])
    assert walked.kernel_bytes == block + block and walked.data_dependent
