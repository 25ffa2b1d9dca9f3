"""A reference file with no kernel is served by the built-in seeds whose SIGNATURE its inputs fit
(seeds/signature.py, evolve/start/serve.py): matched by shape and dtype in any order, each fitting
seed judged on the user's workload, the best that passes taken, every seed tried reported; none
fitting is one line, exit 2, nothing stored (issue 58)."""

from __future__ import annotations

import json

import pytest

from evaluator.result import EvalResult, Metrics, Status
from evolve.config import TaskConfig
from evolve.errors import UsageError
from evolve.start.serve import candidates, serve, served_config, serving_memory, wants_serving
from seeds.signature import SignatureError, declared, fits, parse, why_not
from tests.cli_runs import evolve

MATMUL = parse("a: bf16[M,K], b: bf16[K,N]")
SWAPPED = '''"""y = x @ w, the weight first: not the matmul seed's order, nor its names."""
import jax
import jax.numpy as jnp


def create_inputs():
    kw, kx = jax.random.split(jax.random.key(1))
    w = (jax.random.normal(kw, (256, 256), jnp.float32) / 16).astype(jnp.bfloat16)
    x = jax.random.normal(kx, (128, 256), jnp.bfloat16)
    return w, x


def workload(w, x):
    return jnp.matmul(x, w).astype(x.dtype)
'''
UNFIT = '''import jax.numpy as jnp
import numpy as np


def create_inputs():
    return (np.ones((8, 8, 8), np.float32),)


def workload(x):
    return jnp.sin(x)
'''


def test_a_signature_reads_names_dtypes_and_dimension_symbols():
    (a, b) = MATMUL
    assert (a.name, a.dtype, a.dims) == ("a", "bfloat16", ("M", "K")) and str(b) == "b: bf16[K,N]"
    (w,) = parse("w: f32[1, D]")
    assert w.dims == (1, "D")
    for bad, said in (("a: bf16", "is not 'name: dtype"), ("a: f8[M]", "unknown dtype"),
                      ("a: bf16[m]", "neither an integer nor an upper-case symbol"), ("", "is not")):
        with pytest.raises(SignatureError, match=said):
            parse(bad)


def test_inputs_fit_in_any_order_that_binds_every_symbol_to_one_size():
    x, w = ((128, 256), "bfloat16"), ((256, 512), "bfloat16")
    assert fits(MATMUL, [x, w]) == [(0, 1)]
    assert fits(MATMUL, [w, x]) == [(1, 0)]                      # the weight first: the seed takes x first
    assert fits(MATMUL, [x, ((128, 512), "bfloat16")]) == []     # K would be 256 and 128
    assert fits(MATMUL, [x, ((256, 512), "float32")]) == []
    assert "no order" in why_not(MATMUL, [x, ((128, 512), "bfloat16")])
    assert why_not(MATMUL, [x]) == "takes 2 inputs, the workload has 1"
    assert "dtypes and ranks" in why_not(MATMUL, [x, ((256, 512), "float32")])


def test_of_several_fitting_orders_the_names_then_the_places_come_first():
    qkv = parse("q: bf16[B,S,D], k: bf16[B,S,D], v: bf16[B,S,D]")
    same = [((2, 64, 32), "bfloat16")] * 3
    assert fits(qkv, same)[0] == (0, 1, 2) and len(fits(qkv, same)) == 6
    assert fits(qkv, same, ("v", "q", "k"))[0] == (1, 2, 0)


def test_every_builtin_reference_seed_declares_a_signature_that_reads():
    found = dict(candidates())
    assert {"matmul", "rmsnorm", "grouped_matmul"} <= set(found)
    for name, path in found.items():
        assert declared(path) is not None, f"seeds/{name}/reference.py declares no SIGNATURE"


