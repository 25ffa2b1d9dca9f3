"""Run untrusted code in a child process: its own session, limits, bounded output, hard deadlines.

The parent enforces every budget from outside: a stage that runs past its budget is ended with
SIGKILL to the child's whole process group (and to any descendant that left the group), which
works even while the child is deep in native code (a Mosaic compile) where a signal handler of its
own would never run.

A budget is **CPU time**: the user and system seconds of the child and every process under it
(threads included, and children they reaped), read from /proc. So a verdict does not depend on
how busy the machine is: a compile that needs 200 CPU seconds gets them whether it shares the
cores with two other jobs or not. A child that sleeps (a deadlock, a hang in native code) uses no
CPU; it is ended by a wall-clock backstop of ``WALL_BACKSTOP`` times the budget.

The child reports progress as JSON lines on a private pipe (its file descriptor is passed in the
environment variable ``PALLAS_EVOLVE_PROTOCOL_FD``); its stdout and stderr are merged, read by a
thread and cut to a bounded head and tail, so 100 MB of prints cost the parent nothing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import resource
import signal
import subprocess
import threading
import time
from typing import Any

PROTOCOL_FD_ENV = "PALLAS_EVOLVE_PROTOCOL_FD"
# A stage's wall-clock backstop, in multiples of its CPU budget: room for a CPU-bound child that gets a
# third of a core on a loaded machine, while a sleeping one is still ended.
WALL_BACKSTOP = 3.0
# How often the child's CPU time is read (it walks /proc; the exit itself is polled more often).
_CPU_POLL_S = 0.25
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_PROTOCOL_BYTES = 4 << 20
_PR_SET_PDEATHSIG = 1

# Children alive right now, so that SIGTERM / Ctrl-C on the parent can take them all down.
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()
_SHUTTING_DOWN = threading.Event()


class Interrupted(BaseException):
    """The orchestrator is shutting down: no verdict, nothing to archive. A BaseException so that
    the judge's never-raise net (``except Exception``) lets it through."""


def kill_all_children() -> None:
    """Kill every sandboxed child of this process (and their descendants) and start no more.
    Called from the orchestrator's SIGTERM / SIGINT handler."""
    _SHUTTING_DOWN.set()
    with _LIVE_LOCK:
        pids = list(_LIVE)
    for pid in pids:
        kill_tree(pid)


try:   # loaded here, not between fork and exec: no imports (and their locks) in the forked child
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it dies (even by kill -9)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one child process."""

    # RLIMIT_AS: libtpu maps ~1 GB of code; compiles need more (a variant of ragged paged attention
    # at its default task, trips.py, peaks at 4 GB resident; 8 GB of address space ran out).
    memory_bytes: int = 12 << 30
    file_bytes: int = 256 << 20        # RLIMIT_FSIZE: largest file the child may write
    open_files: int = 1024             # RLIMIT_NOFILE
    max_output_bytes: int = 64 << 10   # stdout+stderr kept (half head, half tail)

    def __post_init__(self) -> None:
        if self.memory_bytes < (1 << 30):
            raise ValueError("memory_bytes below 1 GiB cannot even load jax; raise it")


@dataclasses.dataclass(frozen=True)
class ChildOutcome:
    """What happened to a child: its protocol messages, how it ended, and its (bounded) output."""

    events: tuple[dict[str, Any], ...]
    returncode: int | None
    timed_out_stage: str | None      # the stage whose budget ran out, if any
    output: str
    output_dropped_bytes: int
    wall_time_s: float
    # Of the timed-out stage: the CPU seconds it used, and whether the wall-clock backstop ended it.
    timed_out_cpu_s: float | None = None
    timed_out_by_wall: bool = False
    # A warm start's child that its zygote took down with it: no verdict of its own, to be run again.
    lost: bool = False

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    def stage_seconds(self) -> dict[str, float]:
        """Wall seconds per stage, by when the parent heard each announced (``start``: before the
        first; a stage announced twice sums): where a child's time went."""
        marks = [(str(e["stage"]), float(e["_at"])) for e in self.events
                 if e.get("event") == "stage" and "stage" in e and isinstance(e.get("_at"), float)]
        out: dict[str, float] = {"start": marks[0][1] if marks else self.wall_time_s}
        for (stage, at), (_, end) in zip(marks, [*marks[1:], ("", self.wall_time_s)], strict=True):
            out[stage] = round(out.get(stage, 0.0) + max(end - at, 0.0), 3)
        out["start"] = round(out["start"], 3)
        return out


def _set_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    _die_with_parent()


