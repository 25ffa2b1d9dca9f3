"""`evolve ui` stopped by its PID (SIGTERM) or Ctrl-C (SIGINT) takes MLflow's server down with it:
its port is free again and no process of the server is left (issue 57)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.procs import alive

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _descendants(pid: int) -> set[int]:
    from evaluator.containment.sandbox import _descendants

    return set(_descendants(pid))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_evolve_ui_stops_its_mlflow_server(tmp_path, sig):
    from archive import Archive

    data = tmp_path / "data"
    Archive(data, create=True)
    port = _free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1")
    ui = subprocess.Popen([sys.executable, "-m", "evolve", "ui", "--port", str(port), "--data-dir", str(data)],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while True:
            server |= _descendants(ui.pid)
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and ui.poll() is None, "evolve ui did not come up"
                time.sleep(0.5)
        server |= _descendants(ui.pid)
        assert server, "no MLflow server process found"
        ui.send_signal(sig)
        _, err = ui.communicate(timeout=60)
    finally:
        if ui.poll() is None:
            ui.kill()
        for pid in server:           # never leave a server behind, whatever the test found
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert ui.returncode == 0, err
    assert f"the MLflow UI on port {port} stopped" in err and "every evaluation" not in err, err
    time.sleep(0.5)
    assert not [pid for pid in server if alive(pid)]
    assert _port_free(port)
