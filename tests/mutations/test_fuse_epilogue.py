"""fuse_epilogue: the entry's elementwise work on a kernel's output moves into the kernel's store.

On the user's matmul with its bias and gelu left to XLA (examples/reference_matmul), the fused
kernel passes the judge at a small shape with the XLA program's own error (rounded once, as XLA
rounds), and the block moves still find its blocks. Where the operator cannot prove the move, it
says which rule failed."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from evaluator.judge import Judge
from mutations import get_operator
from mutations._base import parse
from mutations.tuning.discovery import discover
from seeds import load_seed
from seeds.reference import Task

ROOT = Path(__file__).resolve().parents[2]
OP = get_operator("fuse_epilogue")


@pytest.fixture(scope="module")
def seed():
    return load_seed(str(ROOT / "examples" / "reference_matmul"))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The example's task at 256 x 256 x 256 (its file is the 4096 cube)."""
    text = (ROOT / "examples" / "reference_matmul" / "reference.py").read_text()
    assert "M, K, N = 4096, 4096, 4096" in text
    path = tmp_path_factory.mktemp("ref") / "reference.py"
    path.write_text(text.replace("M, K, N = 4096, 4096, 4096", "M, K, N = 256, 256, 256"))
    return Task.read(path, entry="matmul_bias_gelu")


@pytest.fixture(scope="module")
def fused(seed, small):
    result = OP.apply(seed.kernel_source, small, random.Random(0))
    assert result.applied, result.reason
    return result.source


def test_the_epilogue_moves_into_the_store(fused):
    entry = fused.split("def matmul_bias_gelu")[1]
    assert "gelu" not in entry and "return matmul(x, w, epilogue_b=b)" in entry
    kernel = fused.split("def _matmul_kernel")[1].split("\ndef ")[0]
    assert "epilogue_b_ref, o_ref, acc_ref, *, epilogue, pre_dtype" in kernel
    # rounded once, after the epilogue: the accumulator goes in as it is
    assert "o_ref[...] = epilogue(acc_ref[...], epilogue_b_ref[...]).astype(o_ref.dtype)" in kernel
    assert OP.check(fused, None).ok is False


def test_the_fused_kernel_passes_the_judge_with_xla_s_own_error(fused, small):
    result = Judge().evaluate(fused, small)
    assert result.status.value == "PASS", result.error
    m = result.metrics
    assert m.max_abs_error <= 1.01 * m.reference_max_abs_error, (m.max_abs_error, m.reference_max_abs_error)


def test_the_block_moves_still_find_the_blocks(seed, small, fused):
    before = {t.name for t in discover(parse(seed.kernel_source), small).values()}
    after = {t.name for t in discover(parse(fused), small).values()}
    assert before and before == after
    moved = get_operator("block_sizes").apply(fused, small, random.Random(1))
    assert moved.applied, moved.reason


def _variant(seed, old: str, new: str) -> str:
    source = seed.kernel_source
    assert old in source
    return source.replace(old, new)


@pytest.mark.parametrize("old, new, why", [
    ("return jax.nn.gelu(y).astype(x.dtype)", "return jnp.cumsum(y, axis=1).astype(x.dtype)",
     "calls jnp.cumsum, not a known elementwise function"),
    ("return jax.nn.gelu(y).astype(x.dtype)", "return jax.nn.gelu(y[:, ::-1]).astype(x.dtype)",
     "indexes a value"),
    ("o_ref[...] = acc_ref[...].astype(o_ref.dtype)", "o_ref[...] = acc_ref[...].astype(o_ref.dtype)\n"
     "        o_ref[0:8, :] = o_ref[0:8, :] * 2", "reads, slices or hands on its output block"),
    ("def matmul_bias_gelu(x, w, b):\n", "def matmul_bias_gelu(x, w, b):\n    z = b * 2\n",
     None),                         # a name computed before the kernel that the epilogue does not read
    ("y = matmul(x, w).astype(jnp.float32) + b.astype(jnp.float32)",
     "z = b * 2\n    y = matmul(x, w).astype(jnp.float32) + z.astype(jnp.float32)",
     "reads z, computed in the entry before the kernel"),
    ("y = matmul(x, w).astype(jnp.float32) + b.astype(jnp.float32)\n    return jax.nn.gelu(y).astype(x.dtype)",
     "return matmul(x, w)", "nothing follows the kernel"),
    ("y = matmul(x, w).astype", "y = matmul(x, w) + matmul(x, w).astype", "called exactly once"),
])
def test_it_refuses_what_it_cannot_prove(seed, small, old, new, why):
    check = OP.check(_variant(seed, old, new), small)
    if why is None:
        assert check.ok, check.reason
    else:
        assert not check.ok and why in check.reason, check.reason


def test_an_entry_that_is_the_wrapper_has_no_epilogue_to_move():
    matmul = load_seed("matmul")
    check = OP.check(matmul.kernel_source, matmul.default_task())
    assert not check.ok and "no epilogue to move: the entry matmul() is the kernel's wrapper" in check.reason


def test_an_epilogue_that_reads_no_operand_fuses_and_passes(seed, tmp_path):
    """gelu(x @ w): an epilogue of the output alone (no bias) hands the spec helper an empty tuple
    of operands, written ``()`` (it was ``(,)``, not Python)."""
    text = (ROOT / "examples" / "reference_matmul" / "reference.py").read_text()
    text = text.replace("M, K, N = 4096, 4096, 4096", "M, K, N = 256, 256, 256")
    text = text.replace("    return x, w, b\n", "    return x, w\n")
    text = text.replace("def workload(x, w, b):", "def workload(x, w):")
    text = text.replace(" + b.astype(jnp.float32)", "")
    (tmp_path / "reference.py").write_text(text)
    task = Task.read(tmp_path / "reference.py", entry="matmul_gelu")
    source = _variant(seed, "def matmul_bias_gelu(x, w, b):\n    y = matmul(x, w).astype(jnp.float32) + b.astype("
                            "jnp.float32)", "def matmul_gelu(x, w):\n    y = matmul(x, w).astype(jnp.float32)")
    result = OP.apply(source, task, random.Random(0))
    assert result.applied, result.reason
    assert "_epilogue_operand_specs(_epilogue, _pre, _out_spec, ())" in result.source
    judged = Judge().evaluate(result.source, task)
    assert judged.status.value == "PASS", judged.error
