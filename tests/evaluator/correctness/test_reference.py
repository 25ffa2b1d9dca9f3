"""The task's reference when its XLA program cannot be compiled for the chip: the judge goes on
without a figure for it (saying why), never claims a speedup over it, and still ranks kernels."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from evaluator.judge import Judge, JudgeConfig, StageBudgets
from evaluator.result import Status
from seeds import load_seed

AXPY = Path(__file__).resolve().parents[3] / "examples" / "seed_axpy"

# A reference program the CPU runs but the TPU compiler refuses (a custom call with no TPU emitter):
# the interpreter's ground truth is made, the chip's figure is not. Stands in for the real case,
# libtpu's static profile of attention's XLA program at N=4096 needing more memory than a worker has.
UNCOMPILABLE = '''
    def reference_program(self):
        import jax
        import jax.numpy as jnp

        def plain(x, y):
            return (self.alpha * x.astype(jnp.float32) + y.astype(jnp.float32)).astype(x.dtype)

        def no_tpu(x, y):
            return jax.ffi.ffi_call("pallas_evolve_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

        return lambda x, y: jax.lax.platform_dependent(x, y, cpu=plain, default=no_tpu)

    def _unused_reference_program(self):'''


def _seed_without_a_figure(tmp_path: Path) -> Path:
    seed_dir = tmp_path / "axpy_nofigure"
    shutil.copytree(AXPY, seed_dir)
    task_py = seed_dir / "task.py"
    text = task_py.read_text()
    assert text.count("    def reference_program(self):") == 1
    task_py.write_text(text.replace("    def reference_program(self):", UNCOMPILABLE))
    return seed_dir


def test_a_reference_the_chip_cannot_compile_leaves_kernels_judged_without_a_speedup(tmp_path):
    seed_dir = _seed_without_a_figure(tmp_path)
    seed = load_seed(str(seed_dir))
    task = seed.task_class.from_options("M=64,N=256")
    budgets = StageBudgets(load_s=60, lower_s=60, compile_s=120, correctness_s=120)
    judge = Judge(JudgeConfig(chip="v5e", budgets=budgets, cache_dir=str(tmp_path / "cache"), workers=1))

    reference = judge.reference_timing(task)
    assert reference.latency_s is None
    assert "no figure for the task's XLA reference" in reference.error
    assert "pallas_evolve_no_such_target" in reference.error

    source = (seed_dir / "kernel.py").read_text()
    good = judge.evaluate(source, task)
    assert good.status is Status.PASS, good.error
    m = good.metrics
    assert m.speedup_vs_reference is None and m.reference_latency_s is None
    assert m.latency_s and m.estimated_cycles
    assert "no figure for the task's XLA reference" in good.error
    assert good.merit == 1e-6 / m.latency_s           # ranked by its own figure

    # The ground truth still judges: a wrong kernel fails, and has no merit.
    wrong = judge.evaluate(source.replace("alpha *", "(alpha + 1.0) *"), task)
    assert wrong.status is Status.FAIL_CORRECTNESS, (wrong.status, wrong.error)
    assert wrong.merit == 0.0


def test_a_run_without_a_reference_figure_ranks_by_cycles_and_crowns_a_champion(tmp_path):
    import pandas as pd

    seed_dir = _seed_without_a_figure(tmp_path)
    data = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "evolve", "run", "--seed", str(seed_dir), "--shape", "M=64,N=256",
                           "--population", "3", "--generations", "1", "--data-dir", str(data)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "best speedup -" not in proc.stderr and " cycles |" in proc.stderr      # the progress line
    assert "no speedup over the XLA reference: no figure for the task's XLA reference" in proc.stdout
    assert "nan" not in proc.stdout.lower()
    rows = pd.concat(pd.read_parquet(p) for p in (data / "archive").rglob("*.parquet"))
    passed = rows[rows["status"] == "PASS"]
    assert len(passed) >= 2 and passed["speedup_vs_reference"].isna().all()
    champion = proc.stdout.split("champion ")[1].split()[0]
    assert champion in set(passed.loc[passed["latency_s"] == passed["latency_s"].min(), "individual_id"])
