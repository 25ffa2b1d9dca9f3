"""`evolve bench --suite`: the search judged on a suite of tasks at once, so that a change that wins
on one task and loses on another is seen before it lands.

Each task is an ordinary evolution run (the ``ga`` strategy, the default budget, RNG seed 0 unless
told) in one data directory of the suite's own, ``DATA_DIR/suite/<judge>``, where ``<judge>`` is
a fingerprint of the judge's code, the seeds' and the peers' (``judge_fingerprint``) and of jax
and libtpu: a kernel judged once is read back from that archive by every later suite run (the
compiler estimate is deterministic), and a change to the judge starts a fresh one, so no figure
of an older judge is ever reused. A change to the search (``evolve/``, ``mutations/``) keeps the
cache: re-running the suite costs only the kernels the changed search breeds anew.

Reported per task: the champion; the strongest peer judged by the same judge in the same suite
(the seed's own peers, e.g. JAX's kernel at its tuned blocks; the task's, e.g. JAX at Autocomp's
blocks; the task's XLA program, judged beside the champion); their ratio; the best kernel the
suite's archive knows for the task (any run, any commit with this judge) and the evaluations
this run took to reach 95% of its speed. The suite's geometric-mean margin over the peers sums
it up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from evolve.experiments.bench import reference_cost, result_cost as _cost
from evolve.config import JudgeSettings, RunConfig, TaskConfig
from evolve.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
TARGET = 0.95
JAX_FLASH = "jax.experimental.pallas.ops.tpu.flash_attention"
# The task's XLA program, judged beside the champion: a peer of every task, the only one where the
# seed names none (a matmul, a norm).
XLA = "the task's XLA program"


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One task of a suite: a seed, its problem, the chip, where the run starts, peers beyond the
    seed's own (label -> a kernel file, relative to the project's root), and a timing source (None:
    the suite's, or where that is auto the seed's own where it names one: seed_timing)."""

    label: str
    seed: str = "flash_attention"
    shape: str | None = None
    chip: str = "v5e"
    start: str | None = None
    peers: tuple[tuple[str, str], ...] = ()
    timing: str | None = None

    def task_config(self) -> TaskConfig:
        return TaskConfig(seed=self.seed, shape=self.shape, start=self.start)

    def judge_settings(self, base: JudgeSettings) -> JudgeSettings:
        """The suite's judge settings for this task: its chip, no peers judged by the run, the
        timing source (the task's, else the suite's, else (auto) the seed's own where it names one)
        and the memory (the suite's --memory, else the seed's own, else the judge's default)."""
        from evolve.cli.common import seed_timing

        seed = self.task_config().load_seed()
        timing = self.timing or (base.timing if base.timing != "auto" else seed_timing(seed) or "auto")
        memory = base.memory_gib or seed.task_class.default_memory_gib
        return dataclasses.replace(base, chip=self.chip, peers=False, timing=timing, memory_gib=memory)


SUITES: dict[str, tuple[SuiteTask, ...]] = {
    "default": (
        SuiteTask("seed, default task"),
        SuiteTask("JAX's module, default task", start=JAX_FLASH),
        SuiteTask("JAX's module, Autocomp's v6e workload", start=JAX_FLASH, chip="v6e",
                  shape="B=1,H=32,N=2048,D=128",
                  peers=(("JAX flash_attention (Autocomp's blocks)",
                          "examples/jax_flash_attention_autocomp_blocks.py"),)),
        SuiteTask("seed, default task on v6e", chip="v6e"),
        SuiteTask("decode, default task", seed="flash_decoding"),
        SuiteTask("rmsnorm, default task", seed="rmsnorm"),
        SuiteTask("matmul, 1024 cube", seed="matmul", shape="M=1024,K=1024,N=1024"),
        # XLA's ragged_dot, its peer, has a figure only with VMEM memory-space assignment off
        # (docs/judge.md): the seed names that timing source (seed_timing), and the row is labelled apart.
        SuiteTask("grouped matmul, 8 experts of 1024 x 2048", seed="grouped_matmul",
                  shape="M=512,K=1024,N=2048,E=8"),
    ),
    # Autocomp's four JAXBench workloads at their model shapes, v6e, against the task's XLA program
    # (issue 58). A suite of its own: each judgement at these sizes takes minutes (docs/judge.md,
    # model-sized checks), so the default suite's routine cost is not multiplied by them.
    "jaxbench": (
        SuiteTask("Mamba-2 SSD (Mamba-2-2.7B)", seed="mamba2_ssd", chip="v6e"),
        SuiteTask("RetNet retention (RetNet-6.7B)", seed="retnet", chip="v6e"),
        SuiteTask("MLA attention (DeepSeek-V3)", seed="mla", chip="v6e"),
        SuiteTask("sparse MoE (Mixtral-8x7B)", seed="sparse_moe", chip="v6e"),
    ),
}


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """One task's row: every figure is ``compiler_estimate`` cycles (or latency) of one judge."""

    label: str
    task_key: str
    chip: str
    status: str                      # "ok", or "failed" (``error`` says why)
    run_id: str = ""
    champion_id: str | None = None
    champion: float | None = None
    peer: str | None = None          # the strongest peer's label
    peer_cost: float | None = None
    peers: dict[str, float | None] = dataclasses.field(default_factory=dict)   # every peer: None if it failed
    best_known: float | None = None
    evals_to_target: int | None = None
    kernels: int = 0
    judged: int = 0                  # judged by this suite run (the rest came from the archive)
    minutes: float = 0.0
    timing_source: str | None = None
    libtpu_version: str | None = None
    error: str = ""

    @property
    def margin(self) -> float | None:
        """The peer's cost over the champion's: above 1, the champion is faster."""
        return self.peer_cost / self.champion if self.peer_cost and self.champion else None


