"""Where a run's worker time went (evolve/experiments/stages.py): the stage table, the share
outside the runner's own stages, and each child's announced stages (issue 59)."""

from __future__ import annotations

import json

import pandas as pd

from evolve.experiments.stages import child_stages, format_breakdown, stage_seconds


def rows() -> pd.DataFrame:
    return pd.DataFrame({
        "sandbox_time_s": [3.0, 3.0, 9.0], "runner_time_s": [10.0, 12.0, 30.0], "compile_time_s": [4.0, 5.0, 20.0],
        "wall_time_s": [14.0, 16.0, 40.0], "from_archive": [False, False, True],
        "status": ["PASS", "FAIL_VMEM", "PASS"],
        "runner_stage_seconds": [json.dumps({"start": 2.0, "load": 1.0, "compile": 4.0}), None,
                                 json.dumps({"start": 50.0})],
        "log_tail": ["", "judged once: this kernel lowers to the same program as one judged before", None],
        "program_sha256": ["a", "a", "b"],
        "evaluated_at": pd.to_datetime(["2026-01-01T00:00:14Z", "2026-01-01T00:00:30Z", "2026-01-01T00:00:40Z"])})


def test_only_kernels_judged_here_count_split_by_the_runners_announced_stages_where_recorded():
    seconds = stage_seconds(rows())
    # row 0 by its announced stages (start + load: runner start); row 1, older, by its timers, and
    # what they leave of its runner's 12 s is its runner start
    assert seconds["worker"] == 6.0 and seconds["compile"] == 4.0 + 5.0
    assert seconds["runner start"] == (2.0 + 1.0) + (12.0 - 5.0) and seconds["counting"] == 0.0
    assert seconds["judge"] == (14 - 3 - 10) + (16 - 3 - 12)


def test_a_childs_stages_are_summed_over_the_kernels_that_recorded_them():
    assert child_stages(rows(), "runner_stage_seconds") == ({"start": 2.0, "load": 1.0, "compile": 4.0}, 1)
    assert child_stages(rows(), "worker_stage_seconds") == ({}, 0)


def test_the_table_says_kernels_per_minute_the_share_outside_the_runner_and_the_runners_stages():
    text = format_breakdown(rows(), workers=1)
    assert "2 kernels judged, 1 read back from the archive" in text
    assert "the runner's stages, per kernel that recorded them (1): start 2.0 s, load 1.0 s, compile 4.0 s" in text
    outside = (6.0 + 10.0 + 2.0) / (6.0 + 10.0 + 9.0 + 2.0)
    assert f"outside the runner's own stages (worker + runner start + judge): {outside:.0%} of worker time" in text
    assert "run time judging: 0.5 min; 4.00 kernels judged per minute" in text
    assert "same program: 1 of 2 judged kernels lowered to a program judged before" in text and "1 distinct" in text
