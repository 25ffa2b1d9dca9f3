"""The MLflow side: lineage tags, best-effort failures, rebuild from the archive, concurrency."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from archive import Archive, individual_id, make_row
from evaluator.result import EvalResult, Metrics, Provenance, Status
from mlflow_runs import Tracker, ensure_store, lineage_svg, tracking_uri_for
from mlflow_runs._best_effort import BestEffort

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
TASK = "flash_attention/B1-H1-N128-D128-causal-float32"


def result(speedup):
    if speedup is None:
        return EvalResult(Status.FAIL_COMPILE, error="no", stage="compile")
    return EvalResult(Status.PASS, stage="timing",
                      metrics=Metrics(latency_s=1e-3 / speedup, speedup_vs_reference=speedup,
                                      latency_ci_s=(1e-4, 2e-4), copy_trap=False, vmem_bytes=1 << 20,
                                      runner_time_s=2.5),
                      provenance=Provenance(timing_source="compiler_estimate", chip="v5e",
                                            libtpu_version="0.0.42.1"))


def fake_rows(run_id="run-1"):
    """seed -> a (bq 256) -> b (bkv 512) ; c = crossover(b, a), FAIL_COMPILE."""
    srcs = {name: f"def flash_attention():\n    return {i!r}\n" for i, name in enumerate("sabc")}
    ids = {name: individual_id(s) for name, s in srcs.items()}
    spec = [("s", [], "seed", {}, 1.0, 0), ("a", ["s"], "tile", {"block_q": 256}, 1.3, 1),
            ("b", ["a"], "tile", {"block_kv": 512}, 1.7, 2), ("c", ["b", "a"], "crossover", {}, None, 2)]
    rows = [make_row(run_id=run_id, source=srcs[n], result=result(sp), task_key=TASK, generation=g,
                     parent_ids=[ids[p] for p in parents], operator=op, params=params,
                     tunables={"block_q": 128, "block_kv": 128, **params},
                     evaluated_at=T0 + dt.timedelta(minutes=i))
            for i, (n, parents, op, params, sp, g) in enumerate(spec)]
    return rows, srcs, ids


def children(client, experiment_id, run_id):
    runs = client.search_runs([experiment_id], filter_string=f"tags.`pallas_evolve.run_id` = '{run_id}' "
                              "and tags.`pallas_evolve.kind` = 'individual'")
    return {r.data.tags["individual_id"]: r for r in runs}


def assert_connected_lineage(client, experiment_id, run_id, ids, parent_run_id):
    kids = children(client, experiment_id, run_id)
    assert set(kids) == set(ids.values())
    for run in kids.values():
        assert run.data.tags["mlflow.parentRunId"] == parent_run_id
    run_of = {ind: r.info.run_id for ind, r in kids.items()}
    assert kids[ids["s"]].data.tags["parent_run_ids"] == ""
    assert kids[ids["a"]].data.tags["parent_run_ids"] == run_of[ids["s"]]
    assert kids[ids["b"]].data.tags["parent_run_ids"] == run_of[ids["a"]]
    assert kids[ids["c"]].data.tags["parent_run_ids"] == f"{run_of[ids['b']]},{run_of[ids['a']]}"
    assert kids[ids["c"]].data.tags["parent_ids"] == f"{ids['b']},{ids['a']}"
    return kids


def test_fake_run_forms_a_connected_lineage(data_dir, tmp_path):
    rows, _, ids = fake_rows()
    tracker = Tracker(data_dir)
    tracker.start_run("run-1", TASK, {"population": 4, "mutation": {"rate": 0.3}})
    by_id = {r["individual_id"]: r for r in rows}
    for row in rows:
        parents = row["parent_ids"]
        assert tracker.log_individual(row, by_id[parents[0]]["source"] if parents else None)
    tracker.log_generation(0, 1.0, 1.0, 1.0, 1)
    tracker.log_generation(1, 1.3, 1.3, 1.0, 1)
    chain = [by_id[ids[n]] for n in "sab"]
    svg = tracker.log_lineage_picture(chain, path=tmp_path / "lineage.svg")
    tracker.finish()
    assert tracker.safe.errors == []

    client = MlflowClient(tracking_uri_for(data_dir))
    experiment = client.get_experiment_by_name(TASK)
    assert experiment.artifact_location.startswith((data_dir / "mlartifacts").resolve().as_uri())
    kids = assert_connected_lineage(client, experiment.experiment_id, "run-1", ids, tracker.parent_run_id)
    parent = client.get_run(tracker.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "run-1"
    assert parent.data.params["mutation.rate"] == "0.3"
    assert [m.step for m in client.get_metric_history(tracker.parent_run_id, "best_speedup")] == [0, 1]
    b = kids[ids["b"]]
    assert b.data.params["operator"] == "tile" and b.data.params["tunables.block_kv"] == "512"
    assert b.data.params["edit.block_kv"] == "512"
    assert b.data.metrics["speedup_vs_reference"] == 1.7 and b.data.tags["status"] == "PASS"
    assert b.data.tags["timing_source"] == "compiler_estimate" and b.data.tags["chip"] == "v5e"
    files = {f.path for f in client.list_artifacts(b.info.run_id)}
    assert files == {"kernel.py", "diff_vs_parent.txt"}       # .txt: the UI previews it
    patch = Path(client.download_artifacts(b.info.run_id, "diff_vs_parent.txt", str(tmp_path)))
    assert "-    return 1\n+    return 2" in patch.read_text()
    # Descriptions link the lineage: parents, the diff, the evolution run.
    exp = experiment.experiment_id
    note = b.data.tags["mlflow.note.content"]
    assert f"(#/experiments/{exp}/runs/{kids[ids['a']].info.run_id})" in note
    assert f"(#/experiments/{exp}/runs/{b.info.run_id}/artifactPath/diff_vs_parent.txt)" in note
    assert f"(#/experiments/{exp}/runs/{tracker.parent_run_id})" in note
    assert "1.700x the XLA reference" in note and "compiler_estimate" in note
    c = kids[ids["c"]]
    assert "second parent (crossover)" in c.data.tags["mlflow.note.content"]
    assert kids[ids["a"]].info.run_id in c.data.tags["mlflow.note.content"]
    assert "Parents: none, this is the seed" in kids[ids["s"]].data.tags["mlflow.note.content"]
    # Honest statuses: PASS finished, anything else failed, with its error in the description.
    assert b.info.status == "FINISHED" and c.info.status == "FAILED"
    assert "FAIL_COMPILE" in c.data.tags["mlflow.note.content"] and ": no" in c.data.tags["mlflow.note.content"]
    # Every numeric metric is logged (the list is derived from Metrics); those that mislead are not.
    assert b.data.metrics["runner_time_s"] == 2.5 and b.data.metrics["latency_ci_hi_s"] == 2e-4
    assert "max_rel_error" not in b.data.metrics and "copy_trap" not in b.data.metrics
    assert {f.path for f in client.list_artifacts(kids[ids["s"]].info.run_id)} == {"kernel.py"}
    assert "lineage.svg" in {f.path for f in client.list_artifacts(tracker.parent_run_id)}
    assert (tmp_path / "lineage.svg").read_text() == svg and "tile(block_kv=512)" in svg


def test_lineage_svg_is_well_formed():
    import xml.etree.ElementTree as ET

    rows, _, _ = fake_rows()
    svg = lineage_svg(rows[:3] + [{**rows[3], "params": "not json", "speedup_vs_reference": float("nan")}])
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "x1.308" in svg and "x1.300" in svg and "FAIL_COMPILE" in svg   # 1.7/1.3 and 1.3/1.0


@pytest.mark.parametrize("kind", ["garbage-uri", "data-dir-is-a-file", "missing-sqlite-dir"])
def test_broken_store_never_raises(tmp_path, kind, caplog):
    if kind == "garbage-uri":
        tracker = Tracker(tmp_path, tracking_uri="garbage://nowhere/at/all")
    elif kind == "data-dir-is-a-file":
        (tmp_path / "file").write_text("x")
        tracker = Tracker(tmp_path / "file")
    else:
        (tmp_path / "ro").write_text("x")
        tracker = Tracker(tmp_path, tracking_uri=f"sqlite:///{tmp_path}/ro/sub/mlflow.db")
    rows, _, _ = fake_rows()
    tracker.start_run("run-1", TASK, {"a": 1})
    assert tracker.log_individual(rows[0], None) is None
    tracker.log_generation(0, 1.0, 1.0, 1.0, 1)
    assert "<svg" in tracker.log_lineage_picture(rows[:2])
    tracker.finish()
    assert tracker.sync("run-1", Archive(tmp_path / "arch")) == {"logged": 0, "skipped": 0, "generations": 0}
    assert not tracker.ok
    warnings = [r for r in caplog.records if "MLflow tracking failed" in r.getMessage()]
    assert len(warnings) <= 1


def test_best_effort_retries_locks_then_gives_up_quietly():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"

    safe = BestEffort(max_failures=2, lock_retries=4)
    assert safe.call(flaky) == "ok" and len(calls) == 3 and safe.errors == []

    def broken():
        raise ValueError("bad store")

    assert safe.call(broken) is None and not safe.disabled
    assert safe.call(broken) is None and safe.disabled
    assert safe.call(flaky) is None and len(calls) == 3   # switched off: not even tried


def test_sync_rebuilds_the_mlflow_side_from_the_archive(data_dir):
    rows, _, ids = fake_rows("run-sync")
    archive = Archive(data_dir)
    archive.append(rows[:2])
    archive.append(rows[2:])
    archive.write_run_meta("run-sync", {"task_key": TASK, "config": {"population": 4}, "seed": 1,
                                        "status": "finished"})
    tracker = Tracker(data_dir)
    assert tracker.sync("run-sync", archive) == {"logged": 4, "skipped": 0, "generations": 3}
    again = Tracker(data_dir)
    assert again.sync("run-sync", archive) == {"logged": 0, "skipped": 4, "generations": 0}
    assert tracker.safe.errors == [] and again.safe.errors == []
    client = MlflowClient(tracking_uri_for(data_dir))
    experiment = client.get_experiment_by_name(TASK)
    assert_connected_lineage(client, experiment.experiment_id, "run-sync", ids, again.parent_run_id)
    assert again.parent_run_id == tracker.parent_run_id
    parent = client.get_run(tracker.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.params["population"] == "4"
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "evaluations")] == [0, 1, 2]



def test_sync_logs_the_statistics_the_run_recorded_per_generation(data_dir):
    """A run's generation records hold its logbook's statistics: sync logs those; a generation
    without them (an older record, or none) gets figures from its rows."""
    rows, _, ids = fake_rows("run-gens")
    archive = Archive(data_dir)
    archive.append(rows)
    archive.write_run_meta("run-gens", {"task_key": TASK, "config": {}, "status": "finished"})
    archive.append_generation("run-gens", 0, [ids["s"]], [ids["s"]])        # no statistics
    archive.append_generation("run-gens", 1, [ids["s"], ids["a"]], [ids["a"]],
                              {"gen": 1, "evals": 2, "best": 1.3, "median": 1.15, "pass_rate": 1.0})
    archive.append_generation("run-gens", 2, [ids["a"], ids["b"], ids["c"]], [ids["b"]],
                              {"gen": 2, "evals": 4, "best": 1.7, "median": 1.5, "pass_rate": 2 / 3})
    tracker = Tracker(data_dir)
    assert tracker.sync("run-gens", archive)["generations"] == 3
    client = MlflowClient(tracking_uri_for(data_dir))

    def history(name):
        return [(m.step, m.value) for m in client.get_metric_history(tracker.parent_run_id, name)]

    assert history("evaluations") == [(0, 1), (1, 2), (2, 4)]        # generation 0 from its one row
    assert history("median_speedup") == [(0, 1.0), (1, 1.15), (2, 1.5)]
    assert history("fraction_valid") == [(0, 1.0), (1, 1.0), (2, 0.66667)]


WORKER = textwrap.dedent("""
    import json, sys, logging
    sys.path.insert(0, {root!r})
    from mlflow_runs import Tracker
    sys.path.insert(0, {tests!r})
    from test_mlflow_tracker import fake_rows, TASK
    logging.basicConfig(level=logging.WARNING)
    tag = sys.argv[1]
    errors = []
    for r in range(3):
        run_id = f"{{tag}}-{{r}}"
        tracker = Tracker({data!r})
        tracker.start_run(run_id, TASK, {{"worker": tag}})
        rows, srcs, ids = fake_rows(run_id)
        for row in rows:
            tracker.log_individual(row, None)
            tracker.log_generation(row["generation"], 1.0, 1.0, 1.0, 1)
        tracker.finish()
        errors += tracker.safe.errors
    print(json.dumps(errors))
