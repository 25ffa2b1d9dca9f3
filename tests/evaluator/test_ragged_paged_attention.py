"""JAX's ragged paged attention (the installed module) judged end to end on v6e at a small mixed
batch: checked in the judge's interpreter, timed with its loops, branches and page copies counted
on the timing input (``evaluator/trips.py``, ``evaluator/dmas.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from seeds import load_seed
from tests.judging import judge_all

SEED = Path(__file__).resolve().parents[2] / "seeds" / "ragged_paged_attention"
PEER = Path(__file__).resolve().parents[2] / "examples" / "jax_ragged_paged_attention_tuned.py"
SHAPE = "S=3,PREFILL=13,HQ=8,HKV=2,D=128,PAGE=16,LEN=64"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    seed = load_seed(str(SEED))
    task = seed.task(SHAPE)
    judge = Judge(JudgeConfig(chip="v6e", cache_dir=str(tmp_path_factory.mktemp("rpa")), workers=2))
    peer = PEER.read_text()
    kernel, tuned = judge_all(judge, [seed.kernel_source, peer], task)
    return kernel, tuned, task.measured_on(judge.references.timing_arrays(task))


def test_ragged_paged_attention_is_checked_and_timed_by_the_work_it_does(verdicts):
    kernel, tuned, work = verdicts
    for r in (kernel, tuned):
        assert r.status is Status.PASS, r.error
        assert r.provenance.timing_source == "compiler_estimate+hbm+trips"
    # Its page copies are counted: at least every valid page of every sequence, read once.
    assert kernel.metrics.hbm_bytes >= work.bytes_moved
    assert kernel.metrics.regime == "memory-bound" and 0 < kernel.metrics.hbm_util < 1
