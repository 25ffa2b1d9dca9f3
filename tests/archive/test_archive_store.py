"""The archive: rows in, DataFrames out, crash safety, concurrency and bad files."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from archive import SCHEMA, Archive, ArchiveError, individual_id, make_row
from evaluator.result import EvalResult, Metrics, Provenance, Status

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def passed(speedup, timing_source="measured", chip="v5e", libtpu="0.0.42"):
    return EvalResult(Status.PASS, stage="timing",
                      metrics=Metrics(latency_s=1e-3 / speedup, latency_ci_s=(9e-4, 1.1e-3),
                                      speedup_vs_reference=speedup, estimated_cycles=1000,
                                      copy_trap=False),
                      provenance=Provenance(timing_source=timing_source, chip=chip,
                                            libtpu_version=libtpu, jax_version="0.10.2"))


def row(source, result, *, run_id="r1", generation=0, parents=(), minutes=0, op=None, **kw):
    return make_row(run_id=run_id, source=source, result=result, task_key="attn", generation=generation,
                    parent_ids=list(parents), operator=op, params={"k": generation},
                    evaluated_at=T0 + dt.timedelta(minutes=minutes), **kw)


def all_files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- identity ---------------------------------------------------------------------------------
def test_individual_id_ignores_comments_blank_lines_and_trailing_spaces():
    a = "def f(x):\n    # a comment\n\n    return x + 1  # trailing\n"
    b = "def f(x):   \n    return x + 1\n\n\n"
    assert individual_id(a) == individual_id(b)
    assert len(individual_id(a)) == 16
    assert individual_id(a) != individual_id("def f(x):\n    return x + 2\n")
    assert individual_id("def f(:\n  # broken\n") == individual_id("def f(:\n")


# ---- round trip and schema ----------------------------------------------------------------------
def test_append_and_read_back_with_types(tmp_path):
    archive = Archive(tmp_path)
    path = archive.append([row("x = 1\n", passed(1.5)), row("x = 2\n", EvalResult(Status.CRASH))])
    assert path.parent.name == "run=r1" and path.name.startswith("batch-") and path.exists()
    df = archive.evaluations()
    assert len(df) == 2
    first = df.iloc[0]
    assert first["latency_ci_lo_s"] == 9e-4 and first["latency_ci_hi_s"] == 1.1e-3
    assert first["status"] == "PASS" and first["chip"] == "v5e"
    assert first["evaluated_at"] == pd.Timestamp(T0)
    assert str(df["evaluated_at"].dtype) == "datetime64[us, UTC]"
    assert df.iloc[1]["error"] == "" and pd.isna(df.iloc[1]["speedup_vs_reference"])


def test_schema_is_stable_when_every_metric_is_none(tmp_path):
    archive = Archive(tmp_path)
    p1 = archive.append([row("a = 1\n", EvalResult(Status.FAIL_SCREEN, error="no"))])
    p2 = archive.append([row("a = 2\n", passed(2.0), minutes=1)])
    assert pq.read_schema(p1) == pq.read_schema(p2)
    assert pq.read_schema(p1).remove_metadata() == SCHEMA
    df = archive.evaluations()
    assert len(df) == 2
    assert str(df["estimated_cycles"].dtype) == "Int64" and str(df["copy_trap"].dtype) == "boolean"
    empty = Archive(tmp_path / "other").evaluations()
    assert list(empty.columns) == list(df.columns) and empty.empty


# The metric columns as archives were first written with them: derived from Metrics now, they
# must keep these names and types, or older archives would no longer read.
PINNED_METRIC_COLUMNS = {
    "latency_s": "double", "latency_ci_lo_s": "double", "latency_ci_hi_s": "double",
    "reference_latency_s": "double", "speedup_vs_reference": "double", "estimated_cycles": "int64",
    "reference_cycles": "int64", "tflops": "double", "mxu_util": "double", "hbm_util": "double",
    "regime": "string", "roofline_latency_s": "double", "vmem_bytes": "int64", "copy_trap": "bool",
    "compile_time_s": "double", "max_abs_error": "double", "max_rel_error": "double",
    "reference_max_abs_error": "double", "sandbox_time_s": "double", "lower_time_s": "double",
    "correctness_time_s": "double", "timing_time_s": "double", "runner_time_s": "double",
}


def test_metric_columns_derived_from_metrics_keep_their_names_and_types():
    types = {f.name: str(f.type) for f in SCHEMA}
    assert {name: types.get(name) for name in PINNED_METRIC_COLUMNS} == PINNED_METRIC_COLUMNS
    for field in dataclasses.fields(Metrics):              # every metric has its column(s)
        assert field.name in types or f"{field.name[:-2]}_lo_s" in types, field.name


def test_every_metric_survives_the_archive(tmp_path):
    values = {float: 0.25, int: 7, str: "memory-bound", bool: True}
    from evaluator.result import METRIC_COLUMNS, METRIC_PAIRS

    metrics = Metrics(**{f.name: (0.5, 0.75) if f.name in METRIC_PAIRS else values[METRIC_COLUMNS[f.name]]
                         for f in dataclasses.fields(Metrics)})
    archive = Archive(tmp_path)
    archive.append([row("m = 1\n", EvalResult(Status.PASS, metrics=metrics, provenance=Provenance(chip="v5e")))])
    hit = archive.lookup(individual_id("m = 1\n"), "attn", "v5e", None, None)
    assert EvalResult.from_dict(hit).metrics == metrics


def test_an_older_file_without_a_newer_metric_column_still_reads(tmp_path):
    archive = Archive(tmp_path)
    path = archive.append([row("x = 1\n", passed(1.5))])
    pq.write_table(pq.read_table(path).drop_columns(["runner_time_s", "sandbox_time_s"]), path)
    df = Archive(tmp_path).evaluations()
    assert len(df) == 1 and pd.isna(df.iloc[0]["runner_time_s"]) and df.iloc[0]["speedup_vs_reference"] == 1.5


def test_bad_rows_are_refused(tmp_path):
    archive = Archive(tmp_path)
    with pytest.raises(ValueError, match="unknown"):
        archive.append([{**row("a\n", passed(1.0)), "speed": 3}])
    with pytest.raises(ValueError, match="one run"):
        archive.append([row("a\n", passed(1.0)), row("b\n", passed(1.0), run_id="r2")])
    with pytest.raises(ValueError, match="bad run id"):
        archive.append([row("a\n", passed(1.0), run_id="../x")])
    assert archive.evaluations().empty


# ---- queries --------------------------------------------------------------------------------------
def lineage_archive(tmp_path) -> tuple[Archive, list[str]]:
    archive = Archive(tmp_path)
    srcs = [f"v = {i}\n" for i in range(5)]
    ids = [individual_id(s) for s in srcs]
    archive.append([row(srcs[0], passed(1.0), op="seed")])
    archive.append([row(srcs[1], passed(1.2), generation=1, parents=[ids[0]], minutes=1, op="tile"),
                    row(srcs[2], passed(1.1), generation=1, parents=[ids[0]], minutes=2, op="tile")])
    archive.append([row(srcs[3], passed(1.6), generation=2, parents=[ids[1], ids[2]], minutes=3, op="cx"),
                    row(srcs[4], EvalResult(Status.FAIL_VMEM), generation=2, parents=[ids[3]],
                        minutes=4)])
    return archive, ids


def test_ancestry_follows_all_parents_back_to_the_seed(tmp_path):
    archive, ids = lineage_archive(tmp_path)
    anc = archive.ancestry(ids[4])
    assert list(anc["individual_id"]) == [ids[4], ids[3], ids[1], ids[2], ids[0]]
    assert list(anc["depth"]) == [0, 1, 2, 2, 3]
    assert list(anc["first_parent_chain"]) == [True, True, True, False, True]
    assert archive.ancestry("0" * 16).empty
    assert len(archive.ancestry(ids[0])) == 1


def test_a_kernel_in_two_runs_has_its_ancestry_read_in_one_run(tmp_path):
    """The same source (so the same id) judged in another run, of another task, where it failed:
    the ancestry is read in one run only, the latest unless a run is named."""
    archive, ids = lineage_archive(tmp_path)
    archive.append([row("v = 0\n", EvalResult(Status.FAIL_TIMING), run_id="r2", minutes=10, op="seed"),
                    row("v = 3\n", passed(9.0), run_id="r2", generation=1, parents=[ids[0]], minutes=11,
                        op="tile")])
    latest = archive.lineage(ids[3])
    assert [r["run_id"] for r in latest] == ["r2", "r2"]
    assert [r["status"] for r in latest] == ["FAIL_TIMING", "PASS"]
    first = archive.lineage(ids[3], run_id="r1")
    assert {r["run_id"] for r in first} == {"r1"} and first[0]["status"] == "PASS" and len(first) == 3


def test_best_per_task_chip_and_timing_source(tmp_path):
    archive, ids = lineage_archive(tmp_path)
    archive.append([row("est = 1\n", passed(9.0, timing_source="compiler_estimate"), minutes=5),
                    row("other = 1\n", passed(3.0, chip="v6e"), minutes=6)])
    best = archive.best()
    assert len(best) == 3
    measured = archive.best(chip="v5e", timing_source="measured")
    assert len(measured) == 1 and measured.iloc[0]["individual_id"] == ids[3]
    assert archive.best(task_key="nope").empty


def test_lookup_never_mixes_timing_sources_or_libtpu_versions(tmp_path):
    archive, ids = lineage_archive(tmp_path)
    hit = archive.lookup(ids[3], "attn", "v5e", "measured", "0.0.42")
    assert hit is not None and hit["speedup_vs_reference"] == 1.6
    assert EvalResult.from_dict(hit).metrics.latency_ci_s == (9e-4, 1.1e-3)
    assert archive.lookup(ids[3], "attn", "v5e", "compiler_estimate", "0.0.42") is None
    assert archive.lookup(ids[3], "attn", "v5e", "measured", "0.0.43") is None
    assert archive.lookup(ids[3], "attn", "v6e", "measured", "0.0.42") is None
    assert archive.lookup(ids[3], "other", "v5e", "measured", "0.0.42") is None
    # a failure before timing (no timing source / libtpu recorded) holds under any of them
    archive.append([row("bad\n", EvalResult(Status.FAIL_SCREEN, provenance=Provenance(chip="v5e")),
                        minutes=9)])
    assert archive.lookup(individual_id("bad\n"), "attn", "v5e", "measured", "0.0.43")["status"] == \
        "FAIL_SCREEN"


def test_runs_and_run_records(tmp_path):
    archive, _ = lineage_archive(tmp_path)
    archive.write_run_meta("r1", {"config": {"population": 4}, "seed": 7, "status": "running",
                                  "task_key": "attn"})
    archive.write_run_meta("r2", {"config": {}, "seed": 1, "status": "running"})
    archive.write_run_meta("r1", {**archive.read_run_meta("r1"), "status": "finished"})
    assert archive.read_run_meta("r1")["seed"] == 7
    assert archive.list_runs() == ["r1", "r2"]
    runs = archive.runs().set_index("run_id")
    assert runs.loc["r1", "evaluations"] == 5 and runs.loc["r1", "generations"] == 3
    assert runs.loc["r1", "best_speedup"] == 1.6 and runs.loc["r1", "status"] == "finished"
    assert runs.loc["r2", "evaluations"] == 0
    assert runs.loc["r1", "last_evaluated_at"] == pd.Timestamp(T0 + dt.timedelta(minutes=4))
    with pytest.raises(ArchiveError, match="no run 'r9'"):
        archive.read_run_meta("r9")


def test_generation_records_for_resume(tmp_path):
    archive = Archive(tmp_path)
    assert archive.generations("r1").empty
    archive.append_generation("r1", 0, ["a", "b"], ["a"], {"gen": 0, "best": 1.0})
    archive.append_generation("r1", 1, ["c", "d"], ["c"], {"gen": 1, "best": 1.5})
    archive.append_generation("r1", 1, ["e", "f"], ["e"], {"gen": 1, "best": 1.7})   # rewritten after a resume
    gens = archive.generations("r1")
    assert list(gens["generation"]) == [0, 1]
    assert gens.iloc[1]["population_ids"] == ["e", "f"] and gens.iloc[1]["stats"] == {"gen": 1, "best": 1.7}
    assert "rng_state" not in gens.columns


def test_older_generation_records_with_an_rng_state_and_no_stats_still_read(tmp_path):
    archive = Archive(tmp_path)
    directory = tmp_path / "runs" / "r1"
    directory.mkdir(parents=True)
    (directory / "gen-000000-old.json").write_text(json.dumps({
        "run_id": "r1", "generation": 0, "population_ids": ["a"], "hall_of_fame_ids": ["a"],
        "rng_state": "pallas-evolve:0:item:1", "written_at": T0.isoformat()}))
    archive.append_generation("r1", 1, ["b"], ["b"], {"gen": 1})
    gens = archive.generations("r1")
    assert list(gens["generation"]) == [0, 1] and list(gens["stats"]) == [{}, {"gen": 1}]
    assert list(gens["population_ids"]) == [["a"], ["b"]] and "rng_state" not in gens.columns


# ---- crash safety -----------------------------------------------------------------------------------
def test_stray_temp_file_is_skipped_and_removed_on_next_open(tmp_path):
    archive = Archive(tmp_path)
    archive.append([row("x = 1\n", passed(1.0))])
    run_dir = tmp_path / "archive" / "run=r1"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    from archive import _fs
    stray = run_dir / f"_batch-g000001-n1-dead.parquet.{_fs._HOST}-{dead}-abcd1234.tmp"
    stray.write_bytes(b"PAR1 half written")
    reopened = Archive(tmp_path, create=False)
    assert reopened.removed_temps == [stray]
    assert len(reopened.evaluations()) == 1
    assert not stray.exists()
    # a temp file whose writer is alive (this process) is left alone
    live = run_dir / f"_batch-live.parquet.{_fs._HOST}-{os.getpid()}-abcd1234.tmp"
    live.write_bytes(b"in progress")
    assert len(Archive(tmp_path).evaluations()) == 1 and live.exists()


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from archive import Archive, make_row
    from evaluator.result import EvalResult, Status
    archive = Archive({data!r})
    tag, batches, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print("ready", flush=True)
    for b in range(batches):
        archive.append([make_row(run_id="r-" + tag, source=f"{{tag}} = {{b * size + i}}\\n",
                                 result=EvalResult(Status.PASS), task_key="attn", generation=b)
                        for i in range(size)])
""")


