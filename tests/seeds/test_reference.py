"""A reference file as a task (seeds/reference.py): what the judge derives from create_inputs()
and workload(), and the one-line refusals of a file that breaks the contract."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from seeds.reference import ReferenceError, Task, entry_names, kernel_entry

ROOT = Path(__file__).resolve().parents[2]

MATMUL = """
import jax, jax.numpy as jnp
import numpy as np

def create_inputs():
    k1, k2 = jax.random.split(jax.random.key(0))
    return (jax.random.normal(k1, (64, 256), jnp.bfloat16), jax.random.normal(k2, (256, 128), jnp.bfloat16),
            np.arange(8, dtype=np.int32), np.array([3, 1, 4], np.int32))

def workload(x, w, ids, sizes):
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)

STATIC = ("sizes",)
"""

KERNEL = """
import functools
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

def _call(x, w, block_m):
    return pl.pallas_call(_kernel, grid=(x.shape[0] // block_m,),
                          in_specs=[pl.BlockSpec((block_m, x.shape[1]), lambda i: (i, 0)),
                                    pl.BlockSpec(w.shape, lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((block_m, w.shape[1]), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype))(x, w)

def matmul(lhs, rhs, ids, sizes, *, block_m=32):     # named otherwise than the workload's inputs
    return _call(lhs, rhs, block_m)

def helper(x):
    return x
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Task:
    tmp = tmp_path_factory.mktemp("ref")
    return Task.read(write(tmp, "mm.py", MATMUL), KERNEL)


def test_the_task_is_derived_from_the_file(task):
    assert task.entry == "matmul"
    assert task.input_names == ("lhs", "rhs", "ids", "sizes")     # the kernel's names: it is called positionally
    assert task.input_specs() == [((64, 256), "bfloat16"), ((256, 128), "bfloat16"), ((8,), "int32"),
                                  ((3,), "int32")]
    assert task.output_dtype == "bfloat16" and task.tolerance == (2e-2, 2e-2)
    assert task.flops == pytest.approx(2 * 64 * 256 * 128, rel=0.01)      # XLA's cost analysis
    assert task.bytes_moved == 2 * (64 * 256 + 256 * 128 + 64 * 128) + 4 * (8 + 3)
    assert task.key.startswith("mm/bfloat16_64x256.bfloat16_256x128.int32_8.int32_3-")


def test_draws_keep_shapes_and_ranges_and_differ(task):
    a, b = task.make_inputs(1, "normal"), task.make_inputs(2, "normal")
    assert [(x.shape, str(x.dtype)) for x in a] == [(s, d) for s, d in task.input_specs()]
    assert not np.array_equal(np.asarray(a[0], np.float32), np.asarray(b[0], np.float32))
    assert a[2].min() >= 0 and a[2].max() <= 7                       # redrawn in the example's range
    assert np.array_equal(a[3], [3, 1, 4]) and np.array_equal(b[3], [3, 1, 4])    # STATIC: kept
    scaled = [np.abs(np.asarray(task.make_inputs(s, "scaled")[0], np.float32)).mean() for s in range(6)]
    assert max(scaled) / min(scaled) > 2                              # a drawn scale, not always 1
    outliers = np.abs(np.asarray(task.make_inputs(3, "outliers")[0], np.float32)).max()
    assert outliers > 10 * np.abs(np.asarray(a[0], np.float32)).max() / 2


def test_the_truth_is_the_workload_in_f32_on_the_cpu(task):
    x, w, ids, sizes = task.make_inputs(5, "normal")
    truth = task.reference(x, w, ids, sizes)
    expected = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    assert truth.dtype == np.float32
    np.testing.assert_allclose(truth, expected, rtol=1e-4, atol=1e-3)


RAGGED_FILE = """
import jax, jax.numpy as jnp
import numpy as np

RAGGED = {"sizes": ("x", 0)}

def create_inputs():
    x = np.ones((64, 128), np.float32).astype(jnp.bfloat16)
    w = np.ones((4, 128, 128), np.float32).astype(jnp.bfloat16)
    return x, w, np.array([10, 0, 50, 4], np.int32)

def workload(x, w, sizes):
    return jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)

def flops(x, w, sizes):
    return 2 * x.shape[0] * x.shape[1] * w.shape[2]
"""


def test_ragged_sizes_are_drawn_to_add_up_and_flops_may_be_given(tmp_path):
    """RAGGED sizes are secret draws that still split the dimension (some draws leave a group
    empty); a file's flops() replaces XLA's count, which charges ragged_dot every group."""
    task = Task.read(write(tmp_path, "moe.py", RAGGED_FILE), None)
    draws = [task.make_inputs(seed, "normal")[2] for seed in range(40)]
    assert all(d.sum() == 64 and d.min() >= 0 and d.shape == (4,) for d in draws)
    assert len({tuple(d) for d in draws}) > 30 and any((d == 0).any() for d in draws)
    assert task.flops == 2 * 64 * 128 * 128


@pytest.mark.parametrize("ragged, message", [
    ('{"nope": ("x", 0)}', "RAGGED names 'nope'"),
    ('{"sizes": ("x", 5)}', "give \\(input, dim\\)"),
    ('{"sizes": ("w", 1)}', "adding up to w's dimension 1 \\(128\\)"),
])
def test_a_bad_ragged_declaration_is_one_line(tmp_path, ragged, message):
    text = RAGGED_FILE.replace('RAGGED = {"sizes": ("x", 0)}', f"RAGGED = {ragged}")
    with pytest.raises(ReferenceError, match=message) as info:
        Task.read(write(tmp_path, "moe.py", text), None)
    assert "\n" not in str(info.value)


def test_a_large_input_is_drawn_in_f32_with_the_same_distributions(monkeypatch):
    """Past _LARGE entries a float input is drawn in f32 in place (a gigabyte of weights must not
    take ten in f64): the same mean, spread, outliers and scale as a small one."""
    from seeds import reference

    monkeypatch.setattr(reference, "_LARGE", 1000)
    spec = {"shape": [200, 100], "dtype": "bfloat16", "kind": "float", "static": False, "mean": 1.0, "std": 2.0}
    rng = np.random.default_rng(0)
    normal = np.asarray(reference._draw(spec, rng, "normal", 1.0), np.float32)
    assert normal.dtype == np.float32 and abs(normal.mean() - 1.0) < 0.1 and abs(normal.std() - 2.0) < 0.1
    outliers = np.asarray(reference._draw(spec, rng, "outliers", 3.0), np.float32)
    assert np.abs(outliers).max() > 50 and abs(np.median(outliers) - 3.0) < 0.3


def test_the_entry_is_found_or_named():
    assert kernel_entry(KERNEL, 4) == "matmul"
    assert kernel_entry(KERNEL, 4, "helper") == "helper"
    with pytest.raises(ReferenceError, match="--entry"):
        kernel_entry(KERNEL, 2)                  # no public function of two inputs reaches pallas_call
    with pytest.raises(ReferenceError, match="defines no 'nope'"):
        kernel_entry(KERNEL, 4, "nope")
    two = KERNEL + "\ndef matmul2(x, w, ids, sizes):\n    return _call(x, w, 16)\n"
    with pytest.raises(ReferenceError, match="2 functions"):
        kernel_entry(two, 4)
    # Of several, a seed's own entry name is the one a start is read at (megablox: gmm beside tgmm).
    assert kernel_entry(two, 4, prefer="matmul2") == "matmul2"
    with pytest.raises(ReferenceError, match="2 functions"):
        kernel_entry(two, 4, prefer="absent")


def test_an_entry_bound_by_partial_or_jit_is_found_with_what_it_binds_taken_away(task):
    """A public name bound to ``functools.partial(f, ...)`` or ``jax.jit(f)`` of a private ``f``
    is a caller's entry: the partial's bound arguments are not the workload's inputs."""
    private = KERNEL.replace("def matmul(lhs, rhs, ids, sizes, *, block_m=32):",
                             "def _matmul(block_m, lhs, rhs, ids, sizes):")
    partial = private + "\nmatmul = functools.partial(_matmul, 32)\n"
    assert kernel_entry(partial, 4) == "matmul"
    assert entry_names(partial, "matmul", 4) == ("lhs", "rhs", "ids", "sizes")
    keyword = KERNEL.replace("def matmul(", "def _matmul(") + "\nmatmul = functools.partial(_matmul, block_m=16)\n"
    assert kernel_entry(keyword, 4) == "matmul"
    jitted = KERNEL.replace("def matmul(", "def _matmul(") + "\nmatmul = jax.jit(_matmul, static_argnames='block_m')\n"
    assert kernel_entry(jitted, 4) == "matmul"
    with pytest.raises(ReferenceError, match="no public function"):
        kernel_entry(private, 4)                 # nothing public: the partial was the only way in
    with pytest.raises(ReferenceError, match="no public function"):
        kernel_entry(private + "\nmatmul = functools.partial(_matmul, 32, 0)\n", 4)   # binds an input
    assert Task.read(task.path, partial).entry == "matmul"


@pytest.mark.parametrize("text, message", [
    ("def workload(x):\n    return x\n", "defines no function create_inputs"),
    ("def create_inputs():\n    raise RuntimeError('boom')\ndef workload(x):\n    return x\n",
     "create_inputs\\(\\) raises RuntimeError: boom"),
    ("import numpy as np\ndef create_inputs():\n    return (np.ones((8, 128), np.float32),)\n"
     "def workload(x):\n    return x @ x\n", "workload\\(\\*create_inputs\\(\\)\\) raises TypeError"),
    ("import numpy as np\ndef create_inputs():\n    return (np.ones((8, 128), np.float32),)\n"
     "def workload(x):\n    return x, x\n", "it must return one array"),
    ("import numpy as np\nSTATIC = ('x',)\ndef create_inputs():\n    return (np.ones((8, 128), np.float32),)\n"
     "def workload(x):\n    return x\n", "a float input"),
    ("def create_inputs(:\n", "is not Python"),
])
def test_a_file_that_breaks_the_contract_is_one_line(tmp_path, text, message):
    with pytest.raises(ReferenceError, match=message) as info:
        Task.read(write(tmp_path, "bad.py", text), KERNEL)
    assert "\n" not in str(info.value)


def evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_eval_judges_a_kernel_against_a_reference_file(tmp_path):
    write(tmp_path, "mm.py", MATMUL)
    write(tmp_path, "k.py", KERNEL)
    r = evolve("eval", "k.py", "--reference", "mm.py", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "PASS" and out["speedup_vs_reference"], out["error"]
    write(tmp_path, "wrong.py", KERNEL.replace(".astype(o_ref.dtype)", ".astype(o_ref.dtype) * 2"))
    r = evolve("eval", "wrong.py", "--reference", "mm.py", "--json", cwd=tmp_path)
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "FAIL_CORRECTNESS"


@pytest.mark.parametrize("args, message", [
    (["--reference", "missing.py"], "missing.py; give the path of a Python file"),
    (["--reference", "mm.py", "--shape", "M=1"], "create_inputs takes no 'M'; it takes no shape keywords"),
    (["--reference", "mm.py", "--dtype", "float32"], "--dtype does not apply to --reference"),
    (["--reference", "mm.py", "--seed", "flash_attention"], "both name the task"),
    (["--reference", "mm.py", "--entry", "nope"], "defines no 'nope'"),
    (["--reference", "short.py"], "the kernel and the reference file's workload disagree: output shape"),
])
def test_bad_reference_input_is_one_line_and_exit_2(tmp_path, args, message):
    write(tmp_path, "mm.py", MATMUL)
    write(tmp_path, "short.py", MATMUL.replace(".astype(x.dtype)", ".astype(x.dtype)[:32]"))
    write(tmp_path, "k.py", KERNEL)
    r = evolve("eval", "k.py", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


SIZED = """
import jax.numpy as jnp
import numpy as np

def create_inputs(M=64, N=128):
    return (np.ones((M, N), np.float32),)

def workload(x):
    return x * 2
"""


def test_create_inputs_keywords_are_the_shape(tmp_path):
    path = write(tmp_path, "sized.py", SIZED)
    assert Task.read(path, entry="double").input_specs() == [((64, 128), "float32")]
    task = Task.read(path, entry="double", shape="M=16")
    assert task.input_specs() == [((16, 128), "float32")] and task.grammar == "M=64,N=128"
    assert task.key != Task.read(path, entry="double").key
    for bad, message in (("Q=1", "takes no 'Q'; its shape is M=64,N=128"), ("M=x", "must be an integer"),
                         ("M=0", "must be positive")):
        with pytest.raises(ReferenceError, match=message):
            Task.read(path, entry="double", shape=bad)


def test_a_seed_directory_may_hold_a_reference_file_for_its_task():
    from seeds import builtin_seeds, load_seed

    assert "matmul" in builtin_seeds()
    seed = load_seed("matmul")
    task = seed.task("M=128,K=256,N=256")
    assert seed.name == "matmul" and task.entry == "matmul" and task.input_names == ("a", "b")
    assert task.input_specs() == [((128, 256), "bfloat16"), ((256, 256), "bfloat16")]
    assert seed.default_task().input_specs()[0][0] == (4096, 4096)


def test_a_run_from_a_reference_seed_moves_its_discovered_blocks(tmp_path):
    """The matmul seed (a reference file, BLOCK_* constants its task declares nothing about): the
    search's block moves come from discovery, and what they write passes the judge."""
    import pyarrow.parquet as pq

    r = evolve("run", "--seed", "matmul", "--shape", "M=128,K=256,N=256", "--population", "3",
               "--generations", "1", "--data-dir", str(tmp_path / "data"), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [row for f in (tmp_path / "data").rglob("*.parquet") for row in pq.read_table(f).to_pylist()]
    moved = [row for row in rows if "block_sizes" in (row["operator"] or "") and row["status"] == "PASS"]
    assert moved, [(row["operator"], row["status"], row["error"]) for row in rows]


def test_a_run_whose_moves_run_out_says_so(tmp_path):
    """rmsnorm at 8 x 128 has one block size (8 rows) and its weight single-buffered or not
    (buffering); the six VMEM limits vmem_limit offers change no figure, so the search breeds each
    kernel at one of them: two kernels in all, and the run says why it judged no more of its budget."""
    r = evolve("run", "--seed", "rmsnorm", "--shape", "T=8,D=128", "--population", "4", "--generations", "6",
               "--data-dir", str(tmp_path / "data"), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "judged 2 of the budget's 16 kernels: for the rest the operators offered none" in r.stdout
    assert "only in its VMEM limit" in r.stdout


def test_a_reference_file_names_its_default_chip_and_shape_without_running(tmp_path):
    """``CHIP`` and ``SMALL`` are read from the file's text (seeds/reference.py ``_task_class``):
    the JAXBench seeds are judged for the v6e Autocomp measured on; a file naming neither is v5e's."""
    from seeds import load_seed
    from seeds.reference import reference_seed

    assert load_seed("retnet").task_class.default_chip == "v6e"
    assert load_seed("matmul").task_class.default_chip == "v5e"
    own = tmp_path / "own.py"
    own.write_text('CHIP = "v6e"\nSMALL = "N=8"\nimport jax.numpy as jnp\n\n'
                   'def create_inputs(N=64):\n    return (jnp.ones((N,), jnp.float32),)\n\n'
                   'def workload(x):\n    return x * 2\n')
    task_class = reference_seed(own).task_class
    assert task_class.default_chip == "v6e" and task_class.test_tasks == {"small": ("N=8", {})}
    assert task_class.default_memory_gib == 0


def test_a_reference_file_names_the_memory_its_judged_children_get_and_a_flag_overrides_it(tmp_path):
    """``MEMORY = 16`` (an int, read from the text): the default of ``--memory`` for its tasks on
    eval, run and the suite; Mamba-2's model-shape profile needs more than the judge's 12 GiB."""
    import argparse

    from evolve.cli.eval import task_from_args
    from evolve.config import JudgeSettings, load_config
    from evolve.experiments.suite import SUITES
    from seeds import load_seed
    from seeds.reference import reference_seed

    assert load_seed("mamba2_ssd").task_class.default_memory_gib == 20
    assert load_seed("retnet").task_class.default_memory_gib == 0
    own = tmp_path / "own.py"
    own.write_text('MEMORY = 20\nimport jax.numpy as jnp\n\n'
                   'def create_inputs(N=64):\n    return (jnp.ones((N,), jnp.float32),)\n\n'
                   'def workload(x):\n    return x * 2\n')
    assert reference_seed(own).task_class.default_memory_gib == 20
    config = load_config(None, {"task": {"seed": "mamba2_ssd"}, "judge": {}})
    assert config.judge.memory_gib == 20 and config.judge.chip == "v6e"
    assert load_config(None, {"task": {"seed": "mamba2_ssd"}, "judge": {"memory_gib": 22}}).judge.memory_gib == 22
    assert load_config(None, {"task": {"seed": "retnet"}, "judge": {}}).judge.memory_gib == 0
    mamba = next(t for t in SUITES["jaxbench"] if t.seed == "mamba2_ssd")
    assert mamba.judge_settings(JudgeSettings()).memory_gib == 20
    assert mamba.judge_settings(JudgeSettings(memory_gib=24)).memory_gib == 24
    args = argparse.Namespace(seed="mamba2_ssd", shape=None, causal=None, dtype=None, chips=None, chip=None,
                              memory=None, reference=None, start=None, entry=None, order=None)
    task_from_args(args)
    assert args.memory == 20 and args.chip == "v6e"


def test_a_reference_child_killed_by_a_signal_says_so_in_one_line(tmp_path):
    """A reference child killed by a signal (the out-of-memory killer's SIGKILL at a model's shape)
    is named by its signal, not by whatever line it printed last."""
    text = MATMUL.replace("def create_inputs():\n", "def create_inputs():\n    import os, signal\n"
                          "    os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(ReferenceError, match="killed by SIGKILL: out of memory") as info:
        Task.read(write(tmp_path, "killed.py", text), None)
    assert "\n" not in str(info.value)