def _descendants(root: int) -> set[int]:
    """All live descendants of ``root`` (read from /proc), including ones that left the group."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def cpu_seconds(root: int) -> float:
    """User and system CPU seconds of ``root`` and its live descendants, threads included, and of
    the children they have reaped (their ``cutime``/``cstime``)."""
    total = 0
    for pid in (root, *_descendants(root)):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().decode(errors="replace").rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])     # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
    return total / _TICKS


def kill_tree(pid: int) -> None:
    """SIGKILL a child's process group and every descendant of it, wherever they went."""
    for _ in range(3):   # a fork bomb may spawn between the scan and the kill: repeat
        targets = _descendants(pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for other in targets:
            try:
                os.kill(other, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not _descendants(pid):
            break


class _BoundedReader(threading.Thread):
    """Drains a pipe, keeping at most ``limit`` bytes: the first half and the last half."""

    def __init__(self, stream, limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.half = stream, max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def run(self) -> None:
        while True:
            chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
            if not chunk:
                break
            room = self.half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        gap = f"\n[... {self.dropped} bytes of output dropped ...]\n" if self.dropped else ""
        return (bytes(self.head).decode(errors="replace") + gap
                + bytes(self.tail).decode(errors="replace"))


class _ProtocolReader(threading.Thread):
    """Reads the child's JSON lines; each event gets ``_at``, the parent's seconds since ``start``
    when it arrived (the child's own clock is never read)."""

    def __init__(self, fd: int, start: float) -> None:
        super().__init__(daemon=True)
        self.fd, self.t0 = fd, start
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        total = 0
        with os.fdopen(self.fd, "rb") as fh:
            for line in fh:
                total += len(line)
                if total > _MAX_PROTOCOL_BYTES:
                    continue   # keep draining so the child never blocks, but store nothing more
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    event["_at"] = time.monotonic() - self.t0
                    with self.lock:
                        self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)


def _popen(argv: list[str], *, cwd: str, env: dict[str, str], protocol_fd: int, limits: Limits):
    """A cold start: a fresh process of ``argv``."""
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, pass_fds=(protocol_fd,), start_new_session=True,
        preexec_fn=lambda: _set_limits(limits), close_fds=True)


def run_child(argv: list[str], *, cwd: str, env: dict[str, str], budgets: dict[str, float],
              default_budget: float, limits: Limits = Limits(), poll_s: float = 0.05,
              total_budget: float | None = None, launch=None) -> ChildOutcome:
    """Run ``argv`` sandboxed; each stage it announces gets ``budgets[stage]`` CPU seconds (and
    ``WALL_BACKSTOP`` times as many wall-clock seconds).

    The child announces a stage with a protocol line ``{"event": "stage", "stage": NAME}``;
    time before its first announcement counts against ``default_budget``. However it announces
    stages, the child never gets more than ``total_budget`` CPU seconds in all (by default the sum
    of every budget; the backstop likewise): a child that keeps announcing new stages cannot run
    forever.

    ``launch(cwd=, env=, protocol_fd=, limits=)`` starts the child another way (a warm start,
    zygote.py) and returns what ``subprocess.Popen`` would (pid, stdout, poll, wait, returncode);
    the child is watched, budgeted and killed the same way.
    """
    if _SHUTTING_DOWN.is_set():
        raise Interrupted("shutting down")
    read_fd, write_fd = os.pipe()
    child_env = dict(env, **{PROTOCOL_FD_ENV: str(write_fd)})
    start = time.monotonic()
    try:
        proc = (launch or functools.partial(_popen, argv))(cwd=cwd, env=child_env, protocol_fd=write_fd,
                                                          limits=limits)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    with _LIVE_LOCK:
        _LIVE.add(proc.pid)
    output = _BoundedReader(proc.stdout, limits.max_output_bytes)
    protocol = _ProtocolReader(read_fd, start)
    output.start()
    protocol.start()

    total = total_budget if total_budget is not None else default_budget + sum(budgets.values())
    stage, budget, timed_out = None, default_budget, None
    stage_wall = start
    cpu = stage_cpu0 = 0.0
    by_wall, next_read = False, start
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now >= next_read:
                cpu, next_read = cpu_seconds(proc.pid), now + _CPU_POLL_S
            events = protocol.snapshot()
            starts = [e for e in events if e.get("event") == "stage"]
            if starts and starts[-1].get("stage") != stage:
                stage = str(starts[-1].get("stage"))
                budget, stage_cpu0, stage_wall = budgets.get(stage, default_budget), cpu, now
            over_cpu = cpu - stage_cpu0 > budget or cpu > total
            by_wall = now - stage_wall > WALL_BACKSTOP * budget or now - start > WALL_BACKSTOP * total
            if over_cpu or by_wall:
                timed_out = stage or "start"
                break
            time.sleep(poll_s)
    finally:
        if timed_out is not None:
            cpu = cpu_seconds(proc.pid)
        # Always: the whole group goes, leftovers of a fork included; also on Ctrl-C here.
        kill_tree(proc.pid)
        proc.wait()
        with _LIVE_LOCK:
            _LIVE.discard(proc.pid)
    output.join(timeout=5)
    protocol.join(timeout=5)
    if _SHUTTING_DOWN.is_set():
        raise Interrupted("shutting down")
    return ChildOutcome(events=tuple(protocol.snapshot()), returncode=proc.returncode,
                        timed_out_stage=timed_out, output=output.text(),
                        output_dropped_bytes=output.dropped, wall_time_s=time.monotonic() - start,
                        timed_out_cpu_s=None if timed_out is None else round(cpu - stage_cpu0, 1),
                        timed_out_by_wall=timed_out is not None and by_wall and not over_cpu,
                        lost=bool(getattr(proc, "lost", False)))


class Reporter:
    """The child's side of the protocol."""

    def __init__(self) -> None:
        fd = os.environ.get(PROTOCOL_FD_ENV)
        self._fh = os.fdopen(int(fd), "w", buffering=1) if fd else None

    def send(self, **event: Any) -> None:
        line = json.dumps(event, default=str)
        if self._fh is not None:
            self._fh.write(line + "\n")
            self._fh.flush()

    def stage(self, name: str) -> None:
        self.send(event="stage", stage=name)

    def error(self, stage: str, exc: BaseException) -> None:
        import traceback

        message = f"{type(exc).__name__}: {exc}"
        self.send(event="error", stage=stage, kind=type(exc).__name__, message=message[:4000],
                  traceback="".join(traceback.format_exception(exc))[-4000:])
