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

from evaluator.containment import jail
from evaluator import judge as judge_module
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from evaluator.containment.screen import ScreenResult
from seeds.flash_attention.task import AttentionTask
from tests.judging import judge_all

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
    # Loops and branches on data are counted on the timing input (evaluator/figure/trips.py): scored by
    # the work they do (COUNTED below), not refused and never cheaper than it.
    "c5_when_on_prefetched_flag": (Status.PASS, ""),
    "c5_xla_loop_over_heads": (Status.PASS, ""),     # unrolled: every head's kernel counted
    "c5_prefetch_loop_bound": (Status.PASS, ""),
    "c6_cache_and_setsid": (Status.PASS, ""),
    "c7_bf16_accumulation": (Status.FAIL_CORRECTNESS, "less precise"),
    "c8_known_outputs_in_kernel": (Status.FAIL_TRACE, "bytes of constants"),
    "c8_known_outputs_in_xla": (Status.FAIL_TRACE, "bytes of constants"),
    # Round three (issue 36), each beside its honest twin (ROUND_THREE below): trips counted by what
    # each grid entry runs; the figure the slowest input set's; the TPU's pipeline in the interpreter.
    "c9_trips_on_one_entry": (Status.PASS, ""),
    "c9_easy_path_on_normal": (Status.PASS, ""),
    "c9_output_revisit": (Status.FAIL_CORRECTNESS, "NaN"),
}
# Class 8, compiler knobs the interpreter never sees: the seed with one CompilerParams field set
# (made here from the seed's source, so they follow it) -> (status, phrase).
_PARAMS = "        compiler_params=pltpu.CompilerParams(\n"
KNOBS = {
    "c8_knob_flags": ('flags={"xla_tpu_enable_log_recorder": True}, ', Status.FAIL_TIMING,
                      "compiler parameter flags="),
    "c8_knob_disable_bounds_checks": ("disable_bounds_checks=True, ", Status.FAIL_TIMING,
                                      "compiler parameter disable_bounds_checks=True"),
    "c8_knob_internal_scratch": ("internal_scratch_in_bytes=1 << 20, ", Status.FAIL_TIMING,
                                 "compiler parameter internal_scratch_in_bytes="),
    "c8_knob_serialization_format": ("serialization_format=0, ", Status.FAIL_TIMING,
                                     "compiler parameter serialization_format=0"),
    "c8_knob_side_effects": ("has_side_effects=True, ", Status.FAIL_TIMING, "has_side_effects"),
    # A declared cost estimate is dropped before lowering: a tiny one changes no figure (PASS, the
    # seed's figure exactly; the check below).
    "c8_tiny_cost_estimate": (None, Status.PASS, ""),
}


# Class 10, made here from the seed's source (so it follows it): the seed's kernel at the shape the
# suite checks it at (TASK's) and, at any other shape, no kernel at all (it returns v: free and
# wrong). A judge that checked a kernel at a small size and timed it at the real one would check
# one program and time another; this judge checks and times one traced program at the task's
# shape, so the cheap path is never what it measures: PASS with the seed's figure exactly.
SHAPE_BRANCH = {"c10_real_work_at_checked_size": (Status.PASS, "")}
_ENTRY = '@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))\ndef flash_attention('


def shape_branch_source() -> str:
    seed = SEED.read_text()
    assert seed.count(_ENTRY) == 1
    return seed.replace(_ENTRY, "def _the_real_work(") + f"""

CHECKED_SHAPE = {(TASK.batch, TASK.heads, TASK.seq_len, TASK.head_dim)}


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))
def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    if q.shape == CHECKED_SHAPE:
        return _the_real_work(q, k, v, causal=causal, sm_scale=sm_scale)
    return v
"""


# Candidates scored by the work they really do -> the honest kernel that does that work (the seed, or
# the same loop with its bound as a compile-time constant): within 5%, and never below it by more
# than 1%.
COUNTED = {"c5_when_on_prefetched_flag": "seed", "c5_prefetch_loop_bound": "c5_loop_constant_bound"}
TWINS = {"c5_loop_constant_bound": lambda: (CANDIDATES / "c5_prefetch_loop_bound.py").read_text().replace(
    "BOUND_FROM_PREFETCH = True", "BOUND_FROM_PREFETCH = False")}


