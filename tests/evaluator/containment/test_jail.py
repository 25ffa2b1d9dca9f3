"""The jail: what a jailed process can and cannot do (needs root and util-linux `unshare`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evaluator.containment import jail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

pytestmark = pytest.mark.skipif(not jail.probe().enabled, reason=f"no jail here: {jail.probe().reason}")

PROBE = """
import os, socket
out = [str(os.geteuid()), str(os.getpid())]
for path in ("/tmp/pallas-evolve-jail-test", os.path.join(os.environ["HOME"], "ok")):
    try:
        open(path, "w").write("x"); out.append("wrote")
    except OSError:
        out.append("denied")
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1); out.append("net")
except OSError:
    out.append("nonet")
out.append(str(len([p for p in os.listdir("/proc") if p.isdigit()])))
os.posix_spawn("/bin/sleep", ["/bin/sleep", "619"], {}, setsid=True)
print(" ".join(out))
"""


def test_a_jailed_process_is_nobody_alone_offline_and_writes_only_its_scratch(tmp_path):
    os.chown(tmp_path, jail.NOBODY, jail.NOBODY)
    argv = jail.Isolation(True).wrap([sys.executable, "-c", PROBE], str(tmp_path))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    uid, pid, outside, inside, net, processes = proc.stdout.split()
    assert (uid, pid) == (str(jail.NOBODY), "1")
    assert (outside, inside, net) == ("denied", "wrote", "nonet")
    assert int(processes) <= 2                     # itself and its sleep: no other process is visible
    assert not os.path.exists("/tmp/pallas-evolve-jail-test")
    left = subprocess.run(["pgrep", "-f", "sleep 619"], capture_output=True, text=True).stdout.split()
    assert not left, "a setsid'd child outlived its namespace"


def test_the_plan_covers_tmp_and_binds_the_scratch_dir_back(tmp_path):
    cover, keep = jail._plan(str(tmp_path))
    assert "/tmp" in cover and str(tmp_path.resolve()) in keep


def test_the_fallback_says_why(monkeypatch):
    jail.probe.cache_clear()
    monkeypatch.setenv("PALLAS_EVOLVE_NO_JAIL", "1")
    try:
        isolation = jail.probe()
        assert not isolation.enabled and "PALLAS_EVOLVE_NO_JAIL" in isolation.reason
        assert isolation.wrap(["x"], "/tmp") == ["x"]
    finally:
        jail.probe.cache_clear()


def test_a_judge_without_a_jail_says_so_once_loudly(monkeypatch, tmp_path, capsys):
    from evaluator import judge as judge_module

    jail.probe.cache_clear()
    monkeypatch.setenv("PALLAS_EVOLVE_NO_JAIL", "1")
    monkeypatch.setattr(judge_module, "_WARNED", set())
    try:
        for _ in range(2):
            j = judge_module.Judge(judge_module.JudgeConfig(cache_dir=str(tmp_path)))
            assert not j.isolation.enabled
    finally:
        jail.probe.cache_clear()
    err = capsys.readouterr().err
    assert err.count("WITHOUT operating-system isolation") == 1 and "PALLAS_EVOLVE_NO_JAIL" in err


JUDGE = """
import os, sys, time
from evaluator.containment import jail
from evaluator.containment.sandbox import Limits, _popen
argv = jail.Isolation(True).wrap([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(617)"],
                                 sys.argv[1])
r, w = os.pipe()
child = _popen(argv, cwd=sys.argv[1], env={"PATH": os.environ["PATH"]}, protocol_fd=w, limits=Limits())
print(child.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""


def test_a_jailed_child_dies_with_the_judge_that_started_it(tmp_path):
    """kill -9 on its judge: the namespace's first process goes too, though dropping to nobody
    cleared the death signal the judge armed (jail.enter arms it again)."""
    import time

    from evaluator.containment.sandbox import _descendants
    from tests.procs import alive

    os.chown(tmp_path, jail.NOBODY, jail.NOBODY)
    judge = subprocess.Popen([sys.executable, "-c", JUDGE, str(tmp_path)], stdout=subprocess.PIPE, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert judge.stdout.readline() == b"up\n"
        below = _descendants(judge.pid)
        assert len(below) == 2                  # unshare outside, the jailed first process inside
        judge.kill()
        judge.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(pid) for pid in below):
            time.sleep(0.05)
        assert not [pid for pid in below if alive(pid)]
    finally:
        judge.kill()
        subprocess.run(["pkill", "-f", "time.sleep\\(617\\)"])
