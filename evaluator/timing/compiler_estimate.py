"""The TPU compiler's own static cycle estimate, read from its LLO profile dump (no TPU needed).

libtpu writes ``<dir>/<hlo op>_static_llo_profile.textproto`` for every op it compiles when
``--xla_jf_dump_static_llo_profile_to=<dir>`` is in ``LIBTPU_INIT_ARGS`` before it loads. A
Pallas kernel gives one file (its custom call) plus one per surrounding op (copies, fusions);
a plain XLA program one per fusion. The program's estimate is the sum of all of them.
The flag is internal to libtpu: when no file appears we say so rather than guess.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from evaluator.chips import Chip
from evaluator.timing._base import Timing, TimingSource

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


class CompilerEstimate(TimingSource):
    name = "compiler_estimate"
    label = "compiler_estimate+hbm"     # before the HBM floor (2026-11-23): "compiler_estimate"
    description = ("libtpu's static cycle estimate of the compiled program, never less than the "
                   "program's HBM traffic over the chip's bandwidth, divided by the chip clock")

    def worker_env(self, scratch: Path) -> dict[str, str]:
        return {"LIBTPU_INIT_ARGS": f"{DUMP_FLAG}={scratch / 'llo'}"}

    def read(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        compile_facts = stage_data.get("compile", {})
        hbm_bytes = compile_facts.get("hbm_bytes")
        # Only the task's own XLA program (trusted) may have ops without an estimate: they are
        # counted by the program's HBM traffic. A candidate's never are (FAIL_TIMING).
        unestimated: list[str] | None = [] if compile_facts.get("trusted") and hbm_bytes else None
        cycles, why = read_cycles(scratch / "llo", unestimated=unestimated)
        if cycles is None:
            return Timing(None, error=why)
        if compile_facts.get("hbm_blind"):
            return Timing(None, error=("the static estimate counts a DMA's issue, not its transfer, and "
                                       "this program moves data the HBM traffic model cannot count: "
                                       + "; ".join(compile_facts.get("hbm_notes", [])[:3])
                                       + "; time it on a TPU host"))
        if hbm_bytes is None:      # a runner that predates the traffic model
            return Timing(cycles / chip.clock_hz, cycles=cycles, compute_cycles=cycles)
        hbm_cycles = math.ceil(int(hbm_bytes) / chip.hbm_bytes_per_s * chip.clock_hz)
        total = max(cycles, hbm_cycles)
        note = (f"ops without a static estimate, counted by the program's HBM traffic only: "
                f"{', '.join(unestimated)}" if unestimated else "")
        return Timing(total / chip.clock_hz, cycles=total, compute_cycles=cycles, hbm_cycles=hbm_cycles,
                      hbm_bytes=int(hbm_bytes), note=note)
