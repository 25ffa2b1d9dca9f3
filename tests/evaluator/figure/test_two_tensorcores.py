"""A chip with two TensorCores (v5p): the judge compiles for it, and its "parallel" grid axes are
shared between the cores, which the compiler's estimate sees. On one TensorCore (v5e) the same
edit is worth nothing. The kernel is a user's, with no semantics stated; ``dimension_semantics``
states them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mutations.registry import get_operator
from seeds.reference import Task
from tests.evolve.test_user_styles import MATMUL_REF, TUNE_DICT

ROOT = Path(__file__).resolve().parents[3]


def cycles(kernel: Path, reference: Path, chip: str) -> int:
    r = subprocess.run([sys.executable, "-m", "evolve", "eval", str(kernel), "--reference", str(reference),
                        "--chip", chip, "--shape", "M=512,K=256,N=512", "--format", "json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    verdict = json.loads(r.stdout)
    assert verdict["status"] == "PASS", verdict
    assert verdict["chip"] == chip and verdict["timing_source"].startswith("compiler_estimate")
    return int(verdict["estimated_cycles"])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cores")
    reference = tmp / "ref.py"
    reference.write_text(MATMUL_REF)
    task = Task.read(reference, TUNE_DICT)
    op = get_operator("dimension_semantics")
    source = TUNE_DICT
    for axis in (0, 1):
        result = op.apply_params(source, task, {"axis": axis, "semantics": "parallel"})
        assert result.status == "applied", result.reason
        source = result.source
    paths = {"arbitrary": tmp / "serial.py", "parallel": tmp / "parallel.py"}
    paths["arbitrary"].write_text(TUNE_DICT)
    paths["parallel"].write_text(source)
    return reference, paths


def test_parallel_axes_halve_the_estimate_on_v5p_and_change_nothing_on_v5e(kernels):
    reference, paths = kernels
    v5p = {name: cycles(path, reference, "v5p") for name, path in paths.items()}
    assert v5p["parallel"] < 0.6 * v5p["arbitrary"], v5p
    v5e = {name: cycles(path, reference, "v5e") for name, path in paths.items()}
    assert abs(v5e["parallel"] - v5e["arbitrary"]) <= 0.02 * v5e["arbitrary"], v5e
