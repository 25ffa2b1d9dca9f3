"""Calls into MLflow that may fail without stopping the run: warn once, retry locks, give up."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("pallas_evolve.mlflow")
T = TypeVar("T")

_LOCKED = ("database is locked", "database table is locked", "sqlite_busy")


def _is_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in _LOCKED)


class BestEffort:
    """Run MLflow calls; a failure is a warning (logged once), never an exception.

    A "database is locked" error is retried with backoff. After ``max_failures`` consecutive
    failures every later call is skipped, so an unreachable store cannot slow the run down.
    """

    def __init__(self, max_failures: int = 3, lock_retries: int = 6):
        self.max_failures = max_failures
        self.lock_retries = lock_retries
        self.consecutive_failures = 0
        self.errors: list[str] = []
        self.disabled = False

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        if self.disabled:
            return None
        for attempt in range(self.lock_retries + 1):
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 (best-effort: any MLflow failure is a warning)
                if _is_locked(exc) and attempt < self.lock_retries:
                    time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
                    continue
                self._failed(fn, exc)
                return None
            self.consecutive_failures = 0
            return result
        return None

    def _failed(self, fn: Callable, exc: BaseException) -> None:
        name = getattr(fn, "__name__", repr(fn))
        message = f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        self.errors.append(message)
        self.consecutive_failures += 1
        if len(self.errors) == 1:
            logger.warning("MLflow tracking failed (%s); the run goes on and the Parquet archive keeps "
                           "every result; rebuild the MLflow side later with `evolve sync`", message)
        if self.consecutive_failures >= self.max_failures:
            self.disabled = True
            logger.warning("MLflow tracking switched off for this run after %d consecutive failures",
                           self.consecutive_failures)
