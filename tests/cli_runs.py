"""Running the ``evolve`` command as a user does, in a process of its own, from the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def evolve(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1")
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=env)