def judge_fingerprint() -> str:
    """A fingerprint of what decides a figure: the judge's code, the seeds' (tasks, references,
    peers' files) and the examples the peers are, and the versions of jax, jaxlib and libtpu."""
    from evaluator.versions import versions

    digest = hashlib.sha256(json.dumps(versions(), sort_keys=True).encode())
    for folder in ("evaluator", "seeds", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def suite_tasks(name: str) -> tuple[SuiteTask, ...]:
    """A built-in suite by name, or a suite file: TOML with a ``[[task]]`` table per task (keys:
    label, seed, shape, chip, start, timing, and ``peers = {label = "path"}``)."""
    if name in SUITES:
        return SUITES[name]
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"no suite {name!r}: neither one of {', '.join(SUITES)} nor a file; "
                         "give --suite default or a TOML file with [[task]] tables")
    import tomllib

    try:
        tables = tomllib.loads(path.read_text()).get("task")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"suite file {name}: not TOML ({exc}); fix the file") from None
    if not isinstance(tables, list) or not tables:
        raise UsageError(f"suite file {name} has no [[task]] table; add one per task (label = ..., seed = ...)")
    fields = {f.name for f in dataclasses.fields(SuiteTask)}
    tasks = []
    for i, table in enumerate(tables, 1):
        unknown = set(table) - fields
        if unknown or "label" not in table:
            raise UsageError(f"suite file {name}, task {i}: " + (f"unknown keys {', '.join(sorted(unknown))}"
                             if unknown else "no label") + f"; the keys are {', '.join(sorted(fields))}")
        peers = table.get("peers", {})
        if not isinstance(peers, dict) or not all(isinstance(v, str) for v in peers.values()):
            raise UsageError(f"suite file {name}, task {i}: peers must be a table of label = \"path\"")
        resolved = {label: (path.parent / rel).resolve() for label, rel in peers.items()}
        if missing := [f"{label} ({p})" for label, p in resolved.items() if not p.is_file()]:
            raise UsageError(f"suite file {name}, task {i}: no peer file for {', '.join(missing)} "
                             "(paths are relative to the suite file)")
        if table.get("timing") is not None:
            from evaluator import timing_choices

            if table["timing"] not in timing_choices():
                raise UsageError(f"suite file {name}, task {i}: unknown timing source {table['timing']!r}; "
                                 f"use one of {', '.join(timing_choices())}")
        item = SuiteTask(**{**table, "peers": tuple((label, str(p)) for label, p in resolved.items())})
        item.task_config().task()            # an unknown seed or a bad shape: one line now
        tasks.append(item)
    return tuple(tasks)


