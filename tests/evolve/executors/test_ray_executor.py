"""The Ray executor on a real Ray cluster started here (127.0.0.1, two CPUs): a tiny run archives
every kernel and equals a local run with the same RNG seed; a Ray worker killed mid-run loses
nothing; SIGTERM leaves nothing running; kill -9 then resume; a dead address or a missing Ray is
one line, exit 2."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import alive

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pallas-evolve[ray]')")

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).with_name("ray"))
# The cheapest real kernel; 3 + 1 x (3 - 2 elites) = 4 kernels. Two workers (and so the same lag) for Ray and local.
TINY = ["--seed", "examples/seed_axpy", "--shape", "M=256,N=256", "--population", "3", "--generations", "1",
        "--rng-seed", "3", "--no-peers", "--workers", "2"]
KERNELS = 4
ENV = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1", RAY_AUTH_MODE="disabled",
           RAY_USAGE_STATS_ENABLED="0")
ENV.pop("RAY_ADDRESS", None)


def evolve(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=env or ENV)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[4])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    from evaluator.containment.sandbox import _descendants

    return list(_descendants(pid))


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def judging_workers(root: int) -> list[int]:
    """The Ray worker processes under ``root`` judging a candidate right now. A child the worker
    has forked for the judge's worker or runner carries the same command line until it execs: it
    is not a Ray worker (killing it is a judged child killed, which the judge calls OOM)."""
    busy = [p for p in descendants(root) if "ray::judge_on_this_node" in cmdline(p)]
    return [p for p in busy if parent_of(p) not in busy]


class Cluster:
    """``ray start --head --block`` in a session of its own: every process of the cluster is in it."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--port", str(self.port), "--num-cpus", "2",
             "--node-ip-address", "127.0.0.1", "--include-dashboard", "false", "--disable-usage-stats",
             "--temp-dir", str(tmp)], env=ENV, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.proc.poll() is None, "ray start failed"
                time.sleep(0.5)
        time.sleep(3)      # the raylet registers after the GCS answers

    def processes(self) -> list[int]:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and session_of(int(p)) == self.proc.pid]

    def stop(self) -> None:
        for pid in [*self.processes(), *descendants(self.proc.pid)]:   # ours only: this session's
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # A short directory: Ray's unix sockets live under it.
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="rayt-", dir="/tmp"))
    c = Cluster(tmp)
    yield c
    c.stop()
    time.sleep(0.5)
    assert not [p for p in c.processes() if alive(p)], "a process of the test's Ray cluster outlived it"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    data = tmp_path_factory.mktemp("local") / "data"
    r = evolve("run", *TINY, "--data-dir", str(data))
    assert r.returncode == 0, r.stderr[-3000:]
    return data


def signature(data: Path) -> list[tuple]:
    from archive import Archive

    df = Archive(data).evaluations()
    return sorted((r.individual_id, r.generation, r.status, r.estimated_cycles) for r in df.itertuples())


def run_id_of(data: Path) -> str:
    (run,) = sorted(p.stem for p in (data / "runs").glob("*.json"))
    return run


def test_a_ray_run_archives_every_kernel_and_equals_a_local_run(cluster, local_run, tmp_path):
    from archive import Archive

    data = tmp_path / "data"
    r = evolve("run", *TINY, "--executor", "ray", "--ray-address", cluster.address, "--data-dir", str(data))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"on Ray at {cluster.address} (2 CPU cores), 2 at once" in r.stderr
    df = Archive(data).evaluations()
    assert len(df) == KERNELS and df["individual_id"].is_unique         # every kernel, once
    assert (df["status"] == "PASS").any()
    assert signature(data) == signature(local_run)                 # the same run, judged elsewhere
    meta = Archive(data).read_run_meta(run_id_of(data))
    assert meta["config"]["judge"]["executor"] == "ray" and meta["status"] == "finished"
    time.sleep(0.5)
    # A child started cold names its module; one forked warm is a child of a zygote (which lives on
    # with its Ray worker, ready for the next run).
    left = [p for p in descendants(cluster.proc.pid)
            if re.search(r"evaluator\.(containment\.worker|runner)", cmdline(p))
            or "evaluator.containment.zygote" in cmdline(parent_of(p) or 0)]
    assert not left, "a sandboxed child outlived the run"


def test_killing_a_ray_worker_mid_run_loses_nothing(cluster, local_run, tmp_path):
    from archive import Archive

    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", *TINY, "--executor", "ray",
                             "--ray-address", cluster.address, "--data-dir", str(data)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        rows = list((data / "archive").rglob("*.parquet")) if data.exists() else []
        busy = judging_workers(cluster.proc.pid)
        if rows and busy:              # mid-run: something archived, a candidate being judged
            killed = busy[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=600)
    assert killed is not None, "no Ray worker was judging while the run went on"
    assert proc.returncode == 0, err[-3000:]
    df = Archive(data).evaluations()
    assert len(df) == KERNELS and df["individual_id"].is_unique
    crashed = df[df["status"] == "CRASH"]
    # The candidate it held was judged once more (the same verdict), or, lost again, CRASH with the reason.
    assert all("lost" in e for e in crashed["error"])
    if crashed.empty:
        assert signature(data) == signature(local_run)


