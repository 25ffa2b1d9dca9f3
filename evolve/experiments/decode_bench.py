"""The decode benchmark: decode kernels over batch sizes and cache lengths, as latency per step,
tokens per second, HBM bandwidth utilisation and tokens per second per dollar.

Each (batch, cache length) is a task of the decode seed; each row is one kernel there, timed by
the judge's timing source without a correctness check (the caches are too large for the CPU's
interpreter: the kernels' correctness comes from ``evolve ablate``/``evolve eval`` at a checkable
shape). The kernels: the task's XLA program, the naive seed, and, given an ``evolve ablate
--format json`` output, its best chain replayed at each size; and with 4 chips, the best of the
4-chip kernels the ``chip_split`` operator makes of it (the task with ``--chips 4``: the cache split
along its length over a v5e 2x2, judged by the judge's own 4-chip path, ``evaluator/correctness/mesh.py``), each combine
tried; each checked once by the judge at a checkable shape).
The 4-chip rows carry their own timing source (``compiler_estimate+hbm+trips+ici_model``): the 1-chip
rows' model (max(compute estimate, HBM floor)) plus the ICI model's collectives. Their speedup over
the XLA reference is not quoted (another source); their ratio to the best 1-chip kernel, the
same model without a collective, is.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from evaluator import Judge
from evaluator import roofline
from evaluator.versions import versions
from evolve.errors import UsageError
from mutations import Edit, replay

BATCHES = (1, 8, 32)
CACHE_LENS = (8192, 32768, 131072)


@dataclasses.dataclass(frozen=True)
class Price:
    usd_per_chip_hour: float
    what: str
    source: str
    as_of: str


# Public on-demand list prices; --price overrides. Not re-checked from this machine (no internet):
# check the current page before quoting a per-dollar figure.
PRICES = {
    "v5e": Price(1.20, "Cloud TPU v5e, on-demand, per chip-hour",
                 "Google Cloud, 'Cloud TPU v5e' launch post and cloud.google.com/tpu/pricing", "2023-08-29"),
    "v6e": Price(2.70, "Cloud TPU v6e (Trillium), on-demand, per chip-hour",
                 "cloud.google.com/tpu/pricing", "2024-12-11"),
}


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    label: str
    chips: int
    batch: int
    cache_len: int
    status: str                     # "ok", or why there is no figure
    latency_s: float | None
    tokens_per_s: float | None
    hbm_util: float | None
    tokens_per_s_per_dollar: float | None   # tokens/s per (USD per hour of the chips used)
    speedup_vs_reference: float | None
    cycles: int | None
    vs_best_1_chip: float | None            # 4-chip rows: latency / the best 1-chip row's latency
    plan: str                               # 4-chip rows: the combine and block chosen, and the combine's cost
    timing_source: str
    chip: str
    libtpu_version: str
    task_key: str


def best_chain(ablation_json: Path) -> tuple[str, list[Edit]]:
    """The fastest PASS row of an ``evolve ablate --format json`` output that the operators made."""
    try:
        rows = json.loads(ablation_json.read_text())
        ours = [r for r in rows if r["status"] == "PASS" and r["edits"]]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"cannot read {ablation_json} as 'evolve ablate --format json' output ({exc})") from None
    if not ours:
        raise UsageError(f"{ablation_json} has no passing kernel made by the operators; run evolve ablate again")
    best = max(ours, key=lambda r: r.get("speedup_vs_reference") or 0.0)
    edits = [Edit.from_dict(e) for e in best["edits"]]
    return "best 1-chip kernel (" + " + ".join(e.op for e in edits) + ")", edits


def sized_task(base, batch: int, cache_len: int):
    if not {"batch", "kv_len"} <= set(base.fields()):
        raise UsageError(f"decode-bench needs a decode seed (a task with batch and kv_len); {base.name} has neither")
    return dataclasses.replace(base, batch=batch, kv_len=cache_len)


def _hbm_verdict(why: str, whose: str) -> str:
    """The compiler's own out-of-HBM verdict, said plainly; any other reason as it is."""
    if "RESOURCE_EXHAUSTED" in why and "HBM" in why:
        return f"does not fit {whose} HBM: " + why.split("RESOURCE_EXHAUSTED:", 1)[1].strip()
    return why


