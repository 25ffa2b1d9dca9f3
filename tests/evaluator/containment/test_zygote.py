"""The warm start (evaluator/containment/zygote.py): a child forked from a warm parent is as fresh,
as jailed and as watched as one started cold, and nothing one child did reaches the next. The
sandbox's own misbehaviour tests run both ways (test_sandbox.py, ``launcher``)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from evaluator.containment import jail
from evaluator.containment.children import Children
from evaluator.containment.sandbox import Limits, run_child
from evaluator.containment import zygote as warm_start
from evaluator.containment.zygote import Zygote
from evaluator.judge import JudgeConfig
from tests.procs import alive

ROOT = str(Path(__file__).resolve().parents[3])
needs_jail = pytest.mark.skipif(not jail.probe().enabled, reason=f"no jail here: {jail.probe().reason}")


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    warm = Zygote({"PATH": os.environ["PATH"], "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
                  tmp_path_factory.mktemp("zygote"))
    yield warm
    warm.close()


def run_warm(zygote, directory: Path, body: str, *, jailed: bool):
    """``body`` run as a script forked by ``zygote`` in ``directory`` (jailed: its only writable place)."""
    script = directory / "child.py"
    script.write_text(textwrap.dedent(body))
    if jailed:
        os.chown(directory, jail.NOBODY, jail.NOBODY)
    launch = functools.partial(zygote.launch, {"path": str(script), "args": []},
                               jail=str(directory) if jailed else None)
    return run_child([sys.executable, str(script)], cwd=str(directory),
                     env={"PATH": os.environ["PATH"], "HOME": str(directory), "TMPDIR": str(directory)},
                     budgets={}, default_budget=60.0, limits=Limits(), launch=launch)


@needs_jail
def test_a_warm_jailed_child_is_nobody_alone_offline_and_writes_only_its_scratch(zygote, tmp_path):
    from tests.evaluator.containment.test_jail import PROBE

    out = run_warm(zygote, tmp_path, PROBE, jailed=True)
    assert out.returncode == 0, out.output
    uid, pid, outside, inside, net, processes = out.output.split()[-6:]
    assert (uid, pid) == (str(jail.NOBODY), "1")
    assert (outside, inside, net) == ("denied", "wrote", "nonet")
    assert int(processes) <= 2
    assert not os.path.exists("/tmp/pallas-evolve-jail-test")
    left = subprocess.run(["pgrep", "-f", "sleep 619"], capture_output=True, text=True).stdout.split()
    assert not left, "a setsid'd child outlived its namespace"


LEAVE = """
    import os, sys, tempfile, subprocess
    import jax, jax.numpy as jnp
    import evaluator.runner
    jnp.exp = lambda x: x                       # what the next kernel would compute with
    evaluator.runner.LEFT_BEHIND = True           # what the next runner would read
    sys.modules["left_behind"] = sys              # an import the next one would find
    os.environ["LEFT_BEHIND"] = "1"
    open("/tmp/left_behind", "w").write("x")     # denied in the jail
    for where in (tempfile.gettempdir(), os.environ["HOME"]):
        open(os.path.join(where, "left_behind"), "w").write("x")
    if os.geteuid() != 0:                              # in the jail: a process that leaves its session
        subprocess.Popen(["sleep", "618"], start_new_session=True)
    print("left", flush=True)
"""

LOOK = """
    import os, sys, tempfile, subprocess
    import jax.numpy as jnp
    import evaluator.runner
    seen = []
    if jnp.exp(0.0) == 0.0: seen.append("jnp.exp")
    if getattr(evaluator.runner, "LEFT_BEHIND", False): seen.append("module state")
    if "left_behind" in sys.modules: seen.append("sys.modules")
    if "LEFT_BEHIND" in os.environ: seen.append("environment")
    if os.path.exists(os.path.join(tempfile.gettempdir(), "left_behind")): seen.append("tmp file")
    if os.path.exists("/tmp/left_behind"): seen.append("/tmp file")
    if os.path.exists(os.path.join(os.environ["HOME"], "left_behind")): seen.append("home file")
    if "618" in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout: seen.append("process")
    print("seen:" + ",".join(seen), flush=True)
