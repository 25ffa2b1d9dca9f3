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
from evaluator.hbm_traffic import program_traffic
from evaluator.timing import get_timing_source
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
