"""`evolve bench --suite`: the search on several tasks at once, cached by the judge's fingerprint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from evolve.experiments import suite as S
from tests.cli_runs import evolve

TINY = '[[task]]\nlabel = "tiny"\nshape = "B=1,H=2,N=256,D=128"\n'


def _ind(passed: bool, cycles: int | None):
    metrics = SimpleNamespace(estimated_cycles=cycles, latency_s=None)
    return SimpleNamespace(passed=passed, result=SimpleNamespace(metrics=metrics))


def test_evaluations_to_the_target_count_only_kernels_that_passed():
    taken = [_ind(True, 300), _ind(False, 90), _ind(True, 120), _ind(True, 100)]
    assert S.evals_to(taken, 125) == 3 and S.evals_to(taken, 100) == 4 and S.evals_to(taken, 99) is None


def test_the_table_has_a_row_per_task_a_failure_included_and_the_geometric_mean_margin():
    ok = [S.TaskOutcome("a", "k/a", "v5e", "ok", champion=100.0, peer="JAX", peer_cost=150.0, best_known=95.0,
                        evals_to_target=7, kernels=32, judged=5, timing_source="compiler_estimate"),
          S.TaskOutcome("b", "k/b", "v6e", "ok", champion=200.0, peer="JAX", peer_cost=200.0, best_known=200.0,
                        kernels=32)]
    failed = S.TaskOutcome("c", "", "v5e", "failed", error="RuntimeError: boom")
    assert ok[0].margin == pytest.approx(1.5) and failed.margin is None
    assert S.geomean_margin([*ok, failed]) == pytest.approx(1.5 ** 0.5)
    table = S.format_suite([*ok, failed], 32)
    assert "| a (`k/a`) | v5e | 100 | JAX: 150 | 1.500x | 95 | 7 | 5 / 32 |" in table
    assert "| >32 |" in table and "FAILED: RuntimeError: boom" in table and "1.225x" in table


def test_a_task_timed_by_another_source_is_named_apart_in_the_footer():
    rows = [S.TaskOutcome(label, f"k/{label}", "v5e", "ok", champion=100.0, peer="XLA", peer_cost=120.0,
                          kernels=32, timing_source=source, libtpu_version="0.0.42.1")
            for label, source in (("a", "compiler_estimate+hbm+trips"), ("b", "compiler_estimate+hbm+trips"),
                                  ("grouped", "compiler_estimate+hbm+trips+no_vmem_msa"))]
    footer = S.format_suite(rows, 32).splitlines()[-1]
    assert footer.startswith("budget 32 kernels per task; every figure: compiler_estimate+hbm+trips (except "
                             "grouped: compiler_estimate+hbm+trips+no_vmem_msa")
    assert "except" not in S.format_suite(rows[:2], 32)
    grouped = next(t for t in S.SUITES["default"] if t.seed == "grouped_matmul")
    # Its XLA peer has a figure only so: the seed says it (seed_timing), the suite reads it there.
    assert grouped.timing is None and grouped.judge_settings(S.default_config().judge).timing == \
        "compiler_estimate_no_vmem_msa"


def test_write_into_replaces_only_the_block_and_refuses_a_page_without_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"head\n{S.BEGIN}\nold\n{S.END}\ntail\n")
    S.write_into(page, "new table")
    assert page.read_text() == f"head\n{S.BEGIN}\nnew table\n{S.END}\ntail\n"
    page.write_text("no markers\n")
    with pytest.raises(S.UsageError, match="suite:begin"):
        S.write_into(page, "x")


def test_the_fingerprint_moves_with_the_judges_code_and_not_with_the_searchs(tmp_path, monkeypatch):
    for folder in ("evaluator", "seeds", "examples", "evolve"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(S, "ROOT", tmp_path)
    first = S.judge_fingerprint()
    (tmp_path / "evolve" / "m.py").write_text("x = 2\n")
    assert S.judge_fingerprint() == first
    (tmp_path / "evaluator" / "m.py").write_text("x = 2\n")
    assert S.judge_fingerprint() != first


@pytest.mark.parametrize("text,fragment", [
    ("", "no [[task]] table"),
    ("[[task]\n", "not TOML"),
    ('[[task]]\nlabel = "x"\nsize = 3\n', "unknown keys size"),
    ('[[task]]\nlabel = "x"\nseed = "no_such_seed"\n', "no_such_seed"),
    ('[[task]]\nlabel = "x"\npeers = {JAX = "missing.py"}\n', "no peer file"),
    ('[[task]]\nlabel = "x"\ntiming = "stopwatch"\n', "unknown timing source 'stopwatch'"),
])
def test_a_bad_suite_file_is_one_line_exit_2_and_nothing_stored(tmp_path, text, fragment):
    path = tmp_path / "suite.toml"
    path.write_text(text)
    r = evolve("bench", "--suite", str(path), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args,fragment", [
    (["--suite", "nope"], "no suite 'nope'"),
    (["--suite", "--shape", "B=1"], "drop --shape"),
    (["--write", "README.md"], "--write goes with --suite"),
    (["--suite", "--write", "no_such_page.md"], "is not a page with"),
    (["--suite", "--budget", "0"], "--budget must be at least 1"),
])
def test_bad_suite_arguments_are_one_line_exit_2(tmp_path, args, fragment):
    r = evolve("bench", *args, "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "d").exists()


def test_a_tiny_suite_runs_beside_its_peer_and_a_second_run_judges_nothing(tmp_path):
    """The real judge on a one-task suite of budget 2: a row with the champion and JAX's tuned
    kernel; the page's block rewritten with the commit and the command; run again, every kernel
    and the peer come back from the suite's archive, with the same figures."""
    (tmp_path / "suite.toml").write_text(TINY)
    page, readme = tmp_path / "page.md", tmp_path / "README.md"
    for p in (page, readme):
        p.write_text(f"# figures\n{S.BEGIN}\n{S.END}\n")
    args = ["bench", "--suite", str(tmp_path / "suite.toml"), "--budget", "2", "--data-dir", str(tmp_path / "d")]
    first = evolve(*args, "--write", str(page), "--write", str(readme), "--out", str(tmp_path / "r1"))
    assert first.returncode == 0, first.stderr[-3000:]
    one = json.loads((tmp_path / "r1" / "suite.json").read_text())["tasks"][0]
    assert one["status"] == "ok" and one["judged"] == 2 and one["kernels"] == 2
    # The seed's peer and the task's XLA program, judged beside the champion; the strongest is the row's.
    assert set(one["peers"]) == {"JAX flash_attention (tuned blocks)", S.XLA} and all(one["peers"].values())
    assert one["peer"] == min(one["peers"], key=one["peers"].get) and one["peer_cost"] > 0 and one["champion"] > 0
    assert one["best_known"] == min(one["champion"], one["peer_cost"])
    text = page.read_text()
    assert "at commit `" in text and "--budget 2 --write PAGE" in text and "| tiny (`flash_attention/B1-H2" in text
    assert "at commit" not in readme.read_text() and "--budget 2 --write PAGE" in readme.read_text()   # no hash
    second = evolve(*args, "--out", str(tmp_path / "r2"))
    assert second.returncode == 0, second.stderr[-3000:]
    two = json.loads((tmp_path / "r2" / "suite.json").read_text())["tasks"][0]
    assert two["judged"] == 0
    assert {k: two[k] for k in ("champion", "peer_cost", "champion_id")} == \
           {k: one[k] for k in ("champion", "peer_cost", "champion_id")}
    assert len(list((tmp_path / "d" / "suite").iterdir())) == 1       # one judge, one archive
