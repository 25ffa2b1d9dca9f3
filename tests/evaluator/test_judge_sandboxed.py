"""Misbehaving candidates through the whole judge: timeouts, memory, output, integrity."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest

from evaluator import judge as judge_module
from evaluator.judge import Judge, JudgeConfig, StageBudgets
from evaluator.result import Status
from evaluator.containment.sandbox import WALL_BACKSTOP, Limits
from tests.evaluator.conftest import TINY, TINY_FULL, variant
from tests.judging import judge_all


@pytest.fixture(scope="module")
def strict_judge(tmp_path_factory) -> Judge:
    budgets = StageBudgets(load_s=15, lower_s=30, compile_s=60, correctness_s=60)
    return Judge(JudgeConfig(budgets=budgets, limits=Limits(memory_bytes=6 << 30),
                             cache_dir=str(tmp_path_factory.mktemp("cache"))))


def test_a_candidate_that_never_returns_is_a_timeout_and_the_next_still_evaluates(strict_judge,
                                                                                   seed_source):
    hang = seed_source + "\n\nwhile True:\n    pass\n"
    start = time.monotonic()
    r = strict_judge.evaluate(hang, TINY)
    assert r.status is Status.TIMEOUT, (r.status, r.error)
    assert "load" in r.error and "used 15" in r.error and "CPU seconds" in r.error   # its CPU, not the clock
    assert time.monotonic() - start < WALL_BACKSTOP * 15 + 10
    assert strict_judge.evaluate(seed_source, TINY).status is Status.PASS


def test_a_candidate_that_allocates_too_much_is_oom_and_the_reference_passes(strict_judge, seed_source):
    hog = seed_source + "\n\n_hog = [0] * (4 << 30)\n"
    r = strict_judge.evaluate(hog, TINY)
    assert r.status is Status.OOM, (r.status, r.error)
    assert strict_judge.reference_timing(TINY).latency_s is not None   # same limits


def test_printing_100mb_keeps_a_bounded_log(strict_judge, seed_source):
    loud = seed_source + "\n\nprint('x' * 100_000_000)\n"
    r = strict_judge.evaluate(loud, TINY)
    assert r.status is Status.PASS, r.error
    assert len(r.log_tail) <= 4000


def test_patching_the_comparison_is_refused_by_the_screen(strict_judge, seed_source):
    src = "import numpy as np\nnp.allclose = lambda *a, **k: True\n" + seed_source
    r = strict_judge.evaluate(src, TINY)
    assert r.status is Status.FAIL_SCREEN and "np.allclose" in r.error


def test_patching_inside_the_candidate_cannot_reach_the_comparison(strict_judge, seed_source, monkeypatch):
    # Even with the screen out of the way, the candidate's patches live in another process.
    from evaluator.containment.screen import ScreenResult

    monkeypatch.setattr(judge_module, "screen_source", lambda *a, **k: ScreenResult(True))
    wrong = variant(seed_source, "s = s * sm_scale", "s = s * 1.0")
    patched = ("import numpy as np\nnp.abs = lambda x: x * 0\nnp.isfinite = lambda x: x == x\n"
               "import time\ntime.perf_counter = lambda: 0.0\n" + wrong)
    r = strict_judge.evaluate(patched, TINY_FULL)
    assert r.status is Status.FAIL_CORRECTNESS, (r.status, r.error)


def test_many_candidates_come_back_in_order_each_with_its_own_status(strict_judge, seed_source):
    wrong = variant(seed_source, "s = s * sm_scale", "s = s * 1.0")
    results = judge_all(strict_judge, [wrong, seed_source, "import os\n" + seed_source], TINY)
    assert [r.status for r in results] == [Status.FAIL_CORRECTNESS, Status.PASS, Status.FAIL_SCREEN]


def test_workers_get_a_private_home_and_no_compilation_cache(strict_judge, tmp_path):
    env = strict_judge.children.worker_env(tmp_path)
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert not any("CACHE" in key for key in env)
    assert not any(key.startswith(("AWS_", "GOOGLE_", "MLFLOW_")) for key in env)


def test_a_cached_reference_is_checked_before_it_is_trusted(tmp_path, capsys):
    import json
    import os

    judge = Judge(JudgeConfig(cache_dir=str(tmp_path)))
    key = judge.references.key(TINY)
    cycles = 3413
    good = {key: {"cycles": cycles, "latency_s": cycles / judge.chip.clock_hz}}
    cache = tmp_path / "reference_timings.json"
    cache.write_text(json.dumps(good))
    os.chmod(tmp_path, 0o700)
    os.chmod(cache, 0o600)
    assert judge.references.cached(TINY).cycles == cycles
    # An entry whose latency does not follow from its cycles (a hand-inflated reference) is not used.
    cache.write_text(json.dumps({key: {"cycles": cycles, "latency_s": 1.0}}))
    assert judge.references.cached(TINY) is None
    # Nor is a cache that someone else could have written.
    cache.write_text(json.dumps(good))
    os.chmod(cache, 0o666)
    assert judge.references.cached(TINY) is None
    assert "writable by others" in capsys.readouterr().err


def test_a_reference_is_keyed_by_the_code_of_its_task(tmp_path):
    """A task whose reference program changed (another source file) gets another cache key, so a
    stored timing of the old program is never reused for the new one."""
    import importlib.util
    import inspect

    judge = Judge(JudgeConfig(cache_dir=str(tmp_path)))
    module_file = Path(inspect.getsourcefile(type(TINY)))
    copy = tmp_path / "edited_task.py"
    copy.write_text(module_file.read_text() + "\n# the reference program changed\n")
    spec = importlib.util.spec_from_file_location("edited_task", copy)
    edited = importlib.util.module_from_spec(spec)
    sys.modules["edited_task"] = edited          # a dataclass module must be importable by name
    try:
        spec.loader.exec_module(edited)
    finally:
        del sys.modules["edited_task"]
    twin = getattr(edited, type(TINY).__name__)(**{f.name: getattr(TINY, f.name)
                                                    for f in dataclasses.fields(TINY)})
    assert twin.key == TINY.key
    assert judge.references.key(twin) != judge.references.key(TINY)
    assert judge.references.key(TINY) == Judge(JudgeConfig(cache_dir=str(tmp_path))).references.key(TINY)
