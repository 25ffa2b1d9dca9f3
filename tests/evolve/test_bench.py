"""`evolve bench`: the report's arithmetic, and a tiny bench (on the fake judge: the bench's
bookkeeping is the subject) where the archive serves every strategy (the seed is judged once for
all of them)."""

from __future__ import annotations

import json

import pytest

from evolve.experiments.bench import Trial, evaluations_to, summarise
from tests.cli_runs import evolve


def _trial(strategy: str, curve: list[float], cost: float, repeat: int = 0) -> Trial:
    return Trial(strategy, repeat, f"r-{strategy}-{repeat}", tuple(curve), cost, len(curve), 1.0)


def test_evaluations_to_target_and_kernel_tuner_score():
    trials = [_trial("ga", [0.5, 1.0, 2.0, 2.0], 100.0),
              _trial("random", [0.5, 0.5, 1.0, 1.2], 300.0),
              _trial("ratchet", [0.5, 1.9, 1.9, 1.9], 150.0)]
    assert evaluations_to((0.5, 1.0, 2.0), 1.0) == 2 and evaluations_to((0.5,), 1.0) is None
    s = summarise(trials)
    assert s["optimum_speedup"] == 2.0 and s["target_speedup"] == pytest.approx(1.9)
    rows = s["strategies"]
    assert rows["ga"]["evaluations_to_target"] == [3] and rows["ratchet"]["evaluations_to_target"] == [2]
    assert rows["random"]["evaluations_to_target"] == [None] and rows["random"]["reached_target"] == "0/1"
    assert rows["ga"]["kernel_tuner_score"] == pytest.approx(1.0)       # (300 - 100) / (300 - 100)
    assert rows["random"]["kernel_tuner_score"] == pytest.approx(0.0)
    assert rows["ratchet"]["kernel_tuner_score"] == pytest.approx(0.75)  # (300 - 150) / (300 - 100)


def test_a_tiny_bench_reports_every_strategy_and_judges_the_seed_once(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    r = evolve("bench", "--shape", "B=1,H=2,N=256,D=128", "--strategies", "ga,random", "--budget", "3",
               "--repeats", "1", "--executor", "fake", "--data-dir", str(data), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| ga | 1 |" in r.stdout and "| random | 1 |" in r.stdout and "compiler_estimate" in r.stdout
    report = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").stat().st_size > 1000 and (out / "bench.md").exists()
    trials = {t["strategy"]: t for t in report["trials"]}
    assert all(len(t["curve"]) == 3 for t in trials.values())
    # The seed (and anything else both drew) came back from the archive for the second strategy.
    assert trials["random"]["judged"] <= 2
    from archive import Archive

    rows = Archive(data).evaluations()
    judged = rows[~rows["from_archive"].astype(bool)]
    assert judged["individual_id"].is_unique                   # no kernel judged twice across strategies
    assert set(rows["run_id"]) == {t["run_id"] for t in report["trials"]}


@pytest.mark.parametrize("args,fragment", [
    (["--strategies", "ga,annealing"], "unknown strategy 'annealing'"),
    (["--budget", "0"], "--budget must be at least 1"),
])
def test_bench_bad_input_is_one_line_exit_2(tmp_path, args, fragment):
    r = evolve("bench", *args, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_repeats_report_a_median_and_quartiles():
    trials = [_trial("ga", [1.0, c], 100.0 / c, r) for r, c in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])]
    trials += [_trial("random", [1.0, 1.0], 100.0, r) for r in range(5)]
    s = summarise(trials, budget=2)
    ga = s["strategies"]["ga"]
    assert ga["final_speedup_spread"] == (3.0, 2.0, 4.0)
    # Target 95% of 5.0: only the last repeat reached it (at 2); the others count as budget + 1.
    assert ga["evaluations_spread"] == (3.0, 3.0, 3.0) and ga["reached_target"] == "1/5"
    from evolve.experiments.bench import format_table

    table = format_table(s, 2)
    assert "3.000 [2.000, 4.000]" in table and ">2 [>2, >2]" in table
