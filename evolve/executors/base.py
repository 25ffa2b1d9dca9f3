"""The search's one parallel seam: where a judged candidate is sent, and how many at once.

An executor takes ``submit(fn, *args) -> Future`` and runs ``fn`` (the archive's lookup, the
sandboxed judge of one candidate, the archive's append) for one of its ``workers``, and says
where the judging in it happens: ``judging(judge, task)`` is the function a submitted call
judges a source with. The local executor runs each call on a thread of this process and judges
right there (the thread only waits on the jailed worker process the judge starts); the Ray
executor (evolve/executors/ray_executor.py) runs the calls on threads of this process too, but only the
judging travels: the archive stays with its one writer, here. Executors are found by name in a
lazy registry, so an optional one costs nothing until asked for.
"""

from __future__ import annotations

import abc
import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

from seeds import Registry
from evolve.errors import UsageError

# How a submitted call judges one source: (source, cut) -> EvalResult; never raises.
Judging = Callable[..., Any]


class Executor(abc.ABC):
    name: str = ""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise UsageError(f"an executor needs at least one worker, got {workers}")
        self.workers = workers

    @classmethod
    def add_arguments(cls, parser) -> None:
        """Command-line options of this executor (``--executor NAME`` then uses them); none here."""
        return None

    @classmethod
    def options_from(cls, settings) -> dict[str, Any]:
        """This executor's constructor options, from a run's judge settings."""
        return {}

    def describe(self) -> str:
        """Where and how many at once, for the run's first line."""
        return f"here, {self.workers} at once"

    def judging(self, judge, task) -> Judging:
        """The function a submitted call judges a source of ``task`` with: here, ``judge`` itself."""
        judge.reference_timing(task)      # once, before any candidate runs
        return lambda source, cut=None: judge.evaluate(source, task, prune_above_cycles=cut)

    def judge_all(self, judge, task, sources: list[str], cut: int | None = None) -> list:
        """Judge several sources at once, one per worker; verdicts in the sources' order."""
        judging = self.judging(judge, task)
        futures = [self.submit(judging, source, cut) for source in sources]
        return [f.result() for f in futures]

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Run ``fn(*args)`` on a free worker (queued until one frees)."""

    @abc.abstractmethod
    def shutdown(self, cancel: bool = False) -> None:
        """Wait for running calls; with ``cancel``, drop the queued ones first."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.shutdown(cancel=exc_type is not None)


class LocalExecutor(Executor):
    """``workers`` threads of this process, each driving one sandboxed judge at a time."""

    name = "local"

    def __init__(self, workers: int = 0) -> None:
        super().__init__(workers or os.cpu_count() or 1)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="judge")

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def shutdown(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=cancel)


# A family (seeds/registry.py): built-ins here, others by the entry-point group pallas_evolve.executors.
EXECUTORS = Registry("executors", {"local": "evolve.executors.base:LocalExecutor",
                                   "ray": "evolve.executors.ray_executor:RayExecutor"}, member="executor")


def make_executor(name: str, workers: int = 0, **options: Any) -> Executor:
    """Executor ``name`` with ``workers`` calls at once (0: as many as it has cores or chips)."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r}; use one of: {', '.join(EXECUTORS.names())}")
    return EXECUTORS.load(name)(workers, **options)


def open_executor(settings) -> Executor:
    """The executor a run's judge settings (evolve.config.JudgeSettings) name, with its options."""
    cls = EXECUTORS.load(settings.executor)
    return cls(settings.workers, **cls.options_from(settings))
