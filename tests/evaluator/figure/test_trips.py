"""Loops and branches on data, counted on the timing input (``evaluator/figure/trips.py``): which are
sites, what the interpreted run counts, which variants the figure is made of, and the judge's
figure for a loop bounded by scalar prefetch against the same loop with a constant bound."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from evaluator.figure import trips
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from seeds.flash_attention.task import AttentionTask
from tests.judging import judge_all

LOOP = Path(__file__).resolve().parents[1] / "adversarial" / "candidates" / "c5_prefetch_loop_bound.py"


def ragged_loop(lens, x):
    """Grid step i adds x's block to itself lens[i] times: trips read from scalar prefetch."""
    def kernel(lens_ref, x_ref, o_ref):
        def body(_, acc):
            return acc + x_ref[...]
        o_ref[...] = jax.lax.fori_loop(0, lens_ref[pl.program_id(0)], body, jnp.zeros_like(x_ref[...]))

    spec = pl.BlockSpec((8, 128), lambda i, lens: (i, 0))
    return pl.pallas_call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(lens.shape[0],), in_specs=[spec], out_specs=spec),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(lens, x)


def guarded(flags, x):
    """A branch on data (a prefetched flag) and one on the grid index (not a site)."""
    def kernel(flags_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(flags_ref[pl.program_id(0)] > 0)
        def _():
            o_ref[...] = x_ref[...] * 2.0

        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] += 1.0

    spec = pl.BlockSpec((8, 128), lambda i, flags: (i, 0))
    return pl.pallas_call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(flags.shape[0],), in_specs=[spec], out_specs=spec),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(flags, x)


def counted(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    outs, counts = jax.jit(trips.counting_program(closed))(*args)
    return closed, outs, trips.site_counts(trips.kernel_sites(closed), counts)


def test_a_loop_bounded_by_prefetch_is_a_site_and_a_branch_on_the_grid_index_is_not():
    lens, x = jnp.asarray([1, 2], jnp.int32), jnp.ones((16, 128), jnp.float32)
    assert [s.kind for s in trips.kernel_sites(jax.make_jaxpr(ragged_loop)(lens, x))[0]] == ["while"]
    found = trips.kernel_sites(jax.make_jaxpr(guarded)(lens, x))[0]
    assert [(s.kind, s.arms) for s in found] == [("cond", 2)]     # the program_id guard is not one


def test_the_interpreted_run_counts_every_trip_and_every_arm_and_computes_the_same():
    lens = jnp.asarray([1, 2, 3, 6], jnp.int32)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((32, 128)), jnp.float32)
    _, outs, [loop] = counted(ragged_loop, lens, x)
    assert loop.counts == (4, 12, 1 + 4 + 9 + 36) and loop.mean == 3.0 and loop.base == 3 and loop.moves() == []
    assert not loop.uniform and loop.linear_check      # uneven trips: the mean stands for them if linear
    want = np.asarray(x).reshape(4, 8, 128) * np.asarray(lens)[:, None, None]
    assert np.allclose(np.asarray(outs).reshape(4, 8, 128), want)
    flags = jnp.asarray([1, 0, 1, 1], jnp.int32)
    _, outs, [branch] = counted(guarded, flags, x)
    assert branch.counts == (1, 3) and branch.base == 1 and branch.moves() == [(0, 0.25)]
    assert np.allclose(np.asarray(outs)[8:16], np.asarray(x)[8:16])


def test_the_plan_moves_each_site_once_and_the_figure_interpolates():
    lens = jnp.asarray([1, 2, 2, 3], jnp.int32)       # 2 trips per entry: the base alone
    x = jnp.ones((32, 128), jnp.float32)
    closed, _, sites = counted(ragged_loop, jnp.asarray([1, 2, 3, 4], jnp.int32), x)   # 2.5 trips
    base, variants = trips.plan(sites)
    assert list(base.values()) == [2] and [(list(c.values()), w) for c, w in variants] == [([3], 0.5)]
    assert trips.combine(100, [(140, 0.5)]) == 120 and trips.combine(100, []) == 100
    assert trips.plan(counted(ragged_loop, lens, x)[2])[1] == []
    # A variant is static: its kernel holds no while loop, and it traces for the chip's program.
    variant = jax.make_jaxpr(trips.variant_program(closed, base))(jnp.asarray([1, 2, 3, 4], jnp.int32), x)
    kernel = next(e for e in variant.jaxpr.eqns if e.primitive.name == "pallas_call").params["jaxpr"]
    assert "while" not in str(kernel) and trips.sites(kernel) == []


