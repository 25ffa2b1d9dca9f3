"""`evolve promote` says what it did in one line: no MLflow warnings or INFO lines, no "Successfully
registered model" chatter, no gRPC / TPU runtime log lines (issue 57). The run is the fake judge's;
promote re-judges its champion with the real judge, as it always does."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli_runs import evolve

# What promote printed before: MLflow's warnings and event lines, and libtpu's gRPC errors.
NOISE = re.compile(r"^E\d{4} |UserWarning|^\s*color_warning\(|INFO mlflow|WARNING mlflow|Successfully registered "
                   r"model|^Created version|unexpected worker hostname", re.MULTILINE)


def test_promote_prints_its_own_line_and_nothing_of_mlflows_or_the_tpu_runtimes(tmp_path):
    data = tmp_path / "data"
    r = evolve("run", "--shape", "B=1,H=2,N=256,D=128", "--population", "4", "--generations", "1", "--rng-seed", "7",
               "--no-peers", "--executor", "fake", "--data-dir", str(data))
    assert r.returncode == 0, r.stderr[-3000:]
    (run_id,) = [p.stem for p in (data / "runs").glob("*.json")]
    out = tmp_path / "champion.py"
    r = evolve("promote", run_id, "--to", str(out), "--name", "quiet", "--data-dir", str(data))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("promoted ") and "models:/quiet@champion" in r.stdout
    assert not NOISE.search(r.stderr), r.stderr
    assert not NOISE.search(r.stdout), r.stdout
    assert Path(out).read_text().startswith('"""')
