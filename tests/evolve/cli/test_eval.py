"""`evolve eval`: a table or one JSON object; bad arguments get one line and exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "seeds" / "flash_attention" / "kernel.py"
DECODE = ROOT / "seeds" / "flash_decoding" / "kernel.py"
FOUR_CHIPS = ROOT / "tests" / "mutations" / "expected" / "chip_split__flash_decoding@4chips__combine=gather.py"


def evolve(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=600)


def test_eval_json_has_the_promised_keys():
    r = evolve("eval", str(SEED), "--shape", "B=1,H=2,N=256,D=128", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("status", "error", "latency_s", "speedup_vs_reference", "timing_source", "chip",
                "vmem_bytes", "max_abs_error", "tflops", "mxu_util"):
        assert key in out
    assert out["status"] == "PASS" and out["timing_source"] == "compiler_estimate+hbm+trips"


def test_eval_judges_a_per_chip_kernel_on_a_four_chip_task():
    r = evolve("eval", str(FOUR_CHIPS), "--seed", "flash_decoding", "--chips", "4",
               "--shape", "B=2,H=4,HKV=2,N=8192,D=128", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "PASS" and out["chips"] == 4, out["error"]
    assert out["timing_source"] == "compiler_estimate+hbm+trips+ici_model"


def test_eval_table_names_its_timing_source():
    r = evolve("eval", str(SEED), "--shape", "H=1,N=256", "--no-causal", "--chip", "v6e")
    assert r.returncode == 0, r.stderr
    assert "compiler_estimate+hbm+trips (chip v6e, libtpu" in r.stdout
    assert "speedup vs reference" in r.stdout


@pytest.mark.parametrize("args, fragment", [
    (["eval", "no/such/kernel.py"], "no kernel file"),
    (["eval", str(SEED), "--chip", "v9x"], "unknown chip"),
    (["eval", str(SEED), "--shape", "B=1,Q=3"], "bad shape item"),
    (["eval", str(SEED), "--shape", "N=-4"], "must be positive"),
    (["eval", str(SEED), "--shape", "N=200"], "cannot be tiled"),
    (["eval", str(SEED), "--dtype", "int8"], "dtype"),
    (["eval", "/etc/passwd"], "is not Python"),
    (["eval", str(ROOT / "README.md")], "is not Python"),
    (["eval", str(SEED), "--chips", "4"], "runs on 1 chip(s), not --chips 4"),
    (["eval", str(DECODE), "--seed", "flash_decoding", "--chips", "3"], "not --chips 3; use --chips 4"),
    (["eval", str(DECODE), "--seed", "flash_decoding", "--chips", "4", "--shape", "N=384"],
     "does not split over 4 chips"),
    (["eval", str(FOUR_CHIPS), "--seed", "flash_decoding"], "uses CHIPS=4, but the task has 1 chip(s)"),
    (["eval", "--chips", "x", str(SEED)], "invalid int value"),
    (["eval", str(SEED), "--memory", "-1"], "--memory -1: give each judged child's address space in GiB"),
    (["eval", str(SEED), "--memory", "4096"], "1 to 1024"),
    (["eval"], "required"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_get_one_line_and_exit_2(args, fragment):
    _one_line_exit_2(args, fragment)


@pytest.mark.parametrize("reference", [[], ["--reference", str(ROOT / "examples/reference_matmul/reference.py")]])
def test_a_kernel_that_is_not_python_is_told_its_error_and_line(tmp_path, reference):
    (tmp_path / "k.py").write_text("import jax\ndef f(x:\n    return x\n")
    _one_line_exit_2(["eval", str(tmp_path / "k.py"), *reference], "not Python: '(' was never closed (line 2)")


def _one_line_exit_2(args, fragment):
    r = evolve(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr


def test_memory_is_each_judged_child_s_address_space():
    """--memory GIB reaches the judge's child limits (RLIMIT_AS); 0 or none keeps the default."""
    from evolve.config import JudgeSettings, RunConfig

    assert JudgeSettings(memory_gib=20).judge_config().limits.memory_bytes == 20 << 30
    assert JudgeSettings().judge_config().limits.memory_bytes == 12 << 30
    stored = RunConfig.stored({"judge": {"chip": "v5e"}})      # a run stored before the key: the default
    assert stored.judge.memory_gib == 0


def test_estimate_only_gives_the_figures_and_no_verdict():
    """--estimate-only: the compiler's estimate of the kernel and of the XLA program, labelled as
    no verdict (JAX's installed matmul, read at test time, from --start with its block_shape given)."""
    r = evolve("eval", "--seed", "matmul", "--shape", "M=128,K=256,N=256", "--estimate-only", "--json",
               "--start", "jax.experimental.pallas.ops.tpu.matmul")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "ESTIMATE_ONLY" and out["verdict"] is None and "no verdict" in out["note"]
    assert out["estimated_cycles"] > 0 and out["reference_cycles"] > 0
    assert out["speedup_vs_reference"] == pytest.approx(out["reference_cycles"] / out["estimated_cycles"])
    assert out["timing_source"].startswith("compiler_estimate") and out["libtpu_version"]
    assert out["start"]["defaults"] == {"block_shape": [128, 256]}


def test_estimate_only_refuses_a_measured_timing_source():
    r = evolve("eval", "--seed", "matmul", "--estimate-only", "--timing", "measured",
               "--start", "jax.experimental.pallas.ops.tpu.matmul")
    assert r.returncode == 2 and "--estimate-only reads the compiler's estimate" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


DOUBLE_REF = """
import jax, jax.numpy as jnp

def create_inputs(R=64):
    return (jax.random.normal(jax.random.key(0), (R, 128), jnp.float32),)

def workload(x):
    return x * 2
"""

DOUBLE = """
import jax
from jax.experimental import pallas as pl

BLOCK = 16

def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

def double(x):
    r, c = x.shape
    return pl.pallas_call(_kernel, grid=(r // BLOCK,), in_specs=[pl.BlockSpec((BLOCK, c), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((BLOCK, c), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


def test_a_block_that_does_not_divide_the_shape_is_named_after_the_failure(tmp_path):
    (tmp_path / "reference.py").write_text(DOUBLE_REF)
    (tmp_path / "kernel.py").write_text(DOUBLE)
    r = evolve("eval", "kernel.py", "--reference", "reference.py", "--shape", "R=40", cwd=tmp_path)
    assert r.returncode == 1 and "FAIL_CORRECTNESS" in r.stdout, (r.stdout, r.stderr)
    assert "hint: the kernel's BLOCK=16 does not divide 40, a dimension it tiles at this shape; use a shape it " \
           "divides, or a BLOCK that does (8, 40)" in r.stderr, r.stderr
    r = evolve("eval", "kernel.py", "--reference", "reference.py", cwd=tmp_path)       # R=64: it divides
    assert r.returncode == 0 and "hint" not in r.stderr, (r.stdout, r.stderr)
    assert [line.split() for line in r.stdout.splitlines() if line.startswith("entry ")] == [["entry", "double"]]
