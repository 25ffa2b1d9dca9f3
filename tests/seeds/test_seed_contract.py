"""The seed contract: every built-in seed (and the README's example seed) meets it, and a seed
directory that breaks it gets one line saying what is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seeds import SeedError, SeedTask, builtin_seeds, load_seed, task_from_source, task_source

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed_axpy"
SEEDS = [*builtin_seeds(), str(EXAMPLE)]
def _small(seed):
    """The seed's own small problem (``SeedTask.test_tasks["small"]``), for the checks that run its reference."""
    shape, options = seed.task_class.test_tasks["small"]
    return seed.task(shape, **options)


@pytest.mark.parametrize("name", SEEDS, ids=lambda s: Path(s).name)
def test_every_seed_meets_the_contract(name):
    seed = load_seed(name)
    task = seed.default_task()
    assert isinstance(task, SeedTask) and task.key.startswith(f"{seed.name}/")
    assert seed.description and "\n" not in seed.description
    assert f"def {task.entry}" in seed.kernel_source
    assert len(task.input_specs()) == len(task.input_names)
    json.dumps([task.fields(), task.input_specs(), task.kernel_kwargs()])   # it travels to the children
    assert task.flops > 0 and task.bytes_moved > 0
    atol, rtol = task.tolerance
    assert 0 < atol < 1 and 0 < rtol < 1
    assert {d for d, _ in task.correctness_inputs} <= set(task.distributions)
    # The default task parses back from its own grammar.
    assert seed.task(task.shape_grammar) == task
    small = _small(seed)
    for distribution in small.distributions:
        inputs = small.make_inputs(0, distribution)
        assert [(a.shape, str(a.dtype)) for a in inputs] == [(tuple(s), d) for s, d in small.input_specs()]
        again = small.make_inputs(0, distribution)
        assert all(np.array_equal(a, b) for a, b in zip(inputs, again))        # seeded
        # What the estimate's traffic count reads (index maps read integer inputs): the same values
        # as the full inputs, and every small integer input among them.
        small_ones = small.small_inputs(0, distribution)
        by_name = dict(zip(small.input_names, inputs, strict=True))
        assert all(np.array_equal(a, by_name[n]) for n, a in small_ones.items())
        assert {n for n, a in by_name.items() if a.dtype.kind in "iu" and a.nbytes <= small.SMALL_INPUT_BYTES} \
            <= small_ones.keys()
    truth = small.reference(*inputs)
    assert truth.dtype == np.float32 and np.isfinite(truth).all()


@pytest.mark.parametrize("name", SEEDS, ids=lambda s: Path(s).name)
def test_every_chip_count_a_seed_offers_cuts_its_inputs_into_shares_of_the_promised_shapes(name):
    seed = load_seed(name)
    assert seed.task_class.mesh_sizes[0] == 1 and seed.default_task().chips == 1
    assert _small(seed).chip_specs(1) == _small(seed).input_specs()
    for chips in seed.task_class.mesh_sizes[1:]:
        task = seed.task(seed.task_class.test_tasks["small"][0], chips=chips)
        distribution, rng_seed = task.correctness_inputs[0]
        inputs = task.make_inputs(rng_seed, distribution)
        for name_, array, (shape, dtype) in zip(task.input_names, inputs, task.chip_specs(chips), strict=True):
            shares = task.chip_split(name_, array, chips)
            assert shares.shape == (chips, *shape) and str(shares.dtype) == dtype, name_