# Class 9, round three: a candidate -> its honest twin, the same work written plainly (the
# candidate's source with HONEST = True). Each candidate is refused or scored within 10% of its twin.
ROUND_THREE = {"c5_xla_loop_over_heads": "c5_xla_loop_over_heads_twin",
               "c9_trips_on_one_entry": "c9_trips_on_one_entry_twin",
               "c9_easy_path_on_normal": "c9_easy_path_on_normal_twin",
               "c9_output_revisit": "c9_output_revisit_twin"}
for _name, _twin in ROUND_THREE.items():
    TWINS[_twin] = lambda n=_name: honest(n)
ROUND_THREE_DECODE = {"c9_element_window": (Status.FAIL_TIMING, "element window"),
                      "c9_wrapping_index": (Status.PASS, "")}


def honest(name: str) -> str:
    source = (CANDIDATES / f"{name}.py").read_text()
    assert source.count("HONEST = False") == 1, name
    return source.replace("HONEST = False", "HONEST = True")


# Candidates of the decode task (judged in their own test below).
DECODE = {"c9_knows_the_timing_input"} | set(ROUND_THREE_DECODE)
DECODE_SHAPE = "B=4,H=4,HKV=2,N=2048,D=128,T=1"


def knob_source(name: str) -> str:
    seed = SEED.read_text()
    assert seed.count(_PARAMS) == 1
    field = KNOBS[name][0]
    if field is None:
        return seed.replace(_PARAMS, "        cost_estimate=pl.CostEstimate(flops=1, transcendentals=0, "
                                     "bytes_accessed=1),\n" + _PARAMS)
    return seed.replace(_PARAMS, _PARAMS + "            " + field)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Every candidate and the seed, judged side by side with the screen out of the way."""
    mp = pytest.MonkeyPatch()
    mp.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    cache = tmp_path_factory.mktemp("adversarial-cache")
    judge = Judge(JudgeConfig(cache_dir=str(cache), workers=2))
    names = sorted(EXPECTED) + sorted(KNOBS) + sorted(TWINS) + sorted(SHAPE_BRANCH)
    sources = [(CANDIDATES / f"{n}.py").read_text() for n in sorted(EXPECTED)] + [
        knob_source(n) for n in sorted(KNOBS)] + [TWINS[n]() for n in sorted(TWINS)] + [
        shape_branch_source()] + [SEED.read_text()]
    try:
        reference = judge.reference_timing(TASK)
        cache_before = (cache / "reference_timings.json").read_text()
        results = judge_all(judge, sources, TASK)
        cache_after = (cache / "reference_timings.json").read_text()
    finally:
        mp.undo()
    return {"results": dict(zip(names + ["seed"], results)), "reference": reference,
            "cache": (cache_before, cache_after)}


def test_every_candidate_has_a_file_and_every_class_a_candidate():
    files = {p.stem for p in CANDIDATES.glob("c*.py")}
    assert set(EXPECTED) | DECODE | set(ROUND_FOUR) | WIDE == files
    assert {name.split("_")[0] for name in files | set(SHAPE_BRANCH)} == {f"c{i}" for i in range(1, 11)}


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(KNOBS) + sorted(SHAPE_BRANCH))
def test_each_candidate_is_refused_or_honestly_scored(verdicts, name):
    status, phrase = EXPECTED.get(name) or SHAPE_BRANCH.get(name) or KNOBS[name][1:]
    if name in JAILED and not jail.probe().enabled:
        pytest.skip("needs the jail")
    result = verdicts["results"][name]
    assert result.status is status, (result.status, result.error)
    assert phrase in result.error
    if name in ROUND_THREE:     # refused, or within 10% of the same work written plainly
        twin = verdicts["results"][ROUND_THREE[name]]
        assert twin.status is Status.PASS, twin.error
        if status is Status.PASS:
            ratio = result.metrics.estimated_cycles / twin.metrics.estimated_cycles
            assert 0.90 <= ratio <= 1.10, (result.metrics.estimated_cycles, twin.metrics.estimated_cycles)
    elif name in COUNTED:         # scored by the work it does, on the data
        twin = verdicts["results"][COUNTED[name]]
        assert twin.status is Status.PASS, twin.error
        ratio = result.metrics.estimated_cycles / twin.metrics.estimated_cycles
        assert 0.99 <= ratio <= 1.05, (result.metrics.estimated_cycles, twin.metrics.estimated_cycles)
    elif status is Status.PASS:   # honestly scored: exactly the seed's figure, not a forged one
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


@pytest.fixture(scope="module")
def known_outputs(tmp_path_factory):
    """Class 8 against each defence alone, and against none: the judge's inputs public (the task's
    documented sets) or secret, the constant budget on or lifted."""
    mp = pytest.MonkeyPatch()
    mp.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    cache = tmp_path_factory.mktemp("known-outputs-cache")
    names = ["c8_known_outputs_in_kernel", "c8_known_outputs_in_xla"]
    sources = [(CANDIDATES / f"{n}.py").read_text() for n in names]
    public, lifted = TASK.correctness_inputs, 1 << 40
    configs = {"neither": dict(correctness_inputs=public, constant_budget_bytes=lifted),
               "secret inputs alone": dict(constant_budget_bytes=lifted),
               "constant budget alone": dict(correctness_inputs=public)}
    out = {}
    try:
        for label, extra in configs.items():
            judge = Judge(JudgeConfig(cache_dir=str(cache), workers=2, **extra))
            out[label] = dict(zip(names, judge_all(judge, sources, TASK)))
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", ["c8_known_outputs_in_kernel", "c8_known_outputs_in_xla"])
def test_outputs_keyed_to_known_inputs_are_stopped_by_each_defence_alone(known_outputs, name):
    hole = known_outputs["neither"][name]
    # The attack is real: with public inputs and no budget it passes, computing no attention.
    assert hole.status is Status.PASS, (hole.status, hole.error)
    secret = known_outputs["secret inputs alone"][name]
    assert secret.status is Status.FAIL_CORRECTNESS and "secret draw" in secret.error, secret.error
    budget = known_outputs["constant budget alone"][name]
    assert budget.status is Status.FAIL_TRACE and "bytes of constants" in budget.error, budget.error


def test_a_kernel_that_knows_the_public_timing_input_is_timed_on_a_secret_one(tmp_path):
    """Class 9. The candidate walks less of the cache on the lengths it hard-codes (the public
    seed's) than on any others. Against a judge whose first set is that public input (explicit
    sets, as a user reproducing a failure would ask) its cheap path is what gets counted: it moves
    the bytes of the honest length-skipping kernel, so the attack is real. The default judge times
    a secret draw: the candidate is counted as the naive full walk, which is what it does there.
    (At this shape the estimate's compute outweighs the HBM floor, so the bytes are compared.)"""
    from mutations import get_operator
    from seeds import load_seed

    seed = load_seed("flash_decoding")
    task = seed.task(DECODE_SHAPE)
    cheat = (CANDIDATES / "c9_knows_the_timing_input.py").read_text()
    line = next(x for x in cheat.splitlines() if x.startswith("KNOWN_LENGTHS"))
    assert [int(x) for x in line.split("(")[1].split(")")[0].split(",")] == task.timing_lengths.tolist()
    naive = seed.kernel_source
    skip = get_operator("length_skip").apply_params(naive, task, {"compute": False})
    assert skip.applied, skip.reason
    secret = Judge(JudgeConfig(cache_dir=str(tmp_path / "a"), workers=2))
    public = Judge(JudgeConfig(cache_dir=str(tmp_path / "b"), workers=2,
                               correctness_inputs=(("ragged", 0), ("outliers", 1))))
    moved = {name: [judge.estimate_timing(s, task)[0].hbm_bytes for s in (cheat, naive, skip.source)]
             for name, judge in (("secret", secret), ("public", public))}
    cheat_p, naive_p, skip_p = moved["public"]
    assert skip_p < naive_p and cheat_p == skip_p        # known input: the cheap path is counted
    cheat_s, naive_s, skip_s = moved["secret"]
    assert skip_s < naive_s and cheat_s == naive_s       # secret input: the full walk is counted
    verdict = secret.evaluate(cheat, task)
    assert verdict.status is Status.PASS, verdict.error


def test_a_kernel_that_works_only_at_its_checked_size_is_caught_at_any_other(tmp_path):
    """Class 10's other half: its shape branch is real. Judged at another size (the task a user
    would time it at), it is checked there too, and it fails there."""
    cheat = shape_branch_source()
    other = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128)
    verdict = Judge(JudgeConfig(cache_dir=str(tmp_path), workers=2)).evaluate(cheat, other)
    assert verdict.status is Status.FAIL_CORRECTNESS, (verdict.status, verdict.error)


