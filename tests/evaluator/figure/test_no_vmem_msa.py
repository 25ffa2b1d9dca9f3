"""``compiler_estimate_no_vmem_msa``: the compiler estimate with XLA's VMEM memory-space assignment
off, for a task whose programs hold VMEM-to-SMEM copies libtpu's profiler aborts on (the grouped
matmul's XLA ``ragged_dot``), labelled apart from ``compiler_estimate``; and megablox.gmm judged
under it as ``scripts/grouped_vs_megablox.py`` judges it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from evaluator.containment.sandbox import ChildOutcome
from evaluator.correctness.verdicts import failure
from evaluator.figure.timing import get_timing_source, timing_choices
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "grouped_vs_megablox.py"
TINY = "M=256,K=256,N=256,E=4"


def test_it_is_a_source_of_its_own_with_its_own_label():
    plain, off = get_timing_source("compiler_estimate"), get_timing_source("compiler_estimate_no_vmem_msa")
    assert "compiler_estimate_no_vmem_msa" in timing_choices()
    assert off.label != plain.label and off.label.startswith(plain.label)     # never compared with it
    env = off.worker_env(Path("/scratch"))["LIBTPU_INIT_ARGS"].split()
    assert env == [*plain.worker_env(Path("/scratch"))["LIBTPU_INIT_ARGS"].split(),
                   "--xla_vf_vmem_memory_space_assignment=false"]


def test_a_profiler_abort_on_a_vmem_to_smem_copy_names_the_source_that_estimates_it():
    aborted = ChildOutcome((), -signal.SIGABRT, None,
                           "F1127 llo_dumper.cc:1585] Static LLO profiling of gmm.1 failed: INVALID_ARGUMENT: "
                           "Unsupported DMA direction: 10 on VL/VLP\n", 0, 1.0)
    status, _, why = failure(aborted, {}, 60.0)
    assert status is Status.FAIL_TIMING and "--timing compiler_estimate_no_vmem_msa" in why
    other = ChildOutcome((), -signal.SIGABRT, None, "Static LLO profiling of k.1 failed: INTERNAL: x\n", 0, 1.0)
    assert "no_vmem_msa" not in failure(other, {}, 60.0)[2]


@pytest.fixture(scope="module")
def grouped():
    from seeds import load_seed

    seed = load_seed("grouped_matmul")
    return seed, seed.task(TINY)


def test_ragged_dot_has_a_figure_only_with_the_assignment_off(grouped, tmp_path):
    """The reason the source exists, on the real compiler: XLA's ragged_dot aborts libtpu's profiler
    under the plain estimate, and is estimated with the assignment off."""
    _, task = grouped
    judges = {name: Judge(JudgeConfig(timing=name, workers=1, cache_dir=str(tmp_path / name)))
              for name in ("compiler_estimate", "compiler_estimate_no_vmem_msa")}
    figures = {name: judge.estimate_timing(None, task)[0] for name, judge in judges.items()}
    assert figures["compiler_estimate"].cycles is None
    assert figures["compiler_estimate_no_vmem_msa"].cycles > 0


def test_megablox_is_judged_under_it_from_the_installed_module(grouped, tmp_path):
    """JAX's megablox.gmm, read from the installed package: its metadata's VMEM-to-SMEM copies
    estimated, its grid (a size worked out from the group sizes) counted on the data, correct."""
    _, task = grouped
    source = SCRIPT.read_text().split("TEMPLATE = '''", 1)[1].split("'''", 1)[0].format(tm=128, tk=128, tn=128)
    judge = Judge(JudgeConfig(timing="compiler_estimate_no_vmem_msa", workers=1, cache_dir=str(tmp_path)))
    result = judge.evaluate(source, task)
    assert result.status is Status.PASS, result.error
    assert result.metrics.estimated_cycles > 0 and result.provenance.timing_source.endswith("+no_vmem_msa")
