"""A one-step ablation: the seed, the seed with each operator alone (its best parameters), all
operators together, and the seed's outside kernels (JAX's own, for flash attention) — judged side
by side in one run, one timing source."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

from evaluator import Judge
from evaluator import EvalResult
from evolve.executors.base import Executor, LocalExecutor
from mutations import Edit, all_operators
from mutations import replay_applicable
from mutations import shape_operator


@dataclasses.dataclass(frozen=True)
class Entry:
    label: str
    edits: tuple[Edit, ...]
    source: str
    result: EvalResult | None = None
    peer: bool = False            # an outside kernel, not built by the operators


def variants(op, source: str, task, tries: int = 60, limit: int = 12) -> list[tuple[Edit, str]]:
    """Distinct results of one operator on ``source`` over a range of generator seeds."""
    seen: dict[str, Edit] = {}
    for seed in range(tries):
        result = op.apply(source, task, random.Random(seed))
        if result.applied and result.source != source and result.source not in seen:
            seen[result.source] = result.edit
        if len(seen) >= limit:
            break
    return [(edit, src) for src, edit in seen.items()]


GRID_PRUNE = 1.25      # grid kernels estimated over this x the best so far end PRUNED


def _best(entries: list[Entry]) -> Entry | None:
    passed = [e for e in entries if e.result is not None and e.result.ok]
    return max(passed, key=lambda e: e.result.merit, default=None)


def _prerequisite(op, seed_source: str, task) -> tuple[Edit, str] | None:
    """A parameterless operator after which ``op`` applies (one that meets its precondition), for
    an operator that does not apply to the seed itself."""
    for other in all_operators():
        if other.name == op.name or other.knob:
            continue
        result = other.apply(seed_source, task, random.Random(0))
        if result.applied and op.check(result.source, task).ok:
            return result.edit, result.source
    return None


def _grid(executor: Executor, judge: Judge, seed_source: str, task, singles: dict[str, list[Entry]],
          best_cycles: int | None) -> tuple[Entry | None, int]:
    """Every other operator at its best, over the knobs' settings (each knob's ``grid_settings``;
    the block shape outermost, largest first), judged best-looking first in batches; kernels over
    GRID_PRUNE x the best PASS so far are PRUNED. Returns the best and the grid's name."""
    # The knobs (``Operator.knob``), tuned together; the shape outermost.
    knobs = sorted((op for op in all_operators() if op.knob), key=lambda op: (not op.sets_shape, op.chain_rank))
    # Each other operator at its best passing parameters (an operator none of whose variants
    # passed, e.g. one the estimate cannot time, stays out).
    names = {op.name for op in knobs}
    fixed = tuple(best.edits[-1] for name, group in singles.items()
                  if name not in names and (best := _best(group)) is not None)
    # Each knob's settings (its own say, from what it did alone).
    axes = []
    for op in knobs:
        group = singles.get(op.name, [])
        best = _best(group)
        axes.append((op.chain_rank, op.grid_settings(seed_source, task, [e.edits[-1] for e in group],
                                                     best.edits[-1] if best else None)))
    candidates, seen = [], set()
    for point in itertools.product(*(settings for _, settings in axes)):
        # The chain in rank order: knobs before the other rewrites (rank < 0), then those, then the rest.
        ranked = sorted([(0, False, fixed)] + [(rank, True, s) for (rank, _), s in zip(axes, point)],
                        key=lambda r: r[:2])
        edits = [edit for _, _, group in ranked for edit in group]
        source, kept = replay_applicable(seed_source, edits, task)
        if source not in seen:
            seen.add(source)
            candidates.append(Entry("all operators together", tuple(kept), source))
    judged: list[Entry] = []
    workers = executor.workers
    for start in range(0, len(candidates), workers):
        cut = int(best_cycles * GRID_PRUNE) if best_cycles else None
        batch = candidates[start:start + workers]
        results = executor.judge_all(judge, task, [e.source for e in batch], cut)
        for entry, result in zip(batch, results):
            judged.append(dataclasses.replace(entry, result=result))
            if result.ok and result.metrics.estimated_cycles:
                best_cycles = min(best_cycles or result.metrics.estimated_cycles, result.metrics.estimated_cycles)
    best = _best(judged) or (judged[0] if judged else None)
    varied = [op.name for op, (_, settings) in zip(knobs, axes) if len(settings) > 1]
    return best, f"best of {len(judged)} in a grid of {' x '.join(varied) or 'one point'}"


