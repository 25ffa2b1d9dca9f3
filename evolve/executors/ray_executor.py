"""The Ray executor: many machines judge, one orchestrator keeps the archive.

The search submits calls as it does to the local executor, and they run on threads of this
process: the archive's lookup and append stay here, with the archive's one writer. Only the
judging travels. ``judging(judge, task)`` puts the task's ``JudgeSpec`` (evaluator/remote.py: the
judge's configuration, the task's text and fields, the reference timing and the ground truth this
process made once) in Ray's object store; each judged source is then one Ray task,
``judge_on_this_node(spec, source, cut)``, which returns the verdict. A node needs the package
installed, not the data directory nor a seed directory: sources and inputs travel through Ray.

Resources: one task per TPU chip (Ray's ``TPU`` resource) when the cluster has TPUs, else one per
CPU core; ``workers`` 0 means as many tasks at once as that.

Faults: a task whose worker or node dies is judged once more (Ray's ``max_retries=1``); if that
is lost too, the verdict is CRASH with the reason. ``shutdown(cancel=True)`` (SIGTERM, Ctrl-C)
cancels every task in flight (force: the worker processes die, and the jailed children with
them), and a Ray started for the run (no address given) is shut down with it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from evaluator import EvalResult, Status
from evaluator import Interrupted
from evolve.errors import UsageError
from evolve.executors.base import Executor, Judging

INSTALL = "pip install 'pallas-evolve[ray]'"
PROBE_TIMEOUT_S = 5.0
# Lost workers: Ray re-runs such a task once (max_retries) before its error reaches us.
_LOST = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ObjectLostError",
         "OwnerDiedError", "LocalRayletDiedError", "RaySystemError")


def import_ray():
    """Ray, or a one-line UsageError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"the ray executor needs Ray, which is not installed here; install the extra: "
                         f"{INSTALL}") from None
    return ray


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """A UsageError unless something answers at ``address`` (host:port) within ``timeout`` s:
    Ray's own connection attempts to a dead address take minutes."""
    where = address.split("://", 1)[-1]
    host, sep, port = where.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"bad Ray address {address!r}: expected HOST:PORT (e.g. 10.0.0.2:6379) or 'auto'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UsageError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
                         "'ray start --head' or fix --ray-address / RAY_ADDRESS") from None


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RayExecutor(Executor):
    name = "ray"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                            help="with --executor ray: join this cluster (default $RAY_ADDRESS; neither: a Ray "
                                 "is started for the run and stopped after it)")

    @classmethod
    def options_from(cls, settings) -> dict:
        return {"address": settings.ray_address}

    def __init__(self, workers: int = 0, address: str = "") -> None:
        if workers < 0:
            raise UsageError(f"workers must be 0 (one per core or chip) or more, got {workers}")
        ray = self._ray = import_ray()
        address = address or os.environ.get("RAY_ADDRESS", "")
        if address and address != "auto":
            probe(address)
        self._owned = not ray.is_initialized()
        if self._owned:
            self._init(ray, address, workers)
        try:
            resources = ray.cluster_resources()
            tpus, cpus = int(resources.get("TPU", 0)), int(resources.get("CPU", 0))
            super().__init__(workers or tpus or cpus or 1)
        except BaseException:
            if self._owned:
                ray.shutdown()
            raise
        self.where = f"Ray at {address}" if address else "a Ray started for this run"
        self.slots = f"{tpus} TPU chips" if tpus else f"{cpus} CPU cores"
        options: dict[str, Any] = {"num_cpus": 1, "max_retries": 1}
        if tpus:
            options["resources"] = {"TPU": 1}
        from evaluator import judge_on_this_node, warm_up

        self._task = ray.remote(judge_on_this_node).options(**options)
        # Every worker process loads the judge and tries its jail while this process times the
        # reference, not on the first candidate's clock. Nothing waits on these.
        self._warming = [ray.remote(warm_up).options(**options).remote() for _ in range(self.workers)]
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="ray-judge")
        self._in_flight: set = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False

    @staticmethod
    def _init(ray, address: str, workers: int) -> None:
        # ray.init replaces SIGTERM's handler with its own (sys.exit): keep ours, which cancels.
        handler = signal.getsignal(signal.SIGTERM)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                         logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise UsageError(f"cannot join the Ray cluster at {address or 'a local Ray'}: "
                             f"{_one_line(exc)}") from None
        finally:
            if threading.current_thread() is threading.main_thread() and handler is not None:
                signal.signal(signal.SIGTERM, handler)

    def describe(self) -> str:
        return f"on {self.where} ({self.slots}), {self.workers} at once"

    # ---- the seam ---------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def judging(self, judge, task) -> Judging:
        from evaluator import JudgeSpec

        spec = self._ray.put(JudgeSpec.of(judge, task))   # once per task: every node reads it from Ray
        provenance = judge.provenance(task)

        def judge_remotely(source: str, cut: int | None = None) -> EvalResult:
            return self._judge(spec, provenance, source, cut)

        return judge_remotely

    def _judge(self, spec, provenance, source: str, cut: int | None) -> EvalResult:
        ray = self._ray
        with self._lock:
            if self._closing.is_set():
                raise Interrupted()
            ref = self._task.remote(spec, source, cut)
            self._in_flight.add(ref)
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            if self._closing.is_set() or isinstance(exc, ray.exceptions.TaskCancelledError):
                raise Interrupted() from None
            kind = type(exc).__name__
            why = (f"the Ray worker judging it was lost, and again when it was judged once more ({kind}: "
                   if any(k in kind for k in _LOST) else f"the Ray task failed ({kind}: ")
            return EvalResult(Status.CRASH, stage="judge", provenance=provenance, error=why + _one_line(exc) + ")")
        finally:
            with self._lock:
                self._in_flight.discard(ref)

    def shutdown(self, cancel: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if cancel:
            with self._lock:
                self._closing.set()
                refs = list(self._in_flight)
            for ref in refs:
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - finished meanwhile, or Ray already gone
                    pass
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        if self._owned:
            self._ray.shutdown()
