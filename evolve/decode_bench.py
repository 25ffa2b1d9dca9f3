"""The decode benchmark: decode kernels over batch sizes and cache lengths, as latency per step,
tokens per second, HBM bandwidth utilisation and tokens per second per dollar.

Each (batch, cache length) is a task of the decode seed; each row is one kernel there, timed by
the judge's timing source without a correctness check (the caches are too large for the CPU's
interpreter: the kernels' correctness comes from ``evolve ablate``/``evolve eval`` at a checkable
shape). The kernels: the task's XLA program, the naive seed, and, given an ``evolve ablate
--format json`` output, its best chain replayed at each size; and with 4 chips, the best of the
4-chip programs of ``evolve.multichip`` (cache split along its length over a v5e 2x2, each combine
tried; each checked once for correctness in interpret mode on 4 CPU devices at a checkable shape).
The 4-chip rows carry their own timing source (``compiler_estimate+hbm+ici_model``): the 1-chip
rows' model (max(compute estimate, HBM floor)) plus the ICI model's collectives. Their speedup over
the XLA reference is not quoted (another source); their ratio to the best 1-chip kernel, the
same model without a collective, is.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from evaluator.judge import ESTIMATE_BLIND_SPOTS, Judge
from evaluator.roofline import roofline
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


def _row(label: str, task, judge: Judge, timing, findings, reference, price: Price) -> DecodeRow:
    prov = judge.provenance(task)
    common = {"label": label, "chips": 1, "batch": task.batch, "cache_len": task.kv_len,
              "timing_source": prov.timing_source, "chip": prov.chip, "libtpu_version": prov.libtpu_version,
              "task_key": task.key}
    blind = [f["construct"] for f in findings if f.get("construct") in ESTIMATE_BLIND_SPOTS]
    if timing.latency_s is None or (blind and judge.timing.name == "compiler_estimate"):
        why = ("refused: the estimate cannot time " + ", ".join(blind)) if blind else (timing.error or "no figure")
        if "RESOURCE_EXHAUSTED" in why and "HBM" in why:      # the compiler's own verdict
            why = "does not fit one chip's HBM: " + why.split("RESOURCE_EXHAUSTED:", 1)[1].strip()
        return DecodeRow(status=why.splitlines()[0][:200], latency_s=None, tokens_per_s=None, hbm_util=None,
                         tokens_per_s_per_dollar=None, speedup_vs_reference=None, cycles=None,
                         vs_best_1_chip=None, plan="", **common)
    tokens = task.batch * task.q_len / timing.latency_s
    roof = roofline(task.flops, task.bytes_moved, timing.latency_s, judge.chip)
    speedup = reference.latency_s / timing.latency_s if reference is not None and reference.latency_s else None
    return DecodeRow(status="ok", latency_s=timing.latency_s, tokens_per_s=tokens, hbm_util=roof.hbm_util,
                     tokens_per_s_per_dollar=tokens / (common["chips"] * price.usd_per_chip_hour),
                     speedup_vs_reference=speedup,
                     cycles=timing.cycles, vs_best_1_chip=None, plan="", **common)


def run_decode_bench(judge: Judge, seed, base_task, *, batches=BATCHES, cache_lens=CACHE_LENS,
                     chain: tuple[str, list[Edit]] | None = None, price: Price, progress=None,
                     chips: tuple[int, ...] = (1,), seed_ref: str = "flash_decoding") -> list[DecodeRow]:
    """Rows per size; with 4 in ``chips``, a 4-chip row (``seed_ref``: the seed as the CLI named it)."""
    rows: list[DecodeRow] = []
    checked: dict = {}              # (block, combine) -> the 4-chip program's correctness verdict
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
                timing, findings = judge.estimate_timing(source, task)
                rows.append(_row(label, task, judge, timing, findings, reference, price))
            if 4 in chips:
                best_one = min((r.latency_s for r in rows if r.cache_len == cache_len and r.batch == batch
                                and r.chips == 1 and r.latency_s and r.label != "XLA reference"), default=None)
                rows.append(four_chip_row(seed_ref, task, judge, best_one, price, block_kv=_block_kv(chain),
                                          checked=checked))
    return rows


def _block_kv(chain: tuple[str, list[Edit]] | None) -> int:
    """The 4-chip program's KV block: the best 1-chip kernel's, else 2048 (the ablation's usual best)."""
    for edit in (chain[1] if chain else []):
        if edit.op == "block_sizes" and edit.params.get("tunable") == "BLOCK_KV":
            return int(edit.params["value"])
    return 2048


def four_chip_row(seed_ref: str, task, judge: Judge, best_one: float | None, price: Price, *, block_kv: int,
                  checked: dict) -> DecodeRow:
    """The fastest correct 4-chip program (every combine tried) at this size."""
    from evolve import multichip

    prov = judge.provenance(task)
    common = {"label": "best 4-chip kernel", "chips": multichip.CHIPS, "batch": task.batch,
              "cache_len": task.kv_len, "timing_source": multichip.TIMING_LABEL, "chip": prov.chip,
              "libtpu_version": prov.libtpu_version, "task_key": task.key, "speedup_vs_reference": None,
              "cycles": None}
    empty = {"latency_s": None, "tokens_per_s": None, "hbm_util": None, "tokens_per_s_per_dollar": None,
             "vs_best_1_chip": None, "plan": ""}
    bk = min(block_kv, task.kv_len // multichip.CHIPS)
    if (why := multichip.fits(task)) is not None:
        return DecodeRow(status=why, **empty, **common)
    timings, failures = [], []
    for combine in multichip.COMBINES:
        key = (bk, combine)
        if key not in checked:
            checked[key] = multichip.check(seed_ref, task, block_kv=bk, combine=combine)
        if not checked[key].get("ok"):
            failures.append(f"{combine}: FAIL correctness: {checked[key].get('reason')}")
            continue
        t = multichip.time_four_chips(seed_ref, task, prov.chip, block_kv=bk, combine=combine)
        if t.status == "ok":
            timings.append(t)
        else:
            failures.append(f"{combine}: {t.status}")
    if not timings:
        return DecodeRow(status="; ".join(failures)[:240], **empty, **common)
    best = min(timings, key=lambda t: t.latency_s)
    tokens = task.batch * task.q_len / best.latency_s
    per_chip_util = (task.bytes_moved / multichip.CHIPS) / best.latency_s / judge.chip.hbm_bytes_per_s
    plan = (f"{best.combine} combine, BLOCK_KV={best.block_kv}: compute {best.compute_s * 1e6:.1f} us, HBM floor "
            f"{best.hbm_floor_s * 1e6:.1f} us, collectives {best.collectives_s * 1e6:.1f} us "
            f"({len(best.collectives)}); other combines: " +
            (", ".join(f"{t.combine} {t.latency_s * 1e6:.1f} us" for t in timings if t is not best) or "-") +
            ("; " + "; ".join(failures) if failures else ""))
    return DecodeRow(status="ok", latency_s=best.latency_s, tokens_per_s=tokens, hbm_util=per_chip_util,
                     tokens_per_s_per_dollar=tokens / (multichip.CHIPS * price.usd_per_chip_hour),
                     vs_best_1_chip=best.latency_s / best_one if best_one else None, plan=plan,
                     label=f"best 4-chip kernel ({best.combine} combine)",
                     **{k: v for k, v in common.items() if k != "label"})


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
                      "collective from evaluator/ici_model.py, summed, not overlapped); no speedup over the "
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