@pytest.mark.parametrize("name", SEEDS, ids=lambda s: Path(s).name)
def test_the_reference_program_agrees_with_the_f32_reference(name):
    import jax.numpy as jnp

    small = _small(load_seed(name))
    inputs = small.make_inputs(1, small.distributions[0])
    out = np.asarray(small.reference_program()(*[jnp.asarray(a) for a in inputs]), np.float32)
    atol, rtol = small.tolerance
    np.testing.assert_allclose(out, small.reference(*inputs), atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", SEEDS, ids=lambda s: Path(s).name)
def test_a_trusted_child_rebuilds_the_task_from_its_source(name):
    task = _small(load_seed(name))
    again = task_from_source(task_source(task), task.fields())
    assert again.key == task.key and again.input_specs() == task.input_specs()


def test_builtin_seeds_are_one_class_however_reached():
    from seeds.flash_attention.task import AttentionTask

    assert load_seed("flash_attention").task_class is AttentionTask
    assert load_seed(str(ROOT / "seeds" / "flash_attention")).task_class is AttentionTask
    # A seed directory's task.py is executed once, however often the seed is loaded.
    assert load_seed(str(EXAMPLE)).task_class is load_seed(str(EXAMPLE)).task_class


@pytest.mark.parametrize("break_it, message", [
    (lambda d: (d / "task.py").unlink(), "has no task.py"),
    (lambda d: (d / "kernel.py").unlink(), "has no kernel.py"),
    (lambda d: (d / "task.py").write_text("X = 1\n"), "defines no class Task(SeedTask)"),
    (lambda d: (d / "task.py").write_text("import nonexistent_module\n"), "task.py fails to import"),
    (lambda d: (d / "task.py").write_text((d / "task.py").read_text().replace('entry = "axpy"', 'entry = ""')),
     "sets no 'entry'"),
    (lambda d: (d / "task.py").write_text((d / "task.py").read_text().replace("def reference_program",
                                                                                "def _reference_program")),
     "does not define reference_program"),
    (lambda d: (d / "kernel.py").write_text("def other(x, y, *, alpha):\n    return x\n"), "defines no 'axpy'"),
])
def test_a_seed_that_breaks_the_contract_is_named_in_one_line(tmp_path, break_it, message):
    seed_dir = tmp_path / "my_seed"
    shutil.copytree(EXAMPLE, seed_dir)
    load_seed(seed_dir)                       # whole, it loads
    break_it(seed_dir)
    with pytest.raises(SeedError) as info:
        load_seed(seed_dir)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_cli_refuses_a_broken_seed_with_one_line_and_exit_2(tmp_path):
    seed_dir = tmp_path / "my_seed"
    shutil.copytree(EXAMPLE, seed_dir)
    (seed_dir / "task.py").unlink()
    for argv in (["eval", str(seed_dir / "kernel.py"), "--seed", str(seed_dir)],
                 ["run", "--seed", str(seed_dir), "--data-dir", str(tmp_path / "data")],
                 ["ablate", "--seed", "no_such_seed"]):
        proc = subprocess.run([sys.executable, "-m", "evolve", *argv], capture_output=True, text=True,
                              cwd=tmp_path, check=False)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "task.py" in proc.stderr or "unknown seed 'no_such_seed'" in proc.stderr
    assert not (tmp_path / "data" / "archive").exists()


def test_evolve_seeds_lists_each_builtin_with_its_default_task():
    proc = subprocess.run([sys.executable, "-m", "evolve", "seeds"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    for name in builtin_seeds():
        seed = load_seed(name)
        assert name in proc.stdout and seed.default_task().key in proc.stdout and seed.description in proc.stdout


def test_a_users_seed_outside_the_repository_runs_end_to_end(tmp_path):
    """Copied out of the repository, the example seed goes through eval, run and lineage."""
    import pandas as pd

    seed_dir = tmp_path / "elsewhere" / "my_axpy"
    shutil.copytree(EXAMPLE, seed_dir)
    data = tmp_path / "data"

    def evolve(*argv):
        return subprocess.run([sys.executable, "-m", "evolve", *argv], capture_output=True, text=True,
                              cwd=tmp_path, check=False)

    proc = evolve("eval", str(seed_dir / "kernel.py"), "--seed", str(seed_dir), "--shape", "M=64,N=256", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "PASS"
    proc = evolve("run", "--seed", str(seed_dir), "--shape", "M=64,N=256", "--population", "3",
                  "--generations", "1", "--data-dir", str(data))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.concat(pd.read_parquet(p) for p in (data / "archive").rglob("*.parquet"))
    assert set(rows["task_key"]) == {"axpy/M64-N256-float32"}
    # A budget of 4; at 64 rows the kernel's few block sizes (its VMEM limits give no new figure)
    # may leave fewer to breed.
    assert 3 <= len(rows) <= 4 and (rows["status"] == "PASS").any()
    champion = proc.stdout.split("champion ")[1].split()[0]
    proc = evolve("lineage", champion, "--data-dir", str(data))
    assert proc.returncode == 0, proc.stderr
    assert "seed" in proc.stdout


@pytest.mark.parametrize("op", __import__("mutations").operator_names())
def test_every_operator_answers_a_seed_it_was_not_written_for_as_a_value(op):
    """On a kernel that is not attention, an operator applies (block_sizes: the task declares the
    tunable's legal values; vmem_limit: any kernel has a limit; dimension_semantics: its one row
    axis, independent, may be stated parallel) or says 'not applicable'; it never fails or raises."""
    import random

    from mutations import get_operator

    seed = load_seed(str(EXAMPLE))
    task = seed.task("M=256,N=256")
    result = get_operator(op).apply(seed.kernel_source, task, random.Random(0))
    if op == "block_sizes":
        assert result.status == "applied" and result.edit.params["tunable"] == "BLOCK_ROWS"
        assert result.edit.params["value"] in task.legal_values("BLOCK_ROWS")
    elif op == "vmem_limit":
        assert result.status == "applied", result.reason
        assert "compiler_params=pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT_BYTES)" in result.source
    elif op == "dimension_semantics":
        assert result.status == "applied", result.reason
        assert 'dimension_semantics=("parallel",)' in result.source
    else:
        assert result.status == "not_applicable", (result.status, result.reason)
        assert "Error" not in result.reason, result.reason