def test_sigterm_on_the_orchestrator_stops_the_ray_it_started_and_leaves_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", *TINY, "--executor", "ray",
                             "--data-dir", str(tmp_path / "d")], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not judging_workers(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    started = descendants(proc.pid)          # gcs_server, raylet, Ray's workers, the jailed children
    assert judging_workers(proc.pid), "no Ray task started"
    assert any("raylet" in cmdline(p) for p in started)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 130 and b"interrupted" in err
    time.sleep(1)
    assert not [p for p in started if alive(p)], [cmdline(p) for p in started if alive(p)]


def test_sigterm_on_the_orchestrator_cancels_its_tasks_on_a_cluster(cluster, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", *TINY, "--executor", "ray",
                             "--ray-address", cluster.address, "--data-dir", str(tmp_path / "d")],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not judging_workers(cluster.proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    busy = judging_workers(cluster.proc.pid)
    assert busy, "no Ray task started"
    held = [p for w in busy for p in descendants(w)]            # the jailed children of the tasks
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err
    time.sleep(1)
    assert not [p for p in busy + held if alive(p)], "a cancelled task, or its sandbox, still runs"
    assert cluster.proc.poll() is None                           # the cluster itself is not ours to stop


def test_kill_9_on_the_orchestrator_then_resume_on_ray_loses_nothing(cluster, tmp_path):
    from archive import Archive

    data = tmp_path / "data"
    args = [*TINY, "--population", "4", "--generations", "2"]          # the last flag given wins
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", *args, "--executor", "ray",
                             "--ray-address", cluster.address, "--data-dir", str(data)],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    before = None
    while time.monotonic() < deadline and proc.poll() is None:
        if data.exists() and list((data / "archive").rglob("batch-g000001-*.parquet")):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            before = Archive(data).evaluations()
            gone = time.monotonic() + 15            # Ray ends a dead driver's tasks
            while judging_workers(cluster.proc.pid) and time.monotonic() < gone:
                time.sleep(0.2)
            assert not judging_workers(cluster.proc.pid), "a Ray task outlived its orchestrator"
            break
        time.sleep(0.2)
    assert before is not None, "the run ended before generation 1 began"
    run_id = run_id_of(data)
    r = evolve("resume", run_id, "--data-dir", str(data))          # the stored executor: ray, this cluster
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on Ray at" in r.stderr
    after = Archive(data).evaluations(run_id)
    assert set(before["individual_id"]) <= set(after["individual_id"]) and after["individual_id"].is_unique
    judged = int(re.findall(r"\((\d+) judged, \d+ from archive\)", r.stderr)[-1])
    assert judged == len(after) - len(before)                      # nothing judged twice
    assert Archive(data).read_run_meta(run_id)["status"] == "finished"


def test_an_address_nobody_answers_is_one_line_exit_2_within_30_s(tmp_path):
    start = time.monotonic()
    r = evolve("run", *TINY, "--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}",
               "--data-dir", str(tmp_path / "d"), timeout=60)
    assert time.monotonic() - start < 30
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Ray cluster answers at 127.0.0.1:" in lines[0], r.stderr


def test_a_worker_lost_twice_is_a_crash_with_the_reason(tmp_path, monkeypatch):
    """In-process Ray: a task whose worker dies on every attempt is tried twice, then CRASH."""
    from evaluator.result import Status
    from evolve.executors.ray_executor import RayExecutor

    attempts = tmp_path / "attempts"

    def die(spec, source, cut=None):
        with open(attempts, "a") as fh:
            fh.write("x")
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    executor = RayExecutor(1)
    try:
        executor._task = ray.remote(die).options(num_cpus=1, max_retries=1)
        from evaluator.result import Provenance

        result = executor._judge(ray.put(None), Provenance(chip="v5e"), "source", None)
    finally:
        executor.shutdown()
    assert not ray.is_initialized()
    assert result.status is Status.CRASH and "lost, and again when it was judged once more" in result.error
    assert attempts.read_text() == "xx"


def test_without_ray_asking_for_it_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    from evolve.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert main(["run", *TINY, "--executor", "ray", "--data-dir", str(tmp_path / "d")]) == 2
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'pallas-evolve[ray]'" in err[0]


def test_the_executor_is_part_of_the_run_configuration(tmp_path):
    from evolve.cli.run import with_executor
    from evolve.config import load_config
    from evolve.errors import UsageError

    toml = tmp_path / "run.toml"
    toml.write_text('[judge]\nexecutor = "ray"\nray_address = "10.0.0.2:6379"\n')
    config = load_config(str(toml), {})
    assert (config.judge.executor, config.judge.ray_address) == ("ray", "10.0.0.2:6379")
    assert config.to_dict()["judge"]["executor"] == "ray"          # stored with the run
    assert with_executor(config, None, None).judge.ray_address == "10.0.0.2:6379"
    assert with_executor(config, "local", None).judge.ray_address == ""
    assert with_executor(config, None, "auto").judge.ray_address == "auto"
    with pytest.raises(UsageError, match="unknown executor 'dask'"):
        load_config(None, {"judge": {"executor": "dask"}})
    with pytest.raises(UsageError, match="add --executor ray"):
        load_config(None, {"judge": {"ray_address": "10.0.0.2:6379"}})