def writer(tmp_path, tag, batches, size):
    script = WRITER.format(root=str(ROOT), data=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", script, tag, str(batches), str(size)],
                            stdout=subprocess.PIPE, text=True)


def test_concurrent_appends_from_two_processes_lose_no_rows(tmp_path):
    procs = [writer(tmp_path, tag, 20, 5) for tag in ("a", "b")]
    for p in procs:
        p.communicate(timeout=60)
        assert p.returncode == 0
    df = Archive(tmp_path).evaluations()
    assert len(df) == 200
    assert df.groupby("run_id").size().to_dict() == {"r-a": 100, "r-b": 100}
    assert df["individual_id"].nunique() == 200


def test_kill_9_in_a_loop_of_appends_leaves_a_readable_archive(tmp_path):
    for attempt in range(3):
        proc = writer(tmp_path, f"k{attempt}", 100_000, 50)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3 + 0.1 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
    archive = Archive(tmp_path)
    df = archive.evaluations()
    assert len(df) > 0 and len(df) % 50 == 0        # whole batches only
    assert not list((tmp_path / "archive").rglob("_*"))   # the dead writers' temps are gone


# ---- bad files and directories --------------------------------------------------------------------
def test_corrupt_file_raises_archive_error_and_modifies_nothing(tmp_path):
    archive = Archive(tmp_path)
    archive.append([row("x = 1\n", passed(1.0))])
    bad = tmp_path / "archive" / "run=r1" / "batch-g000009-n1-corrupt.parquet"
    bad.write_bytes(b"this is not parquet at all")
    archive.write_run_meta("r1", {"status": "running"})
    before = all_files(tmp_path)
    for call in (lambda a: a.evaluations(), lambda a: a.best(), lambda a: a.runs(),
                 lambda a: a.lookup("x", "attn", None, None, None)):
        with pytest.raises(ArchiveError) as info:
            call(Archive(tmp_path))
        message = str(info.value)
        assert "\n" not in message and str(bad) in message and "move it out" in message
    assert all_files(tmp_path) == before


def test_bad_data_dir_and_bad_run_record(tmp_path):
    with pytest.raises(ArchiveError, match="no data directory"):
        Archive(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ArchiveError, match="is a file"):
        Archive(tmp_path / "afile")
    archive = Archive(tmp_path / "d")
    (tmp_path / "d" / "runs").mkdir()
    (tmp_path / "d" / "runs" / "r1.json").write_text("{not json")
    with pytest.raises(ArchiveError, match="not valid JSON"):
        archive.read_run_meta("r1")
    assert (tmp_path / "d" / "runs" / "r1.json").read_text() == "{not json"
