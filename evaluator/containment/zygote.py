"""A warm start for the judge's children: a parent that has imported JAX forks each one.

Started cold, every child (the jailed worker, the trusted runner) spends a second or two importing
JAX, Pallas and the judge's modules before it does anything for its kernel. A **zygote** does that
once: a trusted process, started by the judge with the children's environment, that imports them
(it initialises no backend, loads no libtpu, starts no thread of its own and runs no candidate
code) and then only forks. For each child the judge sends it the child's command, environment,
directory, limits and, when the child is jailed, its scratch directory, with the two pipe ends the
child writes to. The fork, before it runs anything of the child's:

* closes every descriptor but its output and protocol pipes (the zygote's socket included: a
  child can never ask the zygote for anything), starts its own session, takes the child's
  environment, directory and limits (``sandbox._set_limits``: it dies with the zygote);
* when jailed, enters fresh namespaces and drops to ``nobody`` (``jail.enter_here``), as the cold
  start's ``unshare ... jail.py`` does;
* then runs the child's ``main``, and exits.

So every child is a fresh copy of the same warm process: nothing a candidate did (its memory, its
imports, monkeypatches of JAX, files, processes) exists in the zygote, and so none of it reaches the
next child (tests/evaluator/containment/test_zygote.py has a candidate try). The parent's sandbox
watches, budgets and kills the child by its PID exactly as a cold one (``run_child``); the zygote
tells it the child's exit status. A zygote that dies is started again for the next child; a child
it took down with it is run again, cold (``Children.run``). ``PALLAS_EVOLVE_WARM=0`` starts every
child cold.

Run as ``python -m evaluator.containment.zygote FD`` (FD: its end of a SOCK_SEQPACKET socket pair).
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from evaluator.containment.sandbox import PROTOCOL_FD_ENV

# What a child would import first: the judge's two children and what they import at their start.
PRELOAD = ("numpy", "jax", "jax.numpy", "jax.experimental.pallas", "jax.experimental.pallas.tpu",
           "jax.experimental.topologies", "evaluator.containment.worker", "evaluator.runner",
           "evaluator.program.wire", "evaluator.program.traced", "evaluator.program.kernel_audit",
           "evaluator.correctness.interpret", "evaluator.correctness.precision")
# A child's own entries of its environment; the zygote is keyed by the rest (what an import may read).
PER_CHILD = ("HOME", "TMPDIR", "LIBTPU_INIT_ARGS", PROTOCOL_FD_ENV)
WARM_ENV = "PALLAS_EVOLVE_WARM"
_READY_S = 120.0
_MAX = 1 << 20


def enabled() -> bool:
    return os.environ.get(WARM_ENV, "1") != "0"


# ---- the zygote's side ---------------------------------------------------------------------------
def _child(request: dict, fds: list[int]) -> None:
    """In the fork: become the child the request describes, run it, exit. Never returns."""
    code = 1
    try:
        from evaluator.containment.sandbox import Limits, _die_with_parent, _set_limits

        # First: this child dies with the zygote (which ends when its judge does), as a cold child
        # dies with the judge that started it; a zygote gone before this line left it another parent.
        _die_with_parent()
        if os.getppid() != request["zygote"]:
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        out, proto = (fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(proto, 3)
        os.closerange(4, 1 << 16)
        os.setsid()
        env = dict(request["env"], **{PROTOCOL_FD_ENV: "3"})
        os.environ.clear()
        os.environ.update({k: v for k, v in request["imported_env"].items() if k not in env} | env)
        tempfile.tempdir = None
        os.chdir(request["cwd"])
        _set_limits(Limits(**request["limits"]))
        if request.get("jail"):
            from evaluator.containment import jail

            jail.enter_here(request["jail"])
        run = request["run"]
        if "module" in run:
            sys.argv = [run["module"], *run["args"]]
            code = importlib.import_module(run["module"]).main(*run["args"])
        else:
            import runpy

            sys.argv = [run["path"], *run["args"]]
            runpy.run_path(run["path"], run_name="__main__")
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - told on the child's output, as an uncaught error would be
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) else 0)


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def serve(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    start_env = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    imported_env = {k: v for k, v in os.environ.items() if start_env.get(k) != v}   # what imports set
    wake_r, wake_w = os.pipe()
    for end in (wake_r, wake_w):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    zygote = os.getpid()
    _send(sock, {"ready": zygote})
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, _MAX, 2)
                except OSError:
                    data, fds = b"", []
                if not data:        # the judge is gone: so are we, at once (and, by their death signal, our children)
                    os._exit(0)
                request = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    _child(dict(request, imported_env=imported_env, zygote=zygote), fds)
                for end in fds:
                    os.close(end)
                _send(sock, {"started": request["token"], "pid": pid})
            else:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exit": pid, "status": status})


# ---- the judge's side ------------------------------------------------------------------------------
class ZygoteLost(Exception):
    """The zygote died (or never started): the child is to be started cold."""


class WarmProcess:
    """A child forked by a zygote, as ``run_child`` watches a ``Popen``: pid, stdout, poll, wait."""

    def __init__(self, pid: int, stdout, zygote: Zygote) -> None:
        self.pid, self.stdout, self._zygote = pid, stdout, zygote
        self.returncode: int | None = None
        self.lost = False

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._zygote.status(self.pid)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif not self._zygote.alive:      # it took the child down with it
                self.lost, self.returncode = True, -signal.SIGKILL
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.02)
        return self.returncode


class Zygote:
    """One warm parent for children of one environment (less ``PER_CHILD``)."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.home = home
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zenv = {k: v for k, v in env.items() if k not in PER_CHILD} | {"HOME": str(home), "TMPDIR": str(home)}
        root = str(Path(__file__).resolve().parents[2])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evaluator.containment.zygote", str(theirs.fileno())], env=zenv, cwd=root,
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock = ours
        self._lock = threading.Lock()          # one request at a time: its "started" is the next reply
        self._cond = threading.Condition()
        self._started: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self.alive = True
        self._token = 0
        ours.settimeout(_READY_S)
        try:
            ready = json.loads(ours.recv(_MAX) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if "ready" not in ready:
            self.close()
            raise ZygoteLost("the zygote did not start")
        ours.settimeout(None)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MAX)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self.alive = False
                    self._cond.notify_all()
                    return
                message = json.loads(data)
                if "started" in message:
                    self._started[message["started"]] = message["pid"]
                else:
                    self._exits[message["exit"]] = message["status"]
                self._cond.notify_all()

    def status(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.pop(pid, None)

    def launch(self, run: dict, *, cwd: str, env: dict[str, str], limits, jail: str | None,
               protocol_fd: int) -> WarmProcess:
        """Fork a child that runs ``run`` ({"module", "args"} calls the module's ``main(*args)``;
        {"path", "args"} runs a script); raise ZygoteLost if the zygote cannot."""
        import dataclasses

        out_r, out_w = os.pipe()
        try:
            with self._lock:
                self._token += 1
                token = self._token
                request = {"token": token, "run": run, "cwd": cwd, "env": env, "jail": jail,
                           "limits": dataclasses.asdict(limits)}
                try:
                    socket.send_fds(self.sock, [json.dumps(request).encode()], [out_w, protocol_fd])
                except OSError as exc:
                    self.alive = False
                    raise ZygoteLost(f"the zygote is gone: {exc}") from exc
                with self._cond:
                    self._cond.wait_for(lambda: token in self._started or not self.alive, timeout=_READY_S)
                    pid = self._started.pop(token, None)
            if pid is None:
                raise ZygoteLost("the zygote did not fork")
        except BaseException:
            os.close(out_r)
            raise
        finally:
            os.close(out_w)
        return WarmProcess(pid, os.fdopen(out_r, "rb"), self)

    def close(self) -> None:
        self.alive = False
        try:
            # shutdown, not close alone: the reader thread blocked in recv holds the socket open, and
            # the zygote would never see its end.
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.home, ignore_errors=True)


