"""Candidates written to fool the judge, one or more per class of hole an outside review found.

The screen is switched off here: it is a first filter with messages, not the boundary, so each
candidate must be refused or honestly scored by what stands behind it (one traced program, the
trusted runner, the jail, the audit, the reference-relative tolerance). That the screen also
names most of them is tested in ``test_screen.py``.
"""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pytest

from evaluator import jail
from evaluator import judge as judge_module
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from evaluator.screen import ScreenResult
from seeds.flash_attention.task import AttentionTask

CANDIDATES = Path(__file__).resolve().parent / "candidates"
SEED = Path(__file__).resolve().parents[3] / "seeds" / "flash_attention" / "kernel.py"
TASK = AttentionTask(batch=1, heads=2, seq_len=512, head_dim=128)   # the review's shape
# What the operating system enforces needs the jail (root and util-linux `unshare`); without it
# the judge falls back to process limits, loudly, and these guarantees do not hold.
needs_jail = pytest.mark.skipif(not jail.probe().enabled, reason=f"no jail here: {jail.probe().reason}")
JAILED = {"c2_profile_rewrite", "c3_escape_files", "c6_cache_and_setsid"}
MARKERS = ("/tmp/pallas-evolve-adversarial-marker*", "/root/pallas-evolve-adversarial-marker*")

# candidate -> (status, a phrase the verdict must carry)
EXPECTED = {
    "c1_platform_dependent": (Status.FAIL_TRACE, "platform_dependent"),
    "c1_call_counter": (Status.FAIL_CORRECTNESS, "tolerance"),
    "c2_profile_rewrite": (Status.PASS, ""),
    "c2_libtpu_flags": (Status.PASS, ""),
    "c2_swap_exports": (Status.FAIL_CORRECTNESS, "tolerance"),
    "c2_pickle_payload": (Status.FAIL_TRACE, "not plain jaxpr data"),
    "c3_escape_files": (Status.PASS, ""),
    "c4_pure_callback": (Status.FAIL_TRACE, "host callback"),
    "c5_when_on_prefetched_flag": (Status.FAIL_TIMING, "data_dependent_branch"),
    "c5_xla_loop_over_heads": (Status.FAIL_TIMING, "xla_loop"),
    "c5_prefetch_loop_bound": (Status.FAIL_TIMING, "data_dependent_loop"),
    "c6_cache_and_setsid": (Status.PASS, ""),
    "c7_bf16_accumulation": (Status.FAIL_CORRECTNESS, "less precise"),
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every candidate and the seed, judged side by side with the screen out of the way."""
    mp = pytest.MonkeyPatch()
    mp.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    cache = tmp_path_factory.mktemp("adversarial-cache")
    judge = Judge(JudgeConfig(cache_dir=str(cache), workers=2))
    names = sorted(EXPECTED)
    sources = [(CANDIDATES / f"{n}.py").read_text() for n in names] + [SEED.read_text()]
    try:
        reference = judge.reference_timing(TASK)
        cache_before = (cache / "reference_timings.json").read_text()
        results = judge.evaluate_many(sources, TASK)
        cache_after = (cache / "reference_timings.json").read_text()
    finally:
        mp.undo()
    return {"results": dict(zip(names + ["seed"], results)), "reference": reference,
            "cache": (cache_before, cache_after)}


def test_every_candidate_has_a_file_and_every_class_a_candidate():
    files = {p.stem for p in CANDIDATES.glob("c*.py")}
    assert set(EXPECTED) == files
    assert {name[:2] for name in files} == {f"c{i}" for i in range(1, 8)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_candidate_is_refused_or_honestly_scored(verdicts, name):
    status, phrase = EXPECTED[name]
    if name in JAILED and not jail.probe().enabled:
        pytest.skip("needs the jail")
    result = verdicts["results"][name]
    assert result.status is status, (result.status, result.error)
    assert phrase in result.error
    if status is Status.PASS:   # honestly scored: exactly the seed's figure, not a forged one
        seed = verdicts["results"]["seed"]
        assert result.metrics.estimated_cycles == seed.metrics.estimated_cycles
        assert result.metrics.speedup_vs_reference == seed.metrics.speedup_vs_reference


@needs_jail
def test_the_seed_scores_the_same_after_the_suite(verdicts):
    seed = verdicts["results"]["seed"]
    assert seed.status is Status.PASS, seed.error
    assert seed.metrics.reference_cycles == verdicts["reference"].cycles
    assert verdicts["cache"][0] == verdicts["cache"][1], "a candidate rewrote the reference cache"


@needs_jail
def test_nothing_escaped_the_jail(verdicts):
    assert verdicts["results"]["c3_escape_files"].status is Status.PASS
    assert not [p for pattern in MARKERS for p in glob.glob(pattern)], "a candidate wrote outside its jail"
    left = subprocess.run(["pgrep", "-f", "sleep 617"], capture_output=True, text=True).stdout.split()
    assert not left, f"a setsid'd process outlived its evaluation: {left}"