def _fake(right: dict[str, str], judged: list):
    """A judging function: PASS only for a seed's kernel called in the order ``right`` names."""
    def judging(task):
        def judge(source):
            seed = "matmul" if "def matmul(" in source else "other"
            judged.append((seed, task.order))
            ok = right.get(seed) == task.order
            status = Status.PASS if ok else Status.FAIL_CORRECTNESS
            return EvalResult(status, error="" if ok else "max abs error 3.2 over tolerance\nmore",
                              metrics=Metrics(speedup_vs_reference=0.9 if ok else None))
        return judge
    return judging


def test_a_reference_with_no_kernel_is_served_by_the_seed_that_passes_on_it(tmp_path):
    ref = tmp_path / "mine.py"
    ref.write_text(SWAPPED)
    config = TaskConfig(reference=str(ref))
    assert wants_serving(config) and not wants_serving(TaskConfig(reference=str(ref), start="k.py"))
    judged: list = []
    found = serve(config, _fake({"matmul": "1,0"}, judged))
    assert judged == [("matmul", "1,0")]                  # only the seed that fits is judged
    assert found.taken.seed == "matmul" and found.taken.mapping == "a=x, b=w"
    report = found.report()
    assert report.startswith("seeds tried for mine.py (no kernel given):")
    assert "matmul: PASS (a=x, b=w), 0.900x the XLA program: taken" in report
    assert "rmsnorm: no order of the workload's inputs binds its dimensions consistently" in report
    assert "grouped_matmul: takes 3 inputs, the workload has 2" in report
    assert served_config(config, found) == TaskConfig(reference=str(ref), start="matmul", order="1,0")


def test_a_seed_that_fails_on_every_fitting_order_is_named_with_its_verdict(tmp_path):
    ref = tmp_path / "mine.py"
    ref.write_text(SWAPPED)
    found = serve(TaskConfig(reference=str(ref)), _fake({}, []))
    assert found.taken is None
    with pytest.raises(UsageError) as err:
        served_config(TaskConfig(reference=str(ref)), found)
    line = str(err.value)
    assert "\n" not in line and line.startswith("no built-in seed serves mine.py:")
    assert "matmul (FAIL_CORRECTNESS: max abs error 3.2 over tolerance)" in line and "bring a kernel" in line


def test_no_seed_fitting_is_one_line_exit_2_and_nothing_stored(tmp_path):
    ref = tmp_path / "unfit.py"
    ref.write_text(UNFIT)
    data = tmp_path / "data"
    r = evolve("run", "--reference", str(ref), "--data-dir", str(data), "--executor", "fake")
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert "no built-in seed serves unfit.py" in line and "matmul (takes 2 inputs, the workload has 1)" in line
    assert not data.exists()
    r = evolve("eval", "--reference", str(ref), "--start", "auto")
    assert r.returncode == 2 and "no built-in seed serves unfit.py" in r.stderr
    r = evolve("eval", "--start", "auto", "--seed", "matmul")
    assert r.returncode == 2 and "give --reference R.py" in r.stderr


def test_a_run_from_a_reference_alone_starts_from_the_seed_and_resumes_in_its_order(tmp_path):
    ref = tmp_path / "mine.py"
    ref.write_text(SWAPPED)
    data = tmp_path / "data"
    r = evolve("run", "--reference", str(ref), "--data-dir", str(data), "--executor", "fake", "--population", "4",
               "--generations", "1", "--no-peers", "--chip", "v6e")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "seeds tried for mine.py" in r.stderr and "matmul: PASS (a=x, b=w)" in r.stderr
    (run_id,) = [p.stem for p in (data / "runs").glob("*.json")]
    meta = json.loads((data / "runs" / f"{run_id}.json").read_text())
    assert meta["config"]["task"]["start"] == "matmul" and meta["config"]["task"]["order"] == "1,0"
    assert meta["start"]["name"] == "matmul"
    # no --memory: the most a serving seed names (mamba2_ssd's 20 GiB at its model shape), stored
    assert meta["config"]["judge"]["memory_gib"] == serving_memory() == 20
    r = evolve("resume", run_id, "--data-dir", str(data), "--executor", "fake")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "seeds tried" not in r.stderr                 # the stored start and order, not served again