""")


def test_two_processes_logging_to_one_sqlite_store(data_dir):
    tmp_path = data_dir             # the schema exists before any worker starts (copied template)
    assert ensure_store(tmp_path) == tracking_uri_for(tmp_path)
    script = WORKER.format(root=str(ROOT), tests=str(Path(__file__).parent), data=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script, tag], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for tag in ("p", "q")]
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == []
        assert "locked" not in err.lower()
    client = MlflowClient(tracking_uri_for(tmp_path))
    experiment = client.get_experiment_by_name(TASK)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert len(runs) == 2 * 3 * 5   # 2 processes x 3 runs x (1 parent + 4 individuals)
    for tag in ("p", "q"):
        _, _, ids = fake_rows()
        parent = client.search_runs([experiment.experiment_id],
                                    filter_string=f"tags.`pallas_evolve.run_id` = '{tag}-2' "
                                                  "and tags.`pallas_evolve.kind` = 'run'")[0]
        assert_connected_lineage(client, experiment.experiment_id, f"{tag}-2", ids, parent.info.run_id)


def test_family_tree_draws_every_individual_both_parents_and_the_champion_path():
    import xml.etree.ElementTree as ET

    from mlflow_runs import family_tree_svg
    from mlflow_runs._tree import build_graph

    rows, _, ids = fake_rows()
    graph = build_graph(rows)
    assert set(graph.nodes) == set(ids.values())
    assert {(u, v, d["rank"]) for u, v, d in graph.edges(data=True)} == {
        (ids["s"], ids["a"], 0), (ids["a"], ids["b"], 0), (ids["b"], ids["c"], 0), (ids["a"], ids["c"], 1)}
    svg = family_tree_svg(rows, [ids[n] for n in "sab"], "run-1 · compiler_estimate, chip v5e, libtpu 0.0.42.1")
    assert ET.fromstring(svg).tag.endswith("svg")
    for ind in ids.values():
        assert ind[:6] in svg
    assert "1.70x" in svg and "FAIL_COMPILE" in svg and "chip v5e" in svg
    with pytest.raises(ValueError):
        family_tree_svg([], [], "empty")