"""


@pytest.mark.parametrize("jailed", [pytest.param(True, marks=needs_jail), False])
def test_nothing_a_child_leaves_behind_reaches_the_next(zygote, tmp_path, jailed):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    out = run_warm(zygote, first, LEAVE, jailed=jailed)
    assert ("left" in out.output.splitlines()) is not jailed, out.output      # the jail denies /tmp
    if jailed:          # the rest, from its own directory
        out = run_warm(zygote, first, LEAVE.replace('open("/tmp/left_behind", "w").write("x")', ""), jailed=jailed)
    assert out.returncode == 0 and "left" in out.output.splitlines(), out.output
    out = run_warm(zygote, second, LOOK, jailed=jailed)
    assert out.returncode == 0, out.output
    seen = out.output.strip().splitlines()[-1]
    Path("/tmp/left_behind").unlink(missing_ok=True)
    # Unjailed, a file written to /tmp is on disk for anyone: only the jail keeps files from the next.
    assert seen == ("seen:" if jailed else "seen:/tmp file"), out.output
    assert zygote.alive
    assert not subprocess.run(["pgrep", "-f", "sleep 618"], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("jailed", [pytest.param(True, marks=needs_jail), False])
def test_a_child_dies_with_its_zygote(tmp_path, jailed):
    """Its judge killed by kill -9, a zygote ends at once; what it forked must not run on, jailed or
    not (a cold child dies with its judge the same way)."""
    import time

    from evaluator.containment.sandbox import _descendants

    warm = Zygote({"PATH": os.environ["PATH"], "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}, tmp_path / "home")
    script = tmp_path / "child.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    if jailed:
        os.chown(tmp_path, jail.NOBODY, jail.NOBODY)
    read_fd, write_fd = os.pipe()
    try:
        child = warm.launch({"path": str(script), "args": []}, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]},
                            limits=Limits(), jail=str(tmp_path) if jailed else None, protocol_fd=write_fd)
        assert child.stdout.readline() == b"up\n"
        forked = _descendants(warm.proc.pid)
        assert child.pid in forked and len(forked) == (2 if jailed else 1)     # jailed: the one outside, PID 1
        os.kill(warm.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(pid) for pid in forked):
            time.sleep(0.05)
        assert not [pid for pid in forked if alive(pid)]
    finally:
        os.close(read_fd)
        os.close(write_fd)
        warm.close()


def _children(tmp_path) -> Children:
    from evaluator.chips import get_chip
    from evaluator.figure.timing import get_timing_source

    config = JudgeConfig(cache_dir=str(tmp_path / "cache"))
    return Children(config, get_chip("v5e"), get_timing_source("compiler_estimate"), on_tpu=False)


def _run(children: Children, directory: Path, sleep: float):
    directory.mkdir()
    env = dict(children.base_env(directory), JAX_PLATFORMS="cpu")
    return children.run("tests.evaluator.containment.zygote_child", directory, {"sleep": sleep}, env,
                        jailed=False, limits=Limits())


def _warm(outcome) -> bool:
    return next(e["data"]["warm"] for e in outcome.events if e.get("event") == "stage_ok")


def test_a_zygote_that_dies_is_replaced_and_its_child_run_again_cold(tmp_path):
    warm_start.close_all()       # none left by the tests before, in this process
    children = _children(tmp_path)
    try:
        first = _run(children, tmp_path / "a", 0.0)
        assert first.returncode == 0 and _warm(first), (first.events, first.output)
        (warm,) = warm_start.running()
        # killed while a child runs: that child is run again, cold, and gets its outcome
        killer = threading.Timer(1.5, lambda: os.kill(warm.proc.pid, signal.SIGKILL))
        killer.start()
        second = _run(children, tmp_path / "b", 3.0)
        killer.join()
        assert second.returncode == 0 and not second.lost and not _warm(second), second.output
        assert not alive(warm.proc.pid)
        # and the next child is forked by a new one
        third = _run(children, tmp_path / "c", 0.0)
        assert third.returncode == 0 and _warm(third)
        (again,) = warm_start.running()
        assert again is not warm and again.alive
    finally:
        warm_start.close_all()


def test_the_warm_start_can_be_turned_off(tmp_path, monkeypatch):
    warm_start.close_all()
    monkeypatch.setenv("PALLAS_EVOLVE_WARM", "0")
    outcome = _run(_children(tmp_path), tmp_path / "a", 0.0)
    assert outcome.returncode == 0 and not _warm(outcome) and not warm_start.running()


def test_a_candidate_that_sets_jax_config_reaches_no_later_judgement(tmp_path):
    """Through the judge, warm: a candidate may call ``jax.config.update`` (the screen allows it), and
    in one long-lived process that would hold for every kernel traced after it. Its matmul precision
    changes its own program; the seed judged next by the same judge, forked from the same warm
    parents, lowers to the very program a fresh judge's seed does, and gets the same figure."""
    from evaluator.judge import Judge
    from evaluator.result import Status
    from seeds import load_seed

    task = load_seed("flash_attention").task("B=1,H=2,N=256,D=128")
    seed = (Path(ROOT) / "seeds/flash_attention/kernel.py").read_text()
    patched = seed.replace("import jax.numpy as jnp\n", "import jax.numpy as jnp\n"
                           "jax.config.update('jax_default_matmul_precision', 'highest')\n", 1)
    assert patched != seed
    warm_start.close_all()
    judge = Judge(JudgeConfig(cache_dir=str(tmp_path / "cache"), workers=1))
    try:
        first = judge.evaluate(patched, task)
        assert len(warm_start.running()) == 2      # the worker's and the runner's, forked warm
        after = judge.evaluate(seed, task)
    finally:
        warm_start.close_all()
    alone = Judge(JudgeConfig(cache_dir=str(tmp_path / "cache"), workers=1)).evaluate(seed, task)
    assert first.metrics.program_sha256 and first.status is not Status.FAIL_SCREEN, first.error
    assert after.status is Status.PASS and alone.status is Status.PASS, (after.error, alone.error)
    assert first.metrics.program_sha256 != alone.metrics.program_sha256     # the setting changes a program
    assert after.metrics.program_sha256 == alone.metrics.program_sha256     # and did not reach the next
    assert after.metrics.estimated_cycles == alone.metrics.estimated_cycles
