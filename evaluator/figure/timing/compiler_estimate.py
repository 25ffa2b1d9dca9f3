"""The TPU compiler's own static cycle estimate, read from its LLO profile dump (no TPU needed).

libtpu writes ``<dir>/<hlo op>_static_llo_profile.textproto`` for every op it compiles when
``--xla_jf_dump_static_llo_profile_to=<dir>`` is in ``LIBTPU_INIT_ARGS`` before it loads. A
Pallas kernel gives one file (its custom call) plus one per surrounding op (copies, fusions);
a plain XLA program one per fusion. The program's estimate is the sum of all of them.
The flag is internal to libtpu: when no file appears we say so rather than guess.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from evaluator.chips import Chip
from evaluator.figure.dmas import unbalanced
from evaluator.figure.timing._base import Timing, TimingSource

_CYCLES_RE = re.compile(r"estimated_cycles:\s*(\d+)")
DUMP_FLAG = "--xla_jf_dump_static_llo_profile_to"


_OP_RE = re.compile(r'hlo_op_name:\s*"([^"]*)"')
_DMA_RE = re.compile(r"dma_instruction_type:\s*(\w+)")


def read_cycles(dump_dir: Path, *, unestimated: list[str] | None = None) -> tuple[int | None, str]:
    """The program's estimated cycles, or None and why there is no trustworthy figure.

    An op the profiler gives 0 cycles (libtpu 0.0.42.1 does so for XLA ops it implements with
    DMAs, e.g. a decode-shaped contraction streaming the KV cache) ends the reading, unless the
    caller passes ``unestimated``: then the op is named there and left out of the sum, and the
    caller must count it some other way (the trusted reference counts it by its HBM traffic).
    """
    files = sorted(dump_dir.glob("*static_llo_profile*.textproto")) if dump_dir.is_dir() else []
    if not files:
        return None, ("the TPU compiler wrote no static LLO profile: this libtpu does not support "
                      f"{DUMP_FLAG}; use libtpu 0.0.42.1 (pinned) or time on a TPU host")
    total = 0
    for path in files:
        text = path.read_text(errors="replace")
        # Only the first estimate per file: the op's own total (nested entries would double-count).
        match = _CYCLES_RE.search(text)
        cycles = int(match.group(1)) if match else 0
        if cycles == 0:
            op = _OP_RE.search(text)
            dma = _DMA_RE.search(text)
            what = f"'{op.group(1) if op else path.name}'" + (f" ({dma.group(1)})" if dma else "")
            if unestimated is not None:
                unestimated.append(what)
                continue
            return None, (f"the TPU compiler's static profile has no estimate (0 cycles) for op {what}"
                          "; this kernel can only be timed on a TPU host")
        total += cycles
    return total, ""


def read_mesh_cycles(dump_dir: Path, hlo_text: str, chip_name: str):
    """A multi-chip program's compute cycles (every op but its collectives) and its collectives'
    cost by the ICI model: (cycles, the model's result, "") or (None, None, why there is none).
    The only 0-cycle ops allowed are the collectives the model costs; anything else refuses it."""
    from evaluator.figure.ici_model import ICI_FIGURES, model_collectives

    if chip_name not in ICI_FIGURES:
        return None, None, f"the ICI model has no figures for {chip_name}"
    ici = model_collectives(dump_dir, chip_name, hlo_text=hlo_text)
    if not ici.complete:
        return None, None, "the ICI model cannot cost " + "; ".join(
            f"{u.kind} {u.op_name} ({u.reason})" for u in ici.not_modelled)
    unestimated: list[str] = []
    cycles, why = read_cycles(dump_dir, unestimated=unestimated)
    stray = [u for u in unestimated if u.split("'")[1] not in ici.op_names]
    if cycles is None:
        return None, None, why
    if stray:
        return None, None, (f"0-cycle ops that are no modelled collective: {', '.join(stray)}; "
                            "this program can only be timed on a TPU host")
    return cycles, ici, ""


class CompilerEstimate(TimingSource):
    name = "compiler_estimate"
    # Loops and branches on data counted on the timing input (2026-11-24, trips.py); before that
    # "compiler_estimate+hbm" (they were refused), and before the HBM floor (2026-11-23)
    # "compiler_estimate".
    label = "compiler_estimate+hbm+trips"
    description = ("libtpu's static cycle estimate of the compiled program, never less than the "
                   "program's HBM traffic over the chip's bandwidth, divided by the chip clock; loops and "
                   "branches on data counted on every input set, the slowest set's figure (static variants "
                   "of the kernel)")
    cacheable = True
    prunable = True
    # Constructs the static estimate cannot count (measured in the README): such a kernel may be
    # correct, but its estimate is not a figure (FAIL_TIMING naming the construct), unless the
    # runner counted them on the timing input (kernel_audit.COUNTED_ON_DATA, trips.py).
    blind_spots = ("data_dependent_loop", "data_dependent_branch", "xla_loop", "xla_branch", "unparsed_kernel")

    def label_for(self, task=None) -> str:
        """A task with a mesh adds the ICI model (``evaluator/figure/ici_model.py``) to every figure, a
        1-chip candidate's (no collective) included, so that all the figures of one task are one
        model and no other figure is compared with them."""
        return self.label + ("+ici_model" if task is not None and task.chips > 1 else "")

    def worker_env(self, scratch: Path) -> dict[str, str]:
        return {"LIBTPU_INIT_ARGS": f"{DUMP_FLAG}={scratch / 'llo'}"}

    def read(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        """The figure; where the work depends on the data (loops, branches and DMAs counted per
        input set, ``trips``; index maps that read the data, ``traffic``), the slowest set's, so
        that no kernel is timed on its easiest input. A set that cannot be counted refuses it."""
        sets = _per_set(stage_data)
        if len(sets) <= 1:
            return self._read_one(scratch, sets[0], chip)
        timings = [self._read_one(scratch, data, chip) for data in sets]
        for i, t in enumerate(timings):
            if t.latency_s is None:
                return Timing(None, error=f"input set {i + 1}: {t.error}")
        slowest = max(range(len(timings)), key=lambda i: (timings[i].cycles, -i))
        figures = ", ".join(f"{t.cycles:,}" for t in timings)
        note = f"the slowest of {len(timings)} input sets, set {slowest + 1} (cycles per set: {figures})"
        t = timings[slowest]
        return dataclasses.replace(t, note="; ".join(filter(None, [t.note, note])))

    def _read_one(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        facts = stage_data.get("compile", {})
        if facts.get("hbm_estimate_misses"):
            return Timing(None, error="the static estimate leaves out work this program does: "
                                      + "; ".join(facts["hbm_estimate_misses"][:3]) + "; time it on a TPU host")
        hbm_bytes = facts.get("hbm_bytes")
        chips = facts.get("chips", 1)
        counted = stage_data.get("trips") or {}     # counted on the data (trips.py, dmas.py), one set's
        ici_cycles, note = 0, ""
        if chips > 1:
            # A per-chip program on the mesh: per chip, max(compute, the busiest chip's HBM floor),
            # then every collective as the ICI model costs it, summed as if serial and not
            # overlapped with compute (evaluator/figure/ici_model.py).
            try:
                hlo = (scratch / "hlo.txt").read_text()
            except OSError:
                return Timing(None, error="the runner wrote no HLO for the ICI model to read")
            cycles, ici, why = read_mesh_cycles(scratch / "llo", hlo, chip.name)
            if ici is not None:
                ici_cycles = math.ceil(ici.seconds * chip.clock_hz)
                note = f"{chips} chips; collectives by the ICI model: " + "; ".join(
                    f"{c.collective.kind} {c.collective.bytes} B {c.seconds * 1e6:.2f} us" for c in ici.costs)
        else:
            # Only the task's own XLA program (trusted) may have ops without an estimate: they are
            # counted by the program's HBM traffic. A candidate's never are (FAIL_TIMING).
            unestimated: list[str] | None = [] if facts.get("trusted") and hbm_bytes else None
            if counted:
                cycles, why = counted.get("cycles"), counted.get("error", "")
                if cycles is not None and counted.get("sites"):
                    note = (f"loops and branches on data counted ({len(counted['sites'])} site(s), "
                            f"{1 + len(counted.get('variants', []))} variant(s), "
                            f"{len(counted.get('linear_checks', []))} linearity check(s))")
            else:
                cycles, why = read_cycles(scratch / "llo", unestimated=unestimated)
            if unestimated and cycles is not None:
                cycles, note = _unestimated_floor(cycles, unestimated, facts.get("op_flops") or {}, chip)
        if cycles is None:
            return Timing(None, error=why)
        if (why := unbalanced(counted)) is not None:
            return Timing(None, error=why)
        if facts.get("hbm_blind") and "dma_bytes" in counted and hbm_bytes is not None:
            # the kernels' own DMAs, counted as they ran on the data (dmas.py)
            hbm_bytes = int(hbm_bytes) + int(counted["dma_bytes"])
            note = "; ".join(filter(None, [note, f"the kernels' own DMAs counted as they ran: "
                                                 f"{int(counted['dma_bytes']):,} bytes"]))
        elif facts.get("hbm_blind") or (chips > 1 and hbm_bytes is None):
            return Timing(None, error=("the static estimate counts a DMA's issue, not its transfer, and "
                                       "this program moves data the HBM traffic model cannot count: "
                                       + "; ".join(facts.get("hbm_notes", [])[:3])
                                       + "; time it on a TPU host"))
        if hbm_bytes is None:      # a runner that predates the traffic model
            return Timing(cycles / chip.clock_hz, cycles=cycles, compute_cycles=cycles)
        hbm_cycles = math.ceil(int(hbm_bytes) / chip.hbm_bytes_per_s * chip.clock_hz)
        total = max(cycles, hbm_cycles) + ici_cycles
        return Timing(total / chip.clock_hz, cycles=total, compute_cycles=cycles, hbm_cycles=hbm_cycles,
                      hbm_bytes=int(hbm_bytes), note=note,
                      chip_bytes=tuple(int(b) for b in facts.get("per_chip_kernel_bytes", ())))


def _unestimated_floor(cycles: int, unestimated: list[str], op_flops: dict[str, int], chip: Chip) -> tuple[int, str]:
    """The trusted program's figure with each op the profile gave 0 cycles counted at its matmul
    work at the chip's peak (``xla_flops.py``), and the note naming them; an op without matmul
    work is left to the program's HBM traffic (the floor the caller applies)."""
    from evaluator.figure.xla_flops import floor_cycles

    parts = []
    for what in unestimated:
        flops = op_flops.get(what.split("'")[1] if "'" in what else what, 0)
        if flops:
            cycles += floor_cycles(flops, chip.peak_flops, chip.clock_hz)
            parts.append(f"{what} at its {flops:,} matmul FLOPs at peak")
        else:
            parts.append(f"{what} by the program's HBM traffic")
    return cycles, "ops without a static estimate, counted at their floor: " + ", ".join(parts)


NO_VMEM_MSA_FLAG = "--xla_vf_vmem_memory_space_assignment=false"


class CompilerEstimateNoVmemMsa(CompilerEstimate):
    """The compiler estimate of every program compiled with XLA's VMEM memory-space assignment off.

    libtpu 0.0.42.1's static profiler aborts on any op holding a VMEM-to-SMEM copy ("Unsupported
    DMA direction: 10"), which XLA makes when it puts small integer arrays computed in the program
    (a grouped matmul's group metadata, XLA's own ``ragged_dot``) in VMEM. With the assignment off
    they stay in HBM and the profiler estimates them. The flag moves other programs' estimates too
    (a plain ``jnp.dot`` by about 1%), so this is a source of its own, for a task whose programs all
    need it: its figures are labelled apart and never compared with ``compiler_estimate``'s."""

    name = "compiler_estimate_no_vmem_msa"
    label = "compiler_estimate+hbm+trips+no_vmem_msa"
    description = CompilerEstimate.description + "; every program compiled with " + NO_VMEM_MSA_FLAG

    def worker_env(self, scratch: Path) -> dict[str, str]:
        return {"LIBTPU_INIT_ARGS": f"{DUMP_FLAG}={scratch / 'llo'} {NO_VMEM_MSA_FLAG}"}


def _per_set(stage_data: dict[str, dict]) -> list[dict[str, dict]]:
    """The stage data as each input set would give it (the runner's ``trips`` facts per set and
    ``traffic`` bytes per set); one entry where the figure does not depend on the set."""
    counted = (stage_data.get("trips") or {}).get("sets") or []
    traffic = (stage_data.get("traffic") or {}).get("hbm_bytes_per_set") or []
    n = max(len(counted), len(traffic))
    if n <= 1 and not (stage_data.get("traffic") or {}).get("walked_on_counts"):
        return [stage_data]
    out = []
    for i in range(n):
        data = dict(stage_data)
        if counted:
            data["trips"] = counted[min(i, len(counted) - 1)]
        if traffic:
            data["compile"] = dict(stage_data.get("compile", {}), hbm_bytes=traffic[min(i, len(traffic) - 1)])
            if stage_data["traffic"].get("walked_on_counts"):    # walked on what the counted run ran on
                data["compile"] |= {k: stage_data["traffic"][k] for k in ("hbm_blind", "hbm_notes")}
        out.append(data)
    return out