def _cached_peers(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def judge_peers(run, executor, extra: tuple[tuple[str, str], ...], cache_path: Path) -> dict[str, float | None]:
    """Each peer's cost under the run's judge (None: it did not pass), judged once per source,
    task and judge (the cache sits in the suite's fingerprinted directory)."""
    from evaluator import EvalResult

    paths = {**run.seed.peer_paths(), **{label: ROOT / rel for label, rel in extra}}
    missing = [f"{label} ({path})" for label, path in paths.items() if not path.is_file()]
    if missing:
        raise UsageError(f"no peer file for {', '.join(missing)}; give a path relative to {ROOT}")
    cache = _cached_peers(cache_path)
    judging = None
    out = {}
    for label, path in paths.items():
        source = path.read_text()
        key = hashlib.sha256(f"{run.task.key}\0{run.prov.chip}\0{source}".encode()).hexdigest()
        if key not in cache:
            judging = judging or executor.judging(run.judge, run.task)
            cache[key] = judging(source).to_dict()
            cache_path.write_text(json.dumps(cache))
        result = EvalResult.from_dict(cache[key])
        out[label] = _cost(result) if result.ok else None
    return out


def best_known(archive, task_key: str, chip: str, timing_source: str) -> float | None:
    """The fastest PASS the archive holds for the task, by this timing source."""
    rows = archive.best(task_key, chip, timing_source)
    if rows.empty:
        return None
    row = rows.iloc[0]
    cycles = row.get("estimated_cycles")
    return float(cycles) if cycles is not None and cycles == cycles else float(row["latency_s"])


def evals_to(taken, target_cost: float) -> int | None:
    """After how many of ``taken`` (in the order the run took them) a PASS was at most ``target_cost``."""
    for i, ind in enumerate(taken, 1):
        if ind.passed and (cost := _cost(ind.result)) is not None and cost <= target_cost:
            return i
    return None


def run_task(item: SuiteTask, base: RunConfig, data_dir: Path, run_id: str) -> TaskOutcome:
    """One task's run and its peers, as a row (a failure is a row too, never an exception)."""
    from archive import Archive
    from evolve.executors.base import open_executor
    from evolve.run import EvolutionRun

    start = time.monotonic()
    try:
        config = dataclasses.replace(base, task=item.task_config(), judge=item.judge_settings(base.judge))
        with open_executor(config.judge) as executor:
            run = EvolutionRun(config, str(data_dir), run_id=run_id, strategy="ga", executor=executor)
            champion = run.start()
            peers = judge_peers(run, executor, item.peers, data_dir / "peers.json")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - one task's failure is its row, the suite goes on
        return TaskOutcome(item.label, "", item.chip, "failed", run_id, error=f"{type(exc).__name__}: {exc}"[:300],
                           minutes=(time.monotonic() - start) / 60)
    if champion is not None and (xla := reference_cost(champion.result)):
        peers[XLA] = xla
    passed = {label: cost for label, cost in peers.items() if cost}
    peer = min(passed, key=passed.get, default=None)
    known = best_known(Archive(data_dir), run.task.key, run.prov.chip, run.prov.timing_source)
    candidates = [c for c in (known, *passed.values()) if c]
    known = min(candidates) if candidates else None
    return TaskOutcome(
        item.label, run.task.key, run.prov.chip, "ok" if champion is not None else "failed", run_id,
        champion.id if champion else None, _cost(champion.result) if champion else None,
        peer, passed.get(peer), peers, known, evals_to(run.search.taken, known / TARGET) if known else None,
        len(run.search.taken), run.progress.judged, (time.monotonic() - start) / 60,
        run.prov.timing_source, run.prov.libtpu_version, "" if champion else "no kernel passed")


def geomean_margin(outcomes: list[TaskOutcome]) -> float | None:
    margins = [o.margin for o in outcomes if o.margin]
    return math.exp(sum(map(math.log, margins)) / len(margins)) if margins else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1 else f"{value * 1e6:.1f} us"


def format_suite(outcomes: list[TaskOutcome], budget: int) -> str:
    lines = ["| task | chip | champion | strongest peer (same suite) | champion vs peer | best known "
             "| evaluations to 95% of it | judged / kernels | minutes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.status != "ok":
            lines.append(f"| {o.label} | {o.chip} | FAILED: {o.error[:80].replace('|', '/')} | | | | | | "
                         f"{o.minutes:.1f} |")
            continue
        reach = o.evals_to_target if o.evals_to_target is not None else f">{o.kernels}"
        margin = f"{o.margin:.3f}x" if o.margin else "-"
        peer = f"{o.peer}: {_fmt(o.peer_cost)}" if o.peer else "none passed (or the seed names none)"
        lines.append(f"| {o.label} (`{o.task_key}`) | {o.chip} | {_fmt(o.champion)} | {peer} "
                     f"| {margin} | {_fmt(o.best_known)} | {reach} | {o.judged} / "
                     f"{o.kernels} | {o.minutes:.1f} |")
    g = geomean_margin(outcomes)
    sources = [o.timing_source for o in outcomes if o.timing_source]
    usual = max(set(sources), key=sources.count) if sources else "-"
    apart = [f"{o.label}: {o.timing_source}" for o in outcomes if o.timing_source not in (None, usual)]
    lines += ["", f"geometric-mean margin over the peers: {g:.3f}x" if g else "geometric-mean margin: -",
              f"budget {budget} kernels per task; every figure: {usual}"
              + (f" (except {'; '.join(apart)}: each row's figures are one source)" if apart else "")
              + f", libtpu {outcomes[0].libtpu_version if outcomes else '-'}"]
    return "\n".join(lines)


def write_suite(out: Path, outcomes: list[TaskOutcome], meta: dict[str, Any], table: str) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"table": out / "suite.md", "json": out / "suite.json"}
    paths["table"].write_text(table + "\n")
    paths["json"].write_text(json.dumps({**meta, "tasks": [dataclasses.asdict(o) | {"margin": o.margin}
                                                           for o in outcomes],
                                         "geomean_margin": geomean_margin(outcomes)}, indent=1))
    return paths


BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def page_text(page: Path) -> str:
    """``page``'s text; UsageError if it is not a file with the suite's two markers."""
    text = page.read_text() if page.is_file() else ""
    if BEGIN not in text or END not in text:
        raise UsageError(f"{page} is not a page with a {BEGIN} ... {END} block; add the two markers "
                         "where the table goes")
    return text


def write_into(page: Path, block: str) -> None:
    """Replace the text between the suite's markers in ``page`` with ``block``."""
    text = page_text(page)
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def default_config(rng_seed: int = 0, workers: int = 0) -> RunConfig:
    from evolve.config import SearchConfig

    return RunConfig(search=SearchConfig(rng_seed=rng_seed), judge=JudgeSettings(workers=workers))