def _row(label: str, task, judge: Judge, timing, findings, reference, price: Price,
         size: tuple[int, int, int] | None = None) -> DecodeRow:
    """One kernel's row; ``size`` (batch, cache length, tokens per step) when the task is not the
    decode seed's (ragged paged attention's: its sequences, its longest cache, one token each)."""
    prov = judge.provenance(task)
    batch, cache_len, step_tokens = size or (task.batch, task.kv_len, task.batch * task.q_len)
    common = {"label": label, "chips": 1, "batch": batch, "cache_len": cache_len,
              "timing_source": prov.timing_source, "chip": prov.chip, "libtpu_version": prov.libtpu_version,
              "task_key": task.key}
    blind = [f["construct"] for f in findings if f.get("construct") in judge.timing.blind_spots]
    if timing.latency_s is None or blind:
        why = ("refused: the estimate cannot time " + ", ".join(blind)) if blind else (timing.error or "no figure")
        why = _hbm_verdict(why, "one chip's")
        return DecodeRow(status=why.splitlines()[0][:200], latency_s=None, tokens_per_s=None, hbm_util=None,
                         tokens_per_s_per_dollar=None, speedup_vs_reference=None, cycles=None,
                         vs_best_1_chip=None, plan="", **common)
    tokens = step_tokens / timing.latency_s
    work = task.measured_on(judge.references.timing_arrays(task)) if size else task
    roof = roofline(work.flops, work.bytes_moved, timing.latency_s, judge.chip)
    speedup = reference.latency_s / timing.latency_s if reference is not None and reference.latency_s else None
    return DecodeRow(status="ok", latency_s=timing.latency_s, tokens_per_s=tokens, hbm_util=roof.hbm_util,
                     tokens_per_s_per_dollar=tokens / (common["chips"] * price.usd_per_chip_hour),
                     speedup_vs_reference=speedup,
                     cycles=timing.cycles, vs_best_1_chip=None, plan="", **common)


RPA_SEED = "ragged_paged_attention"


def rpa_task(decode_task):
    """Ragged paged attention's task at a decode task's size: ``batch`` decode sequences (no
    prefill), its heads and head size, caches up to its length, on the RPA seed's page size."""
    from seeds import load_seed

    base = load_seed(RPA_SEED).default_task()
    return dataclasses.replace(base, seqs=decode_task.batch, prefill=0, q_heads=decode_task.heads,
                               kv_heads=decode_task.kv_heads, head_dim=decode_task.head_dim,
                               max_len=decode_task.kv_len, dtype=decode_task.dtype)


def rpa_rows(judge: Judge, decode_task, price: Price) -> list[DecodeRow]:
    """JAX's ragged paged attention at its own tuned block sizes (the RPA seed's peer), at this
    size: what vLLM's TPU backend runs for the same step. Its work is its own task's (each
    sequence's valid cache, on the judge's timing input), so it has no ratio to the decode XLA
    reference."""
    from seeds import load_seed

    seed = load_seed(RPA_SEED)
    try:
        task = rpa_task(decode_task)
    except (TypeError, ValueError) as exc:
        prov = judge.provenance(decode_task)
        return [DecodeRow(f"{label}", 1, decode_task.batch, decode_task.kv_len, f"no RPA task here: {exc}"[:200],
                          None, None, None, None, None, None, None, "", prov.timing_source, prov.chip,
                          prov.libtpu_version, decode_task.key) for label in seed.peer_paths()]
    rows = []
    for label, path in seed.peer_paths().items():
        timing, findings = judge.estimate_timing(path.read_text(), task, count=True)
        rows.append(_row(label, task, judge, timing, findings, None, price,
                         size=(decode_task.batch, decode_task.kv_len, task.tokens)))
    return rows