# One warm parent per environment in this process, whichever judge asks: a handful (the worker's;
# the runner's per chip), never one per judge.
_ZYGOTES: dict[frozenset, Zygote] = {}
_LOCK = threading.Lock()


def for_env(env: dict[str, str]) -> Zygote | None:
    """The warm parent for children of ``env``, started at its first child; None: start cold."""
    if not enabled():
        return None
    key = frozenset((k, v) for k, v in env.items() if k not in PER_CHILD)
    with _LOCK:
        warm = _ZYGOTES.get(key)
        if warm is None or not warm.alive:
            try:
                warm = _ZYGOTES[key] = Zygote(env, Path(tempfile.mkdtemp(prefix="pallas-evolve-zygote-")))
            except (ZygoteLost, OSError):
                return None
        return warm


def drop(warm: Zygote) -> None:
    """End ``warm`` (it died, or lost a child): the next child of its environment starts another."""
    with _LOCK:
        for key, value in list(_ZYGOTES.items()):
            if value is warm:
                del _ZYGOTES[key]
    warm.close()


def running() -> list[Zygote]:
    with _LOCK:
        return list(_ZYGOTES.values())


@atexit.register
def close_all() -> None:
    """End every warm parent of this process (each would end by itself when this process does)."""
    with _LOCK:
        warm = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for each in warm:
        each.close()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
