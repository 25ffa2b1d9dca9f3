"""The ``wide`` input set (seeds/_contract.py, WIDE): every judge checks a kernel on the timing input
again with its floats scaled 100 to 1000 times past the example's spread, a secret draw like the
others; a kernel must match the reference wherever the reference's own output is a number there.
A softmax without its max subtracted, right on every draw near the example, fails it by name; its
max-subtracted twin passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evaluator.correctness import ground_truth
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from seeds import WIDE, WIDE_FACTORS, builtin_seeds, load_seed, wide_factor, widened
from seeds.flash_attention.task import AttentionTask
from seeds.flash_decoding.task import Task as DecodeTask
from seeds import reference_seed
from tests.judging import judge_all

ADVERSARIAL = Path(__file__).resolve().parents[1] / "adversarial"
REFERENCE = ADVERSARIAL / "softmax_reference.py"
CANDIDATE = ADVERSARIAL / "candidates" / "c10_softmax_no_max.py"
EXP_F32_LIMIT = 88.72     # log(f32 max): exp overflows past it
TINY = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128)


def honest(source: str) -> str:
    assert source.count("HONEST = False") == 1
    return source.replace("HONEST = False", "HONEST = True")


@pytest.fixture(scope="module")
def softmax_task():
    return reference_seed(REFERENCE).read_task(CANDIDATE.read_text())


def _floats(array) -> np.ndarray:
    return np.asarray(array, np.float32)


@pytest.mark.parametrize("name", builtin_seeds())
def test_every_builtin_task_is_checked_on_a_wide_set(name):
    cls = load_seed(name).task_class
    assert WIDE in cls.correctness_inputs and WIDE[0] in cls.distributions
    assert WIDE[1] == cls.correctness_inputs[0][1]      # it repeats the timing input's public seed


def test_the_wide_set_is_a_secret_draw_of_the_timing_input_scaled(monkeypatch):
    drawn: list[int] = []
    real = ground_truth.secrets.randbits

    def spy(bits: int) -> int:       # the judge's seeds are 63 bits (a module imported on the way draws 128)
        value = real(bits)
        if bits == 63:
            drawn.append(value)
        return value

    monkeypatch.setattr(ground_truth.secrets, "randbits", spy)
    sets = ground_truth.draw(TINY)
    assert len(drawn) == 3 and len(sets) == 4           # no seed of its own: the first set's
    first, wide = sets[0], sets[3]
    assert wide.distribution == "wide" and "wide, secret draw" in wide.label
    assert not any(str(seed) in d.label for d in sets for seed in drawn)
    factor = wide_factor(drawn[0])
    assert WIDE_FACTORS[0] <= factor <= WIDE_FACTORS[1]
    q, k, v = (_floats(a) for a in first.inputs)
    root = np.float32(np.sqrt(factor / 2))                # the logits by half the factor
    for scaled, timing in ((wide.inputs[0], q), (wide.inputs[1], k)):      # whole numbers: exact logits
        assert np.array_equal(_floats(scaled), np.rint(timing * root))
    np.testing.assert_allclose(_floats(wide.inputs[2]), v * np.float32(factor), rtol=2 ** -7)
    # Not the public wide set, and another judge draws another.
    assert not np.array_equal(_floats(wide.inputs[2]), _floats(TINY.make_inputs(0, "wide")[2]))
    assert not np.array_equal(_floats(wide.inputs[2]), _floats(ground_truth.draw(TINY)[3].inputs[2]))


def test_the_wide_set_takes_logits_past_exps_range_and_its_truth_is_finite():
    """``outliers`` reaches a logit past 88.7 in a few rows (where two 30x entries meet); the wide
    set's typical row goes 50 to 500 times as far as the timing input's, past 88.7 even at the
    bottom of its range (logits of standard deviation 50)."""
    sets = ground_truth.draw(TINY)

    def logits(q, k, v):
        return np.einsum("bhqd,bhkd->bhqk", _floats(q), _floats(k)) * TINY.sm_scale

    rows = [float(np.median(logits(*d.inputs).max(axis=-1))) for d in sets]
    assert rows[3] > 40 * rows[0] and rows[3] > EXP_F32_LIMIT, rows
    assert np.isfinite(TINY.reference(*sets[3].inputs)).all()


def test_the_wide_set_keeps_the_timing_inputs_integers():
    """The decode task's lengths (what a figure that follows the data counts) are the timing
    input's, so the wide set adds no draw of work to the slowest-set figure."""
    task = DecodeTask(batch=8, heads=2, kv_heads=1, kv_len=1024, head_dim=128)
    sets = ground_truth.draw(task)
    assert np.array_equal(sets[3].inputs[3], sets[0].inputs[3])
    assert not all(np.array_equal(sets[i].inputs[3], sets[0].inputs[3]) for i in (1, 2))


