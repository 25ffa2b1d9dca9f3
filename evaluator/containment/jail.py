"""Operating-system isolation for candidate code: namespaces, a private /tmp, an unprivileged user.

The sandbox starts a candidate's worker as

    unshare --pid --fork --kill-child=SIGKILL --mount-proc --net --mount --ipc --uts \
        python -I .../evaluator/containment/jail.py SCRATCH -- python -m evaluator.containment.worker REQUEST

``unshare`` gives the worker its own PID namespace (it sees no process but its own; when the
namespace's first process dies, the kernel kills every process in it, whatever it forked or
``setsid``'d), its own network namespace (no interface but a down loopback), and its own mount
namespace. This module is the namespace's first process; it runs trusted code only, as root
inside the namespaces, and before it ``exec``s the worker it

* mounts empty tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (the world-writable places)
  and binds the candidate's scratch directory back in at its own path: the only writable place;
* drops to an unprivileged user (``nobody``), with no supplementary groups, no capabilities and
  ``no_new_privs``. Files the judge keeps (the project, the virtual environment, the data
  directory, the caches) are root's: readable at most, never writable.

Where namespaces are not available (not root, no ``unshare``), ``probe()`` says why and the
sandbox falls back to process limits alone, saying so once, loudly.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import operator
import os
import shutil
import signal
import subprocess
import sys

NOBODY = 65534
_MS_BIND, _MS_REC, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_PRIVATE = 0x1000, 0x4000, 0x2, 0x4, 0x8, 1 << 18
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
# The namespaces a jailed process gets, as unshare(1) names them and as unshare(2) takes them
# (CLONE_NEWPID, NEWNS, NEWNET, NEWIPC, NEWUTS): the cold start asks the command, the warm one the call.
_NAMESPACES = {"--pid": 0x20000000, "--mount": 0x00020000, "--net": 0x40000000, "--ipc": 0x08000000,
               "--uts": 0x04000000}
_PRIVATE_MOUNTS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Whether candidate workers run in namespaces as an unprivileged user, and if not, why."""

    enabled: bool
    reason: str = ""

    def wrap(self, argv: list[str], scratch: str) -> list[str]:
        """The command that runs ``argv`` jailed with ``scratch`` as its only writable place."""
        if not self.enabled:
            return argv
        # Run as a file with -I: the launcher imports nothing but the standard library.
        return [*_unshare_prefix(), sys.executable, "-I", os.path.abspath(__file__), scratch, "--", *argv]


def _unshare_prefix() -> list[str]:
    return [shutil.which("unshare") or "unshare", *_NAMESPACES, "--fork", "--kill-child=SIGKILL", "--mount-proc"]


@functools.lru_cache(maxsize=1)
def probe() -> Isolation:
    """Can this machine jail a worker? Tried once per process, for real: a jailed Python must
    start, import the project, and find itself unprivileged with no network."""
    if os.environ.get("PALLAS_EVOLVE_NO_JAIL") == "1":
        return Isolation(False, "PALLAS_EVOLVE_NO_JAIL=1 is set")
    if os.geteuid() != 0:
        return Isolation(False, "the judge is not running as root, so it cannot create namespaces "
                                "and switch candidate code to an unprivileged user")
    if shutil.which("unshare") is None:
        return Isolation(False, "util-linux 'unshare' is not installed")
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    scratch = tempfile.mkdtemp(prefix="pallas-evolve-jailprobe-")
    try:
        os.chown(scratch, NOBODY, NOBODY)
        check = ("import os, socket, evaluator; assert os.geteuid() != 0; "
                 "s = socket.socket(); s.settimeout(1)\n"
                 "try:\n s.connect(('127.0.0.1', 9)); print('net')\n"
                 "except OSError:\n print('nonet')\n"
                 "open(os.path.join(os.environ['HOME'], 'w'), 'w').write('ok'); print('ok')")
        argv = Isolation(True).wrap([sys.executable, "-c", check], scratch)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": root, "HOME": scratch}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                                  cwd=scratch)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Isolation(False, f"a jailed probe could not run: {exc}")
        if proc.returncode != 0 or proc.stdout.split() != ["nonet", "ok"]:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return Isolation(False, f"a jailed probe failed (exit {proc.returncode}): {tail[0]}; "
                                    "is the project or the virtual environment readable by 'nobody'?")
        return Isolation(True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _hidden_ancestor(path: str) -> str | None:
    """The top-most ancestor of ``path`` that an unprivileged user cannot traverse, if any."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        ancestor = "/" + "/".join(parts[:i])
        try:
            st = os.stat(ancestor)
        except OSError:
            return None
        if not st.st_mode & 0o001 and st.st_uid != NOBODY:
            return ancestor
    return None


def _plan(scratch: str) -> tuple[list[str], list[str]]:
    """What to cover with an empty tmpfs, and what to bind back in: the scratch directory, and
    the Python, the virtual environment and the project (when they sit under a private home)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    keep = [os.path.realpath(p) for p in (scratch, sys.base_prefix, sys.prefix, root)]
    cover = [t for t in _PRIVATE_MOUNTS if os.path.isdir(t)]
    cover += [a for a in map(_hidden_ancestor, keep) if a]

    def inside(path: str, others: list[str]) -> bool:
        return any(path != o and path.startswith(o.rstrip("/") + "/") for o in others)

    cover = sorted(set(cover), key=len)
    cover = [c for i, c in enumerate(cover) if not inside(c, cover[:i])]   # covered already
    keep = [k for k in sorted(set(keep), key=len) if not inside(k, keep)
            and any(k.startswith(c.rstrip("/") + "/") for c in cover)]
    return cover, keep


def enter(scratch: str) -> None:
    """Inside fresh namespaces, as root: cover the world-writable and private directories with
    empty tmpfs, bind back what the worker needs, then drop to ``nobody``. Judge code only."""
    libc = _libc()
    cover, keep = _plan(scratch)
    fds = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in keep}
    for target in cover:
        _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64m")
    for path, fd in fds.items():
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
        os.close(fd)
    os.chdir(scratch)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    # The kernel clears the death signal when credentials change: armed again, as nobody, or this
    # process (the namespace's first) would outlive the judge that started it.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def enter_here(scratch: str) -> None:
    """What ``Isolation.wrap`` does, done in this process (a warm start's fresh fork, single-threaded,
    root, trusted code only; evaluator/containment/zygote.py): new namespaces; this process stays
    outside as ``unshare --fork`` does, waits, and ends as the namespace's first process ended; that
    one mounts its own /proc (``--mount-proc``), dies with its parent (``--kill-child=SIGKILL``), and
    returns from here jailed by :func:`enter`."""
    libc = _libc()
    if libc.unshare(functools.reduce(operator.or_, _NAMESPACES.values())) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _mount(libc, "none", "/", None, _MS_REC | _MS_PRIVATE, None)
    _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    enter(scratch)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -I evaluator/containment/jail.py SCRATCH -- COMMAND...", file=sys.stderr)
        return 2
    enter(argv[0])
    os.execv(argv[2], argv[2:])
    return 127   # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