def run_decode_bench(judge: Judge, seed, base_task, *, batches=BATCHES, cache_lens=CACHE_LENS,
                     chain: tuple[str, list[Edit]] | None = None, price: Price, progress=None,
                     chips: tuple[int, ...] = (1,), rpa: bool = False) -> list[DecodeRow]:
    """Rows per size; with 4 in ``chips``, a 4-chip row; with ``rpa``, JAX's ragged paged
    attention at its tuned blocks."""
    rows: list[DecodeRow] = []
    checked: dict = {}              # a 4-chip kernel's source -> its verdict at the check size
    for cache_len in cache_lens:
        for batch in batches:
            task = sized_task(base_task, batch, cache_len)
            if progress:
                progress(f"{task.key}")
            reference, _ = judge.estimate_timing(None, task)
            rows.append(_row("XLA reference", task, judge, reference, [], reference, price))
            kernels = [("naive seed", seed.kernel_source)]
            if chain is not None:
                label, edits = chain
                result = replay(seed.kernel_source, edits, task)
                if not result.applied:
                    rows.append(DecodeRow(label, 1, batch, cache_len, f"does not apply here: {result.reason}",
                                          None, None, None, None, None, None, None, "", rows[-1].timing_source,
                                          rows[-1].chip, rows[-1].libtpu_version, task.key))
                else:
                    kernels.append((label, result.source))
            for label, source in kernels:
                # Not counted on data: that runs the kernel in the interpreter at the bench's sizes
                # (a kernel whose work depends on the lengths gets a row that says it is refused).
                timing, findings = judge.estimate_timing(source, task)
                rows.append(_row(label, task, judge, timing, findings, reference, price))
            if rpa:
                rows += rpa_rows(judge, task, price)
            if 4 in chips:
                best_one = min((r.latency_s for r in rows if r.cache_len == cache_len and r.batch == batch
                                and r.chips == 1 and r.latency_s and r.label != "XLA reference"
                                and not r.task_key.startswith(RPA_SEED)), default=None)
                rows.append(four_chip_row(seed, task, judge, chain, best_one, price, checked=checked))
    return rows


COMBINES = ("gather", "packed", "separate")
CHECK_BATCH, CHECK_SHARE_BLOCKS = 3, 2     # the 4-chip check: B=3, each chip's share two blocks long