def drop_what_does_not_pay(executor: Executor, judge: Judge, seed_source: str, task, best: Entry
                           ) -> tuple[Entry, list[str]]:
    """Leave one out, on the grid's best: replay its chain without each edit that is not a block
    size (edits that then no longer apply drop too); if a variant is faster, keep the fastest and
    go again; stop when no drop pays. Returns the kernel and the operators dropped, in order."""
    dropped: list[str] = []
    shape_op = getattr(shape_operator(), "name", None)
    while best.result is not None and best.result.ok:
        variants = []
        for i, edit in enumerate(best.edits):
            if edit.op == shape_op:
                continue
            source, kept = replay_applicable(seed_source, [*best.edits[:i], *best.edits[i + 1:]], task)
            if source != best.source and source not in {v.source for _, v in variants}:
                variants.append((edit, Entry(best.label, tuple(kept), source)))
        if not variants:
            break
        results = executor.judge_all(judge, task, [v.source for _, v in variants])
        faster = [(edit, dataclasses.replace(v, result=r)) for (edit, v), r in zip(variants, results)
                  if r.ok and r.merit > best.result.merit]
        if not faster:
            break
        edit, best = max(faster, key=lambda c: c[1].result.merit)
        dropped.append(edit.op)
    return best, dropped


def run_ablation(judge: Judge, seed_source: str, task, *, peers: dict[str, Path] | None = None,
                 executor: Executor | None = None) -> list[Entry]:
    """The ablation's rows, judged through ``executor`` (None: this machine, the judge's workers)."""
    if executor is None:
        with LocalExecutor(judge.config.workers) as local:
            return run_ablation(judge, seed_source, task, peers=peers, executor=local)
    ops = all_operators()
    singles: dict[str, list[Entry]] = {}
    for op in ops:
        base, base_edits, label = seed_source, (), f"seed + {op.name}"
        if not op.check(seed_source, task).ok:
            pre = _prerequisite(op, seed_source, task)
            if pre is not None:
                base, base_edits, label = pre[1], (pre[0],), f"seed + {pre[0].op} + {op.name}"
        singles[op.name] = [Entry(label, base_edits + (edit,), src) for edit, src in variants(op, base, task)]
    batch = [Entry("seed", (), seed_source)] + [e for group in singles.values() for e in group]
    batch += [Entry(label, (), path.read_text(), peer=True) for label, path in (peers or {}).items()
              if path.is_file()]
    results = executor.judge_all(judge, task, [e.source for e in batch])
    batch = [dataclasses.replace(e, result=r) for e, r in zip(batch, results)]
    by_source = {e.source: e for e in batch}
    for name in singles:
        singles[name] = [by_source[e.source] for e in singles[name]]

    ours = [e for e in batch if not e.peer and e.result.ok]
    best_cycles = min((e.result.metrics.estimated_cycles for e in ours if e.result.metrics.estimated_cycles),
                      default=None)
    grid, grid_name = _grid(executor, judge, seed_source, task, singles, best_cycles)

    rows = [batch[0]]
    for op in ops:
        best = _best(singles[op.name])
        if best is None and singles[op.name]:
            best = singles[op.name][0]
        if best is not None:
            rows.append(best)
    if grid is not None:
        label = f"all operators together ({grid_name})"
        rows.append(dataclasses.replace(grid, label=label))
        best, dropped = drop_what_does_not_pay(executor, judge, seed_source, task, grid)
        if dropped:
            rows.append(dataclasses.replace(best, label=f"the grid's best without what does not pay "
                                                        f"(dropped: {', '.join(dropped)})"))
    rows.extend(e for e in batch if e.peer)
    return rows


def ablation_json(rows: list[Entry], task, judge: Judge) -> list[dict]:
    """One object per row, each with its provenance (timing source, chip, versions)."""
    prov = judge.provenance(task)
    out = []
    for e in rows:
        r, m = e.result, e.result.metrics
        out.append({"label": e.label, "edits": [x.to_dict() for x in e.edits], "status": r.status.value,
                    "estimated_cycles": m.estimated_cycles, "latency_s": m.latency_s,
                    "speedup_vs_reference": m.speedup_vs_reference, "error": r.error or None,
                    "task_key": task.key, "timing_source": prov.timing_source, "chip": prov.chip,
                    "libtpu_version": prov.libtpu_version, "jax_version": prov.jax_version})
    return out


def format_ablation(rows: list[Entry], task, judge: Judge) -> str:
    prov = judge.provenance(task)
    seed = rows[0].result.metrics.latency_s if rows and rows[0].result else None
    lines = [f"task {task.key}; timing source: {prov.timing_source} (chip {prov.chip}, "
             f"libtpu {prov.libtpu_version}, jax {prov.jax_version})", "",
             "| kernel | edits | status | latency (us) | speedup vs reference | vs seed | note |",
             "|---|---|---|---|---|---|---|"]
    for e in rows:
        r = e.result
        m = r.metrics
        edits = "; ".join(f"{x.op}({', '.join(f'{k}={v}' for k, v in x.params.items())})" for x in e.edits)
        if m.latency_s:
            vs_ref = f"{m.speedup_vs_reference:.3f}x" if m.speedup_vs_reference else "-"
            figures = (f"{m.latency_s * 1e6:.1f} | {vs_ref} | "
                       f"{(seed / m.latency_s if seed else float('nan')):.2f}x")
        else:
            figures = "- | - | -"
        note = "" if r.ok else r.error[:100].replace("|", "/")
        lines.append(f"| {e.label} | {edits or '-'} | {r.status.value} | {figures} | {note} |")
    return "\n".join(lines)
