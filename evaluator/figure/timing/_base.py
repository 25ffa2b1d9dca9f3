"""A timing source turns what a worker produced into a latency, and says where it came from."""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import Any

from evaluator.chips import Chip


@dataclasses.dataclass(frozen=True)
class Timing:
    """A latency, or the reason there is none."""

    latency_s: float | None
    ci_s: tuple[float, float] | None = None
    cycles: int | None = None
    error: str = ""
    # compiler_estimate: the estimate's own cycles, and the cycles the program's HBM traffic
    # needs at the chip's bandwidth; ``cycles`` is the larger (see evaluator/figure/hbm_traffic.py).
    compute_cycles: int | None = None
    hbm_cycles: int | None = None
    hbm_bytes: int | None = None
    note: str = ""                  # how the figure was made, where that is not the usual way
    chip_bytes: tuple[int, ...] = ()   # a per-chip program: each chip's kernel bytes (the floor is the most)


class TimingSource(abc.ABC):
    """Plugs into the judge at two points: the worker's environment, and reading the result."""

    name: str = ""
    description: str = ""
    # What a figure from this source is called in provenance and the archive: it changes when the
    # way figures are made changes, so that old and new figures are never compared.
    label: str = ""
    # The questions the judge asks of a source, answered by the source:
    cacheable: bool = False           # deterministic: the reference's figure may be kept on disk
    prunable: bool = False            # the runner can read the figure right after the compile (the cascade)
    needs_tpu: bool = False           # only a TPU host can give this figure
    blind_spots: tuple[str, ...] = ()  # audit findings (kernel_audit.py) this source cannot count: no figure

    def label_for(self, task: Any = None) -> str:
        """What a figure of this source on ``task`` is called in provenance and the archive."""
        return self.label or self.name

    def worker_env(self, scratch: Path) -> dict[str, str]:
        """Environment the worker needs (set before libtpu loads)."""
        return {}

    def worker_request(self) -> dict[str, Any] | None:
        """Extra work the worker must do (e.g. timed runs on a device)."""
        return None

    @abc.abstractmethod
    def read(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        """Read the latency of the program the worker just compiled/ran."""
