"""A run never ends in a traceback: a search where nothing passes stops with a report of what
failed (counted by status, the first error of each) and what to try next, on `run` and on
`resume` (issue 57); a later generation with no PASS is bred on from what passed before."""

from __future__ import annotations

import json
import re
from pathlib import Path

from evaluator.result import EvalResult, Metrics, Status
from evolve.config import RunConfig, SearchConfig
from evolve.executors.base import LocalExecutor
from evolve.search.individual import Individual
from evolve.search.loop import Search
from seeds.flash_attention.task import AttentionTask
from tests.cli_runs import evolve

ROOT = Path(__file__).resolve().parents[2]
TASK = AttentionTask()
SEED = (ROOT / "seeds/flash_attention/kernel.py").read_text()
SMALL = ["--shape", "B=1,H=2,N=256,D=128", "--population", "4", "--generations", "2", "--rng-seed", "7",
         "--no-peers", "--executor", "fake"]


def _search(fails, population: int = 4, generations: int = 2) -> tuple[Search, Individual | None, list[int]]:
    """A steady-state search on a stand-in judge: ``fails(ind, n)`` (n: the order judged) says which
    kernels fail (FAIL_VMEM for one with edits, else CRASH); the others pass, faster with more edits."""
    order = iter(range(10_000))

    def evaluate(ind):
        if fails(ind, next(order)):
            status = Status.FAIL_VMEM if ind.edits else Status.CRASH
            return EvalResult(status, error=f"{status.value.lower()}\nsecond line")
        cycles = 1_000_000 // (1 + len(ind.edits))
        return EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=cycles, speedup_vs_reference=1e6 / cycles))

    def record(ind, result):
        ind.result = result
        ind.fitness.values = (ind.merit,)

    closed: list[int] = []
    config = RunConfig(search=SearchConfig(population=population, generations=generations, hall_of_fame=1,
                                           rng_seed=3, lag=4))
    search = Search(config, SEED, TASK, evaluate=evaluate, record=record,
                    on_generation=lambda g, pool, s: closed.append(g))
    with LocalExecutor(2) as executor:
        champion = search.run(executor)
    return search, champion, closed


def test_a_search_where_nothing_passes_stops_once_every_kernel_bred_is_in():
    search, champion, closed = _search(lambda ind, n: True)
    assert champion is None and search.stopped is not None
    assert not any(ind.passed for ind in search.taken)
    # Only the first population and the repairs of its FAIL_VMEM kernels were judged, not the budget.
    assert len(search.taken) < search.config.search.total()
    assert all(ind.generation == 0 or ind.operator == "vmem_limit" for ind in search.taken)
    assert closed[-1] == search.stopped and search.logbook[-1]["pass_rate"] == 0.0


def test_a_later_generation_with_no_pass_is_bred_on_from_what_passed_before():
    search, champion, closed = _search(lambda ind, n: ind.generation >= 2)
    assert champion is not None and champion.generation < 2 and search.stopped is None
    assert len(search.taken) == search.config.search.total()
    assert not any(ind.passed for ind in search.taken if ind.generation >= 2)
    assert closed == [0, 1, 2]


def test_a_failed_seed_waits_for_the_first_kernel_that_passes():
    search, champion, _ = _search(lambda ind, n: n < 2, generations=1)     # the seed and the next one fail
    assert champion is not None and search.stopped is None
    assert len(search.taken) == search.config.search.total()


def test_the_report_counts_each_status_with_its_first_error_and_says_what_to_try():
    from evolve.run import NoPass, eval_command

    judged = []
    for n, status in enumerate([Status.FAIL_VMEM, Status.CRASH, Status.FAIL_VMEM]):
        ind = Individual(SEED + f"# {n}\n", edits=[])
        ind.result = EvalResult(status, error=f"\n{status.value} number {n}\nits log")
        judged.append(ind)
    config = RunConfig.from_dict({"task": {"seed": "matmul", "shape": "M=128,K=256,N=256", "start": "/k s.py"},
                                  "judge": {"chip": "v6e", "memory_gib": 32}})
    report = NoPass.of(judged, 0, eval_command(config))
    assert report.status == "NO_PASS" and report.counts == {"FAIL_VMEM": 2, "CRASH": 1}
    assert report.errors == {"FAIL_VMEM": "FAIL_VMEM number 0", "CRASH": "CRASH number 1"}
    assert report.eval == ("evolve eval --start '/k s.py' --seed matmul --shape M=128,K=256,N=256 --chip v6e "
                           "--memory 32")
    seed_run = RunConfig.from_dict({"task": {"seed": "matmul"}})            # the seed's kernel: its file
    assert eval_command(seed_run, "/s/kernel.py") == "evolve eval --start /s/kernel.py --seed matmul --chip v5e"
    text = "\n".join(report.lines())
    assert text.startswith("no kernel passed the judge: 3 judged, every one failed; the run stopped in generation 0")
    assert "smaller blocks" in text and "--memory GIB" in text and report.eval in text


def _run_id(data: Path) -> str:
    (run,) = [p.stem for p in (data / "runs").glob("*.json")]
    return run


def _no_traceback(r) -> None:
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr, r.stderr[-3000:]


def test_a_run_whose_every_kernel_fails_reports_why_and_so_does_its_resume(tmp_path):
    from archive import Archive

    kernel = tmp_path / "failing.py"
    kernel.write_text("# fake judge: fail FAIL_VMEM,CRASH\n" + SEED)
    data = tmp_path / "data"
    r = evolve("run", "--start", str(kernel), *SMALL, "--data-dir", str(data))
    _no_traceback(r)
    assert r.returncode == 3, r.stderr[-3000:]
    run_id = _run_id(data)
    df = Archive(data).evaluations(run_id)
    assert len(df) >= 4 and not (df["status"] == "PASS").any()
    meta = Archive(data).read_run_meta(run_id)
    assert meta["status"] == "finished" and "champion_id" not in meta
    report = meta["no_pass"]
    assert report["counts"] == df["status"].value_counts().to_dict() and sum(report["counts"].values()) == len(df)
    assert report["report"] in r.stdout                        # what was printed is what is stored
    assert re.search(r"FAIL_VMEM +\d+  first: fake judge: blocks over the fake VMEM", r.stdout), r.stdout
    assert "next:" in r.stdout and f"eval --start {kernel}" in r.stdout
    # resume replays it from the archive: the same report, nothing judged again, no traceback.
    r = evolve("resume", run_id, "--executor", "fake", "--data-dir", str(data))
    _no_traceback(r)
    assert r.returncode == 3 and report["report"] in r.stdout
    assert re.findall(r"\((\d+) judged, \d+ from archive\)", r.stderr)[-1] == "0"
    # status shows the report, and --json (issue 57: refused before) carries it.
    r = evolve("status", run_id, "--data-dir", str(data))
    assert r.returncode == 0 and "champion: none\nno kernel passed the judge" in r.stdout
    r = evolve("status", run_id, "--json", "--data-dir", str(data))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["champion"] is None and doc["no_pass"]["counts"] == report["counts"]
    assert doc["by_status"] == report["counts"] and doc["judged"] == len(df)