def four_chip_row(seed, task, judge: Judge, chain: tuple[str, list[Edit]] | None, best_one: float | None,
                  price: Price, *, checked: dict) -> DecodeRow:
    """The fastest correct 4-chip kernel at this size: the best 1-chip kernel's edits (the seed's if
    there is no ablation), then ``chip_split`` with each combine, judged by the judge's own 4-chip
    path (the task with ``chips=4``): checked once per kernel at a checkable size (B=3, each chip's
    share two KV blocks long: empty, partial and full shares), then timed here by the estimate."""
    from mutations import read_tunables

    empty = {"latency_s": None, "tokens_per_s": None, "hbm_util": None, "tokens_per_s_per_dollar": None,
             "vs_best_1_chip": None, "plan": "", "speedup_vs_reference": None, "cycles": None}
    try:
        task4 = dataclasses.replace(task, chips=4)
    except (ValueError, TypeError) as exc:
        prov = judge.provenance(task)
        return DecodeRow(label="best 4-chip kernel", chips=4, batch=task.batch, cache_len=task.kv_len,
                         status=str(exc)[:200], timing_source=prov.timing_source + "+ici_model", chip=prov.chip,
                         libtpu_version=prov.libtpu_version, task_key=task.key, **empty)
    edits = list(chain[1]) if chain else []
    prov = judge.provenance(task4)
    common = {"chips": 4, "batch": task.batch, "cache_len": task.kv_len, "timing_source": prov.timing_source,
              "chip": prov.chip, "libtpu_version": prov.libtpu_version, "task_key": task4.key}
    timings, failures = [], []
    for combine in COMBINES:
        # BLOCK_KV's legal values tile N, and a per-chip kernel cuts its block to its share.
        kernel = replay(seed.kernel_source, [*edits, Edit("chip_split", {"combine": combine})], task4)
        if not kernel.applied:
            failures.append(f"{combine}: does not apply: {kernel.reason}")
            continue
        if kernel.source not in checked:
            block = min(read_tunables(kernel.source).get("BLOCK_KV", 512), task.kv_len // 4)
            check = dataclasses.replace(task4, batch=CHECK_BATCH, kv_len=4 * CHECK_SHARE_BLOCKS * block)
            checked[kernel.source] = judge.evaluate(kernel.source, check)
        verdict = checked[kernel.source]
        if not (verdict.status.name == "PASS" or (verdict.status.name == "FAIL_TIMING"
                                                   and verdict.stage == "performance")):
            failures.append(f"{combine}: {verdict.status.value} at the check size: {verdict.error[:120]}")
            continue
        timing, _ = judge.estimate_timing(kernel.source, task4)
        if timing.latency_s is None:
            why = _hbm_verdict(timing.error, "the 4 chips'")
            failures.append(f"{combine}: {why.splitlines()[0][:160]}")
        else:
            timings.append((combine, timing, kernel.source))
    if not timings:
        return DecodeRow(label="best 4-chip kernel", status="; ".join(failures)[:240], **empty, **common)
    combine, best, source = min(timings, key=lambda cts: cts[1].latency_s)
    clock = judge.chip.clock_hz
    compute_s, floor_s = best.compute_cycles / clock, best.hbm_cycles / clock
    tokens = task.batch * task.q_len / best.latency_s
    per_chip_util = roofline(task.flops, task.bytes_moved, best.latency_s, judge.chip, 4).hbm_util
    block, share = read_tunables(source).get("BLOCK_KV", 0), task.kv_len // 4
    plan = (f"{combine} combine, KV block {min(block, share)} on each chip's {share}-entry share"
            f": compute {compute_s * 1e6:.1f} us, HBM floor {floor_s * 1e6:.1f} us, collectives "
            f"{(best.latency_s - max(compute_s, floor_s)) * 1e6:.1f} us ({best.note.split('model: ', 1)[-1]}); "
            "other combines: " + (", ".join(f"{c} {t.latency_s * 1e6:.1f} us" for c, t, _ in timings if t is not best)
                                  or "-") + ("; " + "; ".join(failures) if failures else ""))
    return DecodeRow(status="ok", latency_s=best.latency_s, tokens_per_s=tokens, hbm_util=per_chip_util,
                     tokens_per_s_per_dollar=tokens / (4 * price.usd_per_chip_hour),
                     vs_best_1_chip=best.latency_s / best_one if best_one else None, plan=plan,
                     label=f"best 4-chip kernel ({combine} combine)", speedup_vs_reference=None,
                     cycles=best.cycles, **common)


def format_table(rows: list[DecodeRow], price: Price) -> str:
    first = rows[0] if rows else None
    lines = []
    if first:
        lines += [f"timing source {first.timing_source} (chip {first.chip}, libtpu {first.libtpu_version}, "
                  f"jax {versions()['jax_version']}); estimate only, no correctness check at these sizes",
                  f"price: ${price.usd_per_chip_hour:.2f} per chip-hour ({price.what}; {price.source}, "
                  f"as of {price.as_of})", ""]
    lines += ["| kernel | chips | batch | cache length | latency per step | tokens/s | HBM util per chip | "
              "tokens/s per $/h | vs XLA reference | 4 chips / best 1 chip |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.latency_s is None:
            lines.append(f"| {r.label} | {r.chips} | {r.batch} | {r.cache_len} | {r.status} | | | | | |")
            continue
        sp = f"{r.speedup_vs_reference:.3f}x" if r.speedup_vs_reference else "-"
        ratio = f"{r.vs_best_1_chip:.3f}" if r.vs_best_1_chip else "-"
        lines.append(f"| {r.label} | {r.chips} | {r.batch} | {r.cache_len} | {r.latency_s * 1e6:.1f} us | "
                     f"{r.tokens_per_s:,.0f} | {r.hbm_util:.0%} | {r.tokens_per_s_per_dollar:,.0f} | {sp} | "
                     f"{ratio} |")
    plans = [f"B={r.batch} N={r.cache_len}: {r.plan}" for r in rows if r.plan]
    if plans:
        sources = sorted({r.timing_source for r in rows if r.chips > 1})
        lines += ["", f"4-chip rows: timing source {', '.join(sources)} (the 1-chip rows' model plus each "
                      "collective from evaluator/figure/ici_model.py, summed, not overlapped); no speedup over the "
                      "1-chip XLA reference is quoted for them", *plans]
    return "\n".join(lines)


def plot(rows: list[DecodeRow], path: Path, title: str) -> Path:
    """Tokens/s against cache length, one line per (kernel, batch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple[str, int], list[DecodeRow]] = {}
    for r in rows:
        if r.tokens_per_s:
            series.setdefault((r.label, r.batch), []).append(r)
    styles = {}
    for (label, batch), points in sorted(series.items()):
        style = styles.setdefault(label, ["-", "--", ":", "-."][len(styles) % 4])
        points.sort(key=lambda r: r.cache_len)
        ax.plot([r.cache_len for r in points], [r.tokens_per_s for r in points], style, marker="o",
                label=f"{label.split(' (')[0]}, B={batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cache length (entries)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rows_json(rows: list[DecodeRow], price: Price) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(r), "price_usd_per_chip_hour": price.usd_per_chip_hour,
             "price_source": f"{price.source}, as of {price.as_of}"} for r in rows]