@pytest.fixture(scope="module")
def round_three_decode(tmp_path_factory):
    """Class 9's index-map candidates and their twins, judged side by side on the decode task."""
    from seeds import load_seed

    mp = pytest.MonkeyPatch()
    mp.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    task = load_seed("flash_decoding").task(DECODE_SHAPE)
    judge = Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("round-three")), workers=2))
    names = sorted(ROUND_THREE_DECODE)
    sources = [(CANDIDATES / f"{n}.py").read_text() for n in names] + [honest(n) for n in names]
    try:
        results = judge_all(judge, sources, task)
    finally:
        mp.undo()
    return {n: (results[i], results[len(names) + i]) for i, n in enumerate(names)}


@pytest.mark.parametrize("name", sorted(ROUND_THREE_DECODE))
def test_index_maps_are_counted_as_the_chip_runs_them(round_three_decode, name):
    """Class 9, index maps: element windows (the estimate leaves out their copies: refused by
    name) and int32 arithmetic that wraps (counted as the chip wraps it: the twin's bytes)."""
    status, phrase = ROUND_THREE_DECODE[name]
    result, twin = round_three_decode[name]
    assert twin.status is Status.PASS, twin.error
    assert result.status is status, (result.status, result.error)
    assert phrase in result.error
    if status is Status.PASS:
        assert result.metrics.hbm_bytes == twin.metrics.hbm_bytes
        ratio = result.metrics.estimated_cycles / twin.metrics.estimated_cycles
        assert 0.90 <= ratio <= 1.10, (result.metrics.estimated_cycles, twin.metrics.estimated_cycles)


