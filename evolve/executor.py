"""The search's one parallel seam: where a judged candidate is sent, and how many at once.

An executor takes ``submit(fn, *args) -> Future`` and runs ``fn`` (the sandboxed judge of one
candidate) on one of its ``workers``. The search never knows where that happens: the local
executor runs each call on a thread of this process (the thread only waits on the jailed worker
process the judge starts), and a distributed executor plugs in here with the same two methods.
Executors are found by name in a lazy registry, so an optional one costs nothing until asked for.
"""

from __future__ import annotations

import abc
import concurrent.futures
import importlib
from collections.abc import Callable
from typing import Any

from evolve.errors import UsageError


class Executor(abc.ABC):
    name: str = ""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise UsageError(f"an executor needs at least one worker, got {workers}")
        self.workers = workers

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

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="judge")

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def shutdown(self, cancel: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=cancel)


# name -> "module:Class"; imported only when asked for.
EXECUTORS = {"local": "evolve.executor:LocalExecutor"}


def make_executor(name: str, workers: int, **options: Any) -> Executor:
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor {name!r}; use one of: {', '.join(sorted(EXECUTORS))}")
    module, cls = EXECUTORS[name].split(":")
    return getattr(importlib.import_module(module), cls)(workers, **options)
