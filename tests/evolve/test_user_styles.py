"""Three kernels written as users write them, each with its reference file and no other file:
blocks as keyword defaults of the wrapper, blocks passed through ``functools.partial``, and a
declared search space (``TUNE``). Each is judged, and a run moves its blocks through discovery
alone and breeds kernels that pass."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A row-scaled add: out = x * s + y (bf16), s one scale per row.
SCALED_ADD_REF = '''
import jax, jax.numpy as jnp

def create_inputs(M=256, N=512):
    kx, ky, ks = jax.random.split(jax.random.key(1), 3)
    return (jax.random.normal(kx, (M, N), jnp.bfloat16), jax.random.normal(ky, (M, N), jnp.bfloat16),
            jax.random.normal(ks, (M, 1), jnp.float32))

def workload(x, y, s):
    return (x.astype(jnp.float32) * s + y.astype(jnp.float32)).astype(x.dtype)
'''

KEYWORD_BLOCKS = '''
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

def _kernel(x_ref, y_ref, s_ref, o_ref):
    o_ref[...] = (x_ref[...].astype(jnp.float32) * s_ref[...] + y_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

def scaled_add(x, y, s, *, block_shape=(16, 128)):
    bm, bn = block_shape
    m, n = x.shape
    return pl.pallas_call(
        _kernel, grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j)), pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                  pl.BlockSpec((bm, 1), lambda i, j: (i, 0))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y, s)
'''

# A row sum over the last axis, f32: out[i] = sum_j x[i, j].
ROWSUM_REF = '''
import jax, jax.numpy as jnp

def create_inputs(M=256, N=1024):
    return (jax.random.normal(jax.random.key(2), (M, N), jnp.float32),)

def workload(x):
    return jnp.sum(x, axis=1, keepdims=True)
'''

PARTIAL_BLOCKS = '''
import functools
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

def _kernel(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.sum(x_ref[...], axis=1, keepdims=True)

def _rowsum(x, rows, cols):
    m, n = x.shape
    return pl.pallas_call(
        _kernel, grid=(m // rows, n // cols),
        in_specs=[pl.BlockSpec((rows, cols), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((rows, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype))(x)

def rowsum(x):
    small_tiles = functools.partial(_rowsum, rows=8, cols=128)
    return small_tiles(x)
'''

# A tiled matmul with its space declared, as Kernel Tuner users do.
MATMUL_REF = '''
import jax, jax.numpy as jnp

def create_inputs(M=256, K=256, N=256):
    ka, kb = jax.random.split(jax.random.key(3))
    return (jax.random.normal(ka, (M, K), jnp.bfloat16),
            (jax.random.normal(kb, (K, N), jnp.float32) / 16).astype(jnp.bfloat16))

def workload(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
'''

TUNE_DICT = '''
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl

TUNE = {"TM": [64, 128, 256], "TN": [128, 256]}
TM = 64
TN = 128

def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

def matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _kernel, grid=(m // TM, n // TN),
        in_specs=[pl.BlockSpec((TM, k), lambda i, j: (i, 0)), pl.BlockSpec((k, TN), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((TM, TN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype))(a, b)
'''

STYLES = {
    "keyword_blocks": (SCALED_ADD_REF, KEYWORD_BLOCKS, "block_shape"),
    "functools_partial": (ROWSUM_REF, PARTIAL_BLOCKS, "rows"),
    "tune_dict": (MATMUL_REF, TUNE_DICT, "TM"),
}


def evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def _moved(edits: str | None) -> set[str]:
    """The tunables a kernel's block edits set (one value, or a whole shape: ``block_shape[0]``)."""
    names = set()
    for edit in json.loads(edits or "[]"):
        if edit["op"] == "block_sizes":
            params = edit["params"]
            names |= {params["tunable"]} if "tunable" in params else set()
            names |= {key.split("[")[0] for key in params.get("shape", {})}
    return names


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_users_kernel_is_judged_and_evolved_from_its_reference_file_alone(tmp_path, style):
    import pyarrow.parquet as pq

    reference, kernel, tunable = STYLES[style]
    (tmp_path / "reference.py").write_text(reference)
    (tmp_path / "kernel.py").write_text(kernel)
    r = evolve("eval", "kernel.py", "--reference", "reference.py", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["status"] == "PASS", json.loads(r.stdout)["error"]
    r = evolve("run", "--reference", "reference.py", "--start", "kernel.py", "--population", "3",
               "--generations", "1", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [row for f in (tmp_path / "data").rglob("*.parquet") for row in pq.read_table(f).to_pylist()]
    moved = [row for row in rows if row["status"] == "PASS" and tunable in _moved(row["edits"])]
    assert moved, [(row["edits"], row["status"], row["error"]) for row in rows]
    if style == "functools_partial":
        # promoted under the reference file's name, its docstring naming the tunables it found and
        # the command that checks it at other shapes (the reference file, not a seed)
        run_id = re.search(r"evolve promote (\S+)", r.stdout).group(1)
        r = evolve("promote", run_id, "--to", "champion.py", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"registered as models:/{tmp_path.name}_v5e@champion" in r.stdout, r.stdout
        text = (tmp_path / "champion.py").read_text()
        assert f"--reference {tmp_path / 'reference.py'} --entry" in text and "--seed reference" not in text
        assert "tunables: none" not in text and "rows=" in text, text[:3000]
