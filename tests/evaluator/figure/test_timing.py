"""Timing sources and the roofline, on files and numbers (the judge tests cover them end to end)."""

from __future__ import annotations

import pytest

from evaluator.chips import get_chip
from evaluator.figure.roofline import roofline
from evaluator.figure.timing import get_timing_source
from evaluator.figure.timing.compiler_estimate import read_cycles
from evaluator.figure.timing.measured import bootstrap_ci

PROFILE = 'hlo_op_estimate {{\n  hlo_op_name: "{op}"\n  estimated_cycles: {cycles}\n  ' \
          'dma_instruction_type: {dma}\n  hlo_instruction {{ estimated_cycles: 5 }}\n}}\n'


def write(tmp_path, op, cycles, dma="DMA_INSTRUCTION_TYPE_LOCAL"):
    (tmp_path / f"{op}_static_llo_profile.textproto").write_text(PROFILE.format(op=op, cycles=cycles, dma=dma))


def test_the_estimate_is_the_sum_of_every_ops_own_total(tmp_path):
    write(tmp_path, "fusion.1", 100)
    write(tmp_path, "fusion.2", 250)
    assert read_cycles(tmp_path) == (350, "")


def test_a_zero_estimate_is_no_estimate_and_says_which_op(tmp_path):
    write(tmp_path, "flash_attention.1", 0, "DMA_INSTRUCTION_TYPE_REMOTE")
    cycles, why = read_cycles(tmp_path)
    assert cycles is None and "flash_attention.1" in why and "REMOTE" in why


def test_no_profile_says_the_flag_is_missing(tmp_path):
    cycles, why = read_cycles(tmp_path / "nothing")
    assert cycles is None and "--xla_jf_dump_static_llo_profile_to" in why


def test_cycles_become_seconds_with_the_chip_clock(tmp_path):
    (tmp_path / "llo").mkdir()
    write(tmp_path / "llo", "k.1", 1_500_000)
    timing = get_timing_source("compiler_estimate").read(tmp_path, {}, get_chip("v5e"))
    assert timing.latency_s == pytest.approx(1e-3) and timing.cycles == 1_500_000


def test_bootstrap_ci_brackets_the_median():
    samples = [1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.3, 0.7, 1.0]
    lo, hi = bootstrap_ci(samples)
    assert lo <= 1.0 <= hi and lo < hi
    assert bootstrap_ci(samples) == (lo, hi)            # deterministic for a given seed


def test_measured_timing_needs_samples(tmp_path):
    timing = get_timing_source("measured").read(tmp_path, {"timing": {"samples_s": [1.0]}}, get_chip("v5e"))
    assert timing.latency_s is None and "samples" in timing.error


def test_roofline_counts_compute_and_memory():
    chip = get_chip("v5e")
    r = roofline(flops=197e12 * 1e-3, bytes_moved=819e9 * 0.5e-3, latency_s=2e-3, chip=chip)
    assert r.regime == "compute-bound"
    assert r.roofline_latency_s == pytest.approx(1e-3)
    assert r.mxu_util == pytest.approx(0.5) and r.hbm_util == pytest.approx(0.25)


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="compiler_estimate"):
        get_timing_source("stopwatch")
    with pytest.raises(ValueError, match="v5e"):
        get_chip("v9")


def test_a_figure_that_depends_on_the_data_is_the_slowest_input_sets(tmp_path):
    """Loops counted per input set (``trips.sets``) and index maps that read the data
    (``traffic.hbm_bytes_per_set``): the figure is the slowest set's, and a set that could not be
    counted refuses it. With one set, nothing changes."""
    chip, source = get_chip("v5e"), get_timing_source("compiler_estimate")
    per_cycle = chip.hbm_bytes_per_s / chip.clock_hz
    compile_ = {"hbm_bytes": 10, "hbm_data_dependent": True}
    sets = [{"cycles": 1_000, "sites": [{}]}, {"cycles": 3_000, "sites": [{}]}, {"cycles": 2_000, "sites": [{}]}]
    timing = source.read(tmp_path, {"compile": compile_, "trips": dict(sets[0], sets=sets)}, chip)
    assert timing.cycles == 3_000 and "set 2" in timing.note
    heavy = {"hbm_bytes_per_set": [10, 10, int(per_cycle * 5_000)]}     # set 3 moves 5,000 cycles of bytes
    timing = source.read(tmp_path, {"compile": compile_, "trips": dict(sets[0], sets=sets), "traffic": heavy}, chip)
    assert timing.cycles == 5_000 and timing.hbm_cycles == 5_000 and "set 3" in timing.note
    broken = sets[:2] + [{"error": "the loop at x is not linear in its trips"}]
    refused = source.read(tmp_path, {"compile": compile_, "trips": dict(sets[0], sets=broken)}, chip)
    assert refused.latency_s is None and refused.error.startswith("input set 3: the loop at x")
    alone = source.read(tmp_path, {"compile": compile_, "trips": dict(sets[0], sets=sets[:1])}, chip)
    assert alone.cycles == 1_000 and "slowest" not in alone.note


def test_a_window_the_estimate_leaves_out_is_no_figure(tmp_path):
    timing = get_timing_source("compiler_estimate").read(
        tmp_path, {"compile": {"hbm_bytes": 10, "hbm_estimate_misses": ["kernel 'k': input 1 has an element window"]}},
        get_chip("v5e"))
    assert timing.latency_s is None and "element window" in timing.error