def test_a_wide_draw_stays_finite_in_its_dtype():
    half = np.array([1.0, -300.0, 70.0], np.float16)
    assert np.isfinite(_floats(widened(half, 1000.0))).all()
    assert _floats(widened(half, 1000.0)).tolist() == [1000.0, -65504.0, 65504.0]
    task = AttentionTask(batch=1, heads=1, seq_len=128, head_dim=128, dtype="float16")
    assert all(np.isfinite(_floats(a)).all() for a in task.make_inputs(3, "wide"))


def test_a_reference_files_wide_set_is_past_its_examples_range(softmax_task):
    sets = ground_truth.draw(softmax_task, None, 2024)
    assert [d.distribution for d in sets] == ["normal", "outliers", "scaled", "wide"]
    tops = [float(np.abs(_floats(d.inputs[0])).max()) for d in sets]
    assert max(tops[:3]) < EXP_F32_LIMIT < WIDE_FACTORS[0] * 2 < tops[3], tops
    np.testing.assert_allclose(_floats(sets[3].inputs[0]), _floats(sets[0].inputs[0]) * np.float32(wide_factor(2024)),
                               rtol=1e-6)
    assert softmax_task.truth("normal", *sets[0].inputs)[1] is None         # the plain tolerance near the example


@pytest.fixture(scope="module")
def verdicts(judge, softmax_task, tmp_path_factory):
    """The candidate and its twin against the secret sets; the candidate again against the three
    sets near the example alone (public, as a judge without the wide set would check it)."""
    sources = [CANDIDATE.read_text(), honest(CANDIDATE.read_text())]
    candidate, twin = judge_all(judge, sources, softmax_task)
    near = Judge(JudgeConfig(cache_dir=str(tmp_path_factory.mktemp("near")), workers=1,
                             correctness_inputs=(("normal", 0), ("outliers", 1), ("scaled", 2))))
    return candidate, twin, near.evaluate(sources[0], softmax_task)


def test_a_softmax_without_its_max_fails_on_the_wide_set_by_name(verdicts):
    candidate, _, near = verdicts
    assert candidate.status is Status.FAIL_CORRECTNESS, (candidate.status, candidate.error)
    assert "NaN/Inf" in candidate.error and "(wide, secret draw)" in candidate.error, candidate.error
    # Near the example's spread it is right: the wide set is what refuses it.
    assert near.status is Status.PASS, (near.status, near.error)


def test_its_max_subtracted_twin_passes_every_set(verdicts):
    _, twin, near = verdicts
    assert twin.status is Status.PASS, (twin.status, twin.error)
    assert (twin.provenance.correctness_sets, twin.provenance.secret_sets) == (4, 4)
    assert near.metrics.estimated_cycles <= twin.metrics.estimated_cycles    # the cheat was no dearer


def test_the_judges_truth_carries_each_sets_size_of_terms(judge, verdicts, softmax_task):
    """What the comparison scales its tolerance by: attention's softmax(q k^T) @ |v| on every set
    (v is 100 to 1000 times larger on the wide one); a reference file's workload on |inputs| on the
    wide set alone."""
    attention = judge.ground_truth(TINY)[1]
    for g in attention:
        np.testing.assert_allclose(g.magnitude, TINY.magnitude(*g.inputs), rtol=1e-5)
    assert float(np.median(attention[3].magnitude)) > 50 * float(np.median(attention[0].magnitude))
    reference = judge.ground_truth(softmax_task)[1]
    assert [g.magnitude is None for g in reference] == [True, True, True, False]
    np.testing.assert_allclose(reference[3].magnitude.sum(axis=-1), 1.0, rtol=1e-5)   # softmax(|x|): rows of 1