@pytest.fixture(scope="module")
def loop_figures(tmp_path_factory):
    """The loop bounded by scalar prefetch and the same loop with a constant bound, 2 and 4 trips."""
    judge = Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("trips")), workers=2))
    task = AttentionTask(batch=1, heads=2, seq_len=512, head_dim=128)
    source = LOOP.read_text()
    variants = {(trips_, bound): source.replace("BLOCK_KV = 128", f"BLOCK_KV = {512 // trips_}").replace(
        "BOUND_FROM_PREFETCH = True", f"BOUND_FROM_PREFETCH = {bound}") for trips_ in (2, 4) for bound in (True, False)}
    results = judge_all(judge, list(variants.values()), task)
    return dict(zip(variants, results, strict=True))


@pytest.mark.parametrize("trips_", [2, 4])
def test_a_loop_bounded_by_data_costs_its_real_trips(loop_figures, trips_):
    data, constant = loop_figures[(trips_, True)], loop_figures[(trips_, False)]
    assert data.status is Status.PASS and constant.status is Status.PASS, (data.error, constant.error)
    assert abs(data.metrics.estimated_cycles / constant.metrics.estimated_cycles - 1) < 0.10
    assert data.provenance.timing_source.endswith("+trips")
    # and more trips cost more: the figure follows the data, not a guess of 30-40 trips
    if trips_ == 4:
        assert data.metrics.estimated_cycles > loop_figures[(2, True)].metrics.estimated_cycles


def nested_loops(lens, x):
    """Grid step i runs lens[i] outer trips; outer trip t runs t + 1 inner trips (bounded by the
    outer loop's induction variable, not by data)."""
    def kernel(lens_ref, x_ref, o_ref):
        def outer(t, acc):
            return jax.lax.fori_loop(0, t + 1, lambda _, a: a + x_ref[...], acc)
        o_ref[...] = jax.lax.fori_loop(0, lens_ref[pl.program_id(0)], outer, jnp.zeros_like(x_ref[...]))

    spec = pl.BlockSpec((8, 128), lambda i, lens: (i, 0))
    return pl.pallas_call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(lens.shape[0],), in_specs=[spec], out_specs=spec),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(lens, x)


def test_a_loop_fed_by_a_counted_loop_is_counted_and_nested_sites_are_weighed_together():
    """The inner loop's bound is no data, but in a variant the outer loop runs made-up trips, so
    the estimate would simulate the inner one on those: it is a site. Its entries are the outer
    loop's trips; the figure's variants include the one moving both."""
    lens = jnp.asarray([0, 0, 1, 4], jnp.int32)        # nearly all the work in one entry of four
    x = jnp.ones((32, 128), jnp.float32)
    closed, outs, (outer, inner) = counted(nested_loops, lens, x)
    assert inner.site.path[:len(outer.site.path)] == outer.site.path
    assert outer.counts == (4, 5, 1 + 16) and not outer.uniform       # 0, 0, 1, 4 trips
    assert inner.counts == (5, 1 + (1 + 2 + 3 + 4), 1 + (1 + 4 + 9 + 16))   # entered once per outer trip
    assert np.asarray(outs)[24:].tolist() == np.full((8, 128), 10.0).tolist()
    base, variants = trips.plan([outer, inner])
    assert list(base.values()) == [1, 2]
    assert [(tuple(c.values()), round(w, 6)) for c, w in variants] == [((2, 2), 0.25), ((2, 3), 0.05), ((1, 3), 0.2)]
    # A cost linear in the work actually done (a per entry, b per outer trip, c per inner trip,
    # summed over the grid) is recovered exactly from the variants, the mixed one included.
    a, b, c = 100, 10, 3

    def cost(choice):                 # every entry runs o outer trips, each i inner trips
        o, i = choice[outer.key], choice[inner.key]
        return 4 * (a + b * o + c * o * i)

    moved = [(cost(ch), w) for ch, w in variants]
    nested = trips._sub_chains(trips.chains([outer, inner]))
    assert trips.combine(cost(base), moved, nested) == 4 * a + b * 5 + c * 11
    assert trips.combine(cost(base), moved) != 4 * a + b * 5 + c * 11     # weighed apart, it is not


def test_a_cost_not_linear_in_uneven_trips_is_refused_naming_the_loop():
    lens, x = jnp.asarray([0, 0, 0, 4], jnp.int32), jnp.ones((32, 128), jnp.float32)
    closed, _, sites = counted(ragged_loop, lens, x)
    found = trips.kernel_sites(closed)
    counts = [np.asarray([4, 4, 16], np.int32)]

    def convex(choice):              # each trip costs more than the last
        k = next(iter(choice.values()))
        return 1000 + 100 * k * k

    with pytest.raises(trips.Uncountable, match="not linear in its trips"):
        trips.figure(found, counts, convex)
    linear = trips.figure(found, counts, lambda ch: 1000 + 100 * next(iter(ch.values())))
    assert linear["cycles"] == 1000 + 100 * 1 and linear["linear_checks"]
