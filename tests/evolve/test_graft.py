"""Grafting a seed's kernel into a larger workload (evolve/start/graft.py): what matches, what is refused,
and the CLI's start from the matmul seed on ``gelu(x @ w + b)``, judged and fused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.start.graft import Graft, graft, graft_file
from seeds.reference import kernel_entry

ROOT = Path(__file__).resolve().parents[2]
MATMUL = ROOT / "seeds" / "matmul"

GELU_REF = '''
import jax
import jax.numpy as jnp

def create_inputs(M=256, K=256, N=256):
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(kx, (M, K), jnp.bfloat16),
            (jax.random.normal(kw, (K, N), jnp.float32) / 16).astype(jnp.bfloat16),
            jax.random.normal(kb, (1, N), jnp.bfloat16))

def workload(x, w, b):
    y = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
    return jax.nn.gelu(y).astype(x.dtype)
'''


def _graft(reference: str) -> Graft | str:
    source = (MATMUL / "kernel.py").read_text()
    return graft(source, "matmul", (MATMUL / "reference.py").read_text(), reference)


def test_the_matmul_seed_grafts_into_a_workload_around_its_dot():
    done = _graft(GELU_REF)
    assert isinstance(done, Graft), done
    assert done.entry == "workload" and done.replaced == ("jnp.dot(x, w, preferred_element_type=jnp.float32)",)
    assert "    y = matmul(x, w) + b.astype(jnp.float32)\n" in done.source
    assert kernel_entry(done.source, 3) == "workload"      # the one entry taking the workload's inputs
    compile(done.source, "grafted", "exec")


def test_the_whole_expression_is_preferred_and_every_occurrence_is_replaced():
    reference = GELU_REF.replace(
        "    y = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)\n",
        "    y = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype) + b\n"
        "    y = y + jnp.dot(y, w, preferred_element_type=jnp.float32).astype(y.dtype)\n")
    done = _graft(reference)
    assert isinstance(done, Graft), done
    assert "    y = matmul(x, w) + b\n    y = y + matmul(y, w)\n" in done.source


@pytest.mark.parametrize("product, rounded", [
    ("x @ w", False),
    ("jnp.matmul(x, w)", False),
    ("jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)", False),
    ("jnp.einsum('mk,kn->mn', x, w)", False),
    ("jnp.einsum('ij, jk -> ik', x, w)", False),
    ("jax.lax.dot(x, w, preferred_element_type=jnp.float32)", True),
    ("jnp.matmul(x, w, preferred_element_type=jnp.float32)", True),
])
def test_the_same_product_written_another_way_is_grafted(product, rounded):
    reference = GELU_REF.replace("jnp.dot(x, w, preferred_element_type=jnp.float32)", product)
    done = _graft(reference)
    assert isinstance(done, Graft), done
    assert done.replaced == (product,)
    assert "    y = matmul(x, w) + b.astype(jnp.float32)\n" in done.source
    assert done.note.endswith(", rounded to the kernel's output dtype") == rounded
    compile(done.source, "grafted", "exec")


@pytest.mark.parametrize("product", [
    "jnp.einsum('mk,nk->mn', x, w)",           # w transposed: another product
    "x @ w.T",                                 # an operand that is not one of the workload's names
    "jnp.dot(x, w, out_sharding=None)",        # a keyword the graft does not know
    "jnp.einsum('mk,kn->mn', x, w, optimize=True)",
])
def test_a_product_that_is_not_the_kernel_s_is_not_grafted(product):
    done = _graft(GELU_REF.replace("jnp.dot(x, w, preferred_element_type=jnp.float32)", product))
    assert isinstance(done, str) and "a product of two matrices written otherwise" in done, done


@pytest.mark.parametrize("body, why", [
    ("return jnp.sum(x) + w + b", "nothing in the reference file's workload computes"),
    ("return jnp.dot(w, x, preferred_element_type=jnp.int32) + b", "nothing in"),
    ("return jnp.dot(x, w, preferred_element_type=jnp.float32) * SCALE + b", "'SCALE' of its own file"),
    ("return jnp.dot(x, w, preferred_element_type=jnp.float32) + helper(b)", "'helper', which its file does not"),
])
def test_a_workload_that_cannot_take_the_kernel_says_why(body, why):
    reference = GELU_REF.split("def workload")[0] + f"SCALE = 2\n\ndef workload(x, w, b):\n    {body}\n"
    done = _graft(reference)
    assert isinstance(done, str) and why in done, done


def test_an_import_the_kernel_lacks_comes_with_the_workload_and_a_name_bound_otherwise_is_refused():
    reference = GELU_REF.replace("import jax\n", "import jax\nimport jax.scipy.special as jss\n").replace(
        "jax.nn.gelu(y)", "jss.erf(y)")
    done = _graft(reference)
    assert isinstance(done, Graft) and "\nimport jax.scipy.special as jss\n" in done.source, done
    clash = _graft(reference.replace("import jax.scipy.special as jss", "import numpy as jnp2").replace(
        "jss.erf(y)", "jnp2.tanh(y)").replace("import jax\n", "import jax\nimport numpy as pl\n").replace(
        "jnp2.tanh(y)", "pl.tanh(y)"))
    assert isinstance(clash, str) and "'pl'" in clash and "another thing in the kernel" in clash


def test_no_graft_where_the_kernel_takes_the_workloads_inputs_or_is_the_files_own(tmp_path):
    source = (MATMUL / "kernel.py").read_text()
    assert graft_file(source, MATMUL / "kernel.py", MATMUL / "reference.py") is None
    (tmp_path / "R.py").write_text(GELU_REF.replace("def workload(x, w, b):", "def workload(x, w):").replace(
        " + b.astype(jnp.float32)", ""))
    assert graft_file(source, MATMUL / "kernel.py", tmp_path / "R.py") is None       # matmul(x, w) takes it
    (tmp_path / "R.py").write_text(GELU_REF)
    assert isinstance(graft_file(source, tmp_path / "kernel.py", tmp_path / "R.py"), type(None))  # no own file


def evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def test_the_matmul_seed_started_on_a_gelu_workload_is_judged_and_fuses_its_epilogue(tmp_path):
    (tmp_path / "R.py").write_text(GELU_REF)
    r = evolve("eval", "--reference", "R.py", "--start", "matmul", "--estimate-only", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    grafted = json.loads(r.stdout)
    assert "rounded to the kernel's output dtype" in grafted["start"]["label"], grafted["start"]
    r = evolve("mutate", "--reference", "R.py", "--start", "matmul", "--op", "fuse_epilogue", "--out", "fused.py",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    fused = (tmp_path / "fused.py").read_text()
    assert "return matmul(x, w, epilogue_b=b)" in fused
    r = evolve("eval", "fused.py", "--reference", "R.py", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    # the epilogue now works on the f32 accumulator and rounds once, as the XLA program does
    assert result["status"] == "PASS", result["error"]
    assert result["max_abs_error"] <= result["reference_max_abs_error"] * 1.01
    # and the output no longer makes the trip through XLA's epilogue
    assert result["estimated_cycles"] < grafted["estimated_cycles"], (result, grafted)


def test_the_matmul_seed_grafted_on_x_at_w_passes_the_judge(tmp_path):
    """``max(x @ w, b)`` in bf16: the kernel's product, rounded to the inputs' dtype as XLA's is,
    passes against the workload as written, with XLA's own error (a max commutes with rounding; an
    add does not: on ``x @ w + b`` XLA adds in f32 before rounding, and the unfused start fails
    some secret draws until ``fuse_epilogue`` moves the add into the kernel)."""
    (tmp_path / "R.py").write_text(GELU_REF.split("def workload")[0] +
                                   "def workload(x, w, b):\n    return jnp.maximum(x @ w, b)\n")
    r = evolve("eval", "--reference", "R.py", "--start", "matmul", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["status"] == "PASS", result["error"]
    assert result["max_abs_error"] <= result["reference_max_abs_error"] * 1.01
    assert "x @ w -> matmul(...)" in result["start"]["label"] and "rounded" not in result["start"]["label"]


def test_a_seed_that_cannot_be_grafted_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "R.py").write_text(GELU_REF.replace(
        "jnp.dot(x, w, preferred_element_type=jnp.float32)", "jnp.einsum('mk,nk->mn', x, w)"))
    r = evolve("eval", "--reference", "R.py", "--start", "matmul", cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be grafted" in lines[0] and "nothing in R.py's workload" in lines[0], lines