# Class 10, round four (issue 55): what the chip does that Pallas' interpreter does not. Each
# candidate beside its honest twin (its source with HONEST = True), judged on its own task and chip:
# candidate -> (task, the cause its refusal should name).
ROUND_FOUR = {
    "c10_f32_one_pass_dot": ("f32 matmul", "one bf16 pass"),       # the dot's one bf16 pass, named
    "c10_parallel_reduction_axis": ("matmul on v5p", "two TensorCores"),  # the K axis split between cores
    "c10_uint32_accumulator": ("matmul", "NaN"),                   # integer scratch poisoned too
    "c10_read_before_wait": ("matmul", "NaN"),                     # a DMA's destination before its wait
}
# Judged against a softmax reference file in tests/evaluator/correctness/test_wide_draws.py.
WIDE = {"c10_softmax_no_max"}
F32_REFERENCE = Path(__file__).resolve().parent / "c10_f32_matmul_reference.py"


def _round_four_task(label: str, source: str):
    """(chip, task) of a class-10 task; ``source`` names a reference file's kernel entry."""
    from seeds import load_seed
    from seeds.reference import Task

    if label == "f32 matmul":
        return "v5e", Task.read(F32_REFERENCE, source, shape="M=256,K=256,N=256")
    if label == "matmul on v5p":      # K the only axis of more than one step: the one the cores split
        return "v5p", load_seed("matmul").task("M=128,K=1024,N=128")
    return "v5e", load_seed("matmul").task("M=128,K=256,N=256")


@pytest.fixture(scope="module")
def round_four(tmp_path_factory):
    """Class 10's candidates and their twins, one judge per task, the screen out of the way."""
    mp = pytest.MonkeyPatch()
    mp.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    cache = tmp_path_factory.mktemp("round-four")
    out = {}
    try:
        for label in dict.fromkeys(task for task, _ in ROUND_FOUR.values()):
            names = sorted(n for n, (task, _) in ROUND_FOUR.items() if task == label)
            sources = [(CANDIDATES / f"{n}.py").read_text() for n in names] + [honest(n) for n in names]
            chip, task = _round_four_task(label, sources[0])
            judge = Judge(JudgeConfig(chip=chip, cache_dir=str(cache), workers=2))
            results = judge_all(judge, sources, task)
            out.update({n: (results[i], results[len(names) + i]) for i, n in enumerate(names)})
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", sorted(ROUND_FOUR))
def test_what_the_chip_does_and_the_interpreter_did_not_is_refused(round_four, name):
    """Class 10: a one-pass f32 dot, a reduction axis split between two cores, an integer scratch
    read before it is written, a DMA's destination read before its wait. Each candidate is refused;
    its twin, the same work written honestly, PASSes."""
    result, twin = round_four[name]
    assert twin.status is Status.PASS, (twin.status, twin.error)
    assert result.status is Status.FAIL_CORRECTNESS, (
        result.status, result.metrics.estimated_cycles, twin.metrics.estimated_cycles)
    assert ROUND_FOUR[name][1] in result.error, result.error
