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


class TimingSource(abc.ABC):
    """Plugs into the judge at two points: the worker's environment, and reading the result."""

    name: str = ""
    description: str = ""

    def worker_env(self, scratch: Path) -> dict[str, str]:
        """Environment the worker needs (set before libtpu loads)."""
        return {}

    def worker_request(self) -> dict[str, Any] | None:
        """Extra work the worker must do (e.g. timed runs on a device)."""
        return None

    @abc.abstractmethod
    def read(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        """Read the latency of the program the worker just compiled/ran."""
