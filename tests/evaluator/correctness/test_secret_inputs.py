"""Secret correctness inputs: every judge draws its own, the jailed worker never sees them, an honest
kernel passes every draw, and its figure does not depend on the draw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evaluator.correctness import ground_truth
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import Status
from mutations import replay
from seeds.flash_attention.task import TEMPERATURES, AttentionTask
from seeds.flash_decoding.task import Task as DecodeTask
from tests.judging import judge_all

ROOT = Path(__file__).resolve().parents[3]
TASK = AttentionTask(batch=1, heads=2, seq_len=256, head_dim=128)
DRAWS = 5
# The best chain the operators build on the naive seed (the README's frontier), at this shape.
CHAMPION_EDITS = [
    {"op": "causal_skip", "params": {}},
    {"op": "diagonal_strips", "params": {"strip": 128}},
    {"op": "deferred_norm", "params": {}},
    {"op": "approx_reciprocal", "params": {}},
    {"op": "block_sizes", "params": {"tunable": "BLOCK_Q", "value": 256}},
    {"op": "block_sizes", "params": {"tunable": "BLOCK_KV", "value": 256}},
    {"op": "vmem_limit", "params": {"mib": 96}},
]


def champion_source() -> str:
    result = replay((ROOT / "seeds/flash_attention/kernel.py").read_text(), CHAMPION_EDITS, TASK)
    assert result.applied, result.reason
    return result.source


@pytest.fixture(scope="module")
def draws(tmp_path_factory):
    """Five judges (five secret draws), each judging the seed, JAX's kernel and the champion."""
    cache = tmp_path_factory.mktemp("secret-cache")
    kernels = {"seed": (ROOT / "seeds/flash_attention/kernel.py").read_text(),
               "jax": (ROOT / "examples/jax_flash_attention.py").read_text(),
               "champion": champion_source()}
    results: dict[str, list] = {name: [] for name in kernels}
    truths = []
    for _ in range(DRAWS):
        judge = Judge(JudgeConfig(cache_dir=str(cache), workers=2))
        for name, result in zip(kernels, judge_all(judge, list(kernels.values()), TASK)):
            results[name].append(result)
        truths.append(judge.ground_truth(TASK)[1])
    return results, truths


def test_every_judge_draws_new_inputs(draws):
    _, truths = draws
    assert all(len(t) == len(TASK.correctness_inputs) for t in truths)
    for i in range(len(TASK.correctness_inputs)):
        firsts = {np.asarray(t[i].inputs[0], np.float32).tobytes() for t in truths}
        assert len(firsts) == DRAWS, f"set {i}: two judges drew the same inputs"
    public = TASK.make_inputs(*reversed(TASK.correctness_inputs[0]))
    assert not any(np.array_equal(np.asarray(t[0].inputs[0]), np.asarray(public[0])) for t in truths)
    assert all("seed" not in g.label for t in truths for g in t), "a label names a seed"


@pytest.mark.parametrize("kernel", ["seed", "jax", "champion"])
def test_an_honest_kernel_passes_every_draw_with_the_same_figure(draws, kernel):
    results, _ = draws
    for result in results[kernel]:
        assert result.status is Status.PASS, result.error
        assert (result.provenance.correctness_sets, result.provenance.secret_sets) == (4, 4)
    figures = {r.metrics.estimated_cycles for r in results[kernel]}
    assert len(figures) == 1, f"{kernel}'s figure depends on the draw: {figures}"


def test_the_champion_is_faster_than_the_seed(draws):
    results, _ = draws
    assert results["champion"][0].metrics.estimated_cycles < results["seed"][0].metrics.estimated_cycles


def test_the_worker_sees_no_input_and_no_seed(tmp_path, monkeypatch):
    """Everything the jailed worker is given (its request, its environment, its scratch directory)
    holds no input array, no seed and nothing derived from one."""
    drawn: list[int] = []
    real = ground_truth.secrets.randbits
    monkeypatch.setattr(ground_truth.secrets, "randbits", lambda k: drawn.append(real(k)) or drawn[-1])
    judge = Judge(JudgeConfig(cache_dir=str(tmp_path / "cache"), workers=1))
    seen = []
    run = judge.children.run

    def spy(module, directory, request, env, **kwargs):
        if module == "evaluator.containment.worker":
            seen.append((json.dumps(request), json.dumps(env), sorted(p.name for p in Path(directory).iterdir())))
        return run(module, directory, request, env, **kwargs)

    monkeypatch.setattr(judge.children, "run", spy)
    result = judge.evaluate((ROOT / "seeds/flash_attention/kernel.py").read_text(), TASK)
    assert result.status is Status.PASS, result.error
    assert len(drawn) == 3 and seen
    for request, env, files in seen:
        assert files == ["kernel.py"]
        for seed in drawn:
            assert str(seed) not in request and str(seed) not in env
        assert "inputs" not in json.loads(request) and ".npy" not in request + env


def test_explicit_sets_are_public_and_recorded_so():
    judge = Judge(JudgeConfig(correctness_inputs=(("normal", 0),)))
    assert (judge.provenance(TASK).correctness_sets, judge.provenance(TASK).secret_sets) == (1, 0)
    drawn = ground_truth.draw(TASK, (("normal", 0),))
    assert ground_truth.set_counts(TASK, (("normal", 0),)) == (1, 0)
    assert np.array_equal(drawn[0][1][0], TASK.make_inputs(0, "normal")[0])


def test_the_timing_input_is_the_first_set_a_secret_draw_kept_for_the_judge():
    task = DecodeTask(batch=8, heads=2, kv_heads=1, kv_len=4096, head_dim=128)
    seed = ground_truth.timing_seed()
    timed = ground_truth.timing_input(task, seed)
    assert list(timed) == ["lengths"]
    drawn = ground_truth.draw(task, None, seed)
    assert ground_truth.set_counts(task) == (4, 4) and len(drawn) == 4
    assert np.array_equal(drawn[0][1][3], timed["lengths"])         # the input the figure is of is checked
    assert "timing input" in drawn[0][0] and str(seed) not in drawn[0][0]
    # Not the public lengths a kernel could know, and another judge draws others.
    assert not np.array_equal(timed["lengths"], task.timing_lengths)
    one, other = Judge(JudgeConfig()).references, Judge(JudgeConfig()).references
    assert np.array_equal(one.timing_arrays(task)["lengths"], one.timing_arrays(task)["lengths"])
    assert not np.array_equal(one.timing_arrays(task)["lengths"], other.timing_arrays(task)["lengths"])
    # The work the figure is judged against is that of the drawn lengths.
    work = task.measured_on(one.timing_arrays(task))
    assert work.key == task.key and work == task
    assert work.bytes_moved != task.bytes_moved
    assert np.array_equal(work.timing_lengths, one.timing_arrays(task)["lengths"])


def test_the_tempered_distribution_draws_its_temperature_from_the_seed():
    task = AttentionTask(batch=1, heads=1, seq_len=128, head_dim=128)
    scales = [float(np.std(np.asarray(task.make_inputs(seed, "tempered")[0], np.float32))) ** 2
              for seed in range(40)]
    assert min(scales) < 1.0 < max(scales)
    assert TEMPERATURES[0] * 0.8 < min(scales) and max(scales) < TEMPERATURES[1] * 1.2
