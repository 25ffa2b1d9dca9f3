"""Tunables found, not declared (mutations/tuning/discovery.py): the integers that flow into a
BlockSpec's block shape, in each style a kernel may hold them, with legal values from the arrays
they tile; and block_sizes moving them."""

from __future__ import annotations

import dataclasses
import random
import textwrap

import pytest

from mutations import get_operator
from mutations._base import parse
from mutations.tuning.discovery import discover, legal_tiles, sublanes


@dataclasses.dataclass(frozen=True)
class Matmul:
    """A task as the operators see it: an entry, input and output shapes (no legal values declared)."""

    entry: str = "matmul"
    m: int = 512
    k: int = 1024
    n: int = 768
    dtype: str = "bfloat16"
    key: str = "test/matmul"

    def input_specs(self):
        return [((self.m, self.k), self.dtype), ((self.k, self.n), self.dtype)]

    @property
    def output_shape(self):
        return (self.m, self.n)

    @property
    def output_dtype(self):
        return self.dtype

    def legal_values(self, name):
        return None


HEADER = """
import dataclasses
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)
"""


def call(bm: str, bk: str, bn: str, grid: str = "(m // {bm}, n // {bn})") -> str:
    return f"""pl.pallas_call(
        _kernel, grid={grid.format(bm=bm, bn=bn)},
        in_specs=[pl.BlockSpec(({bm}, k), lambda i, j: (i, 0)), pl.BlockSpec((k, {bn}), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)"""


STYLES = {
    "keyword defaults, through a wrapper": f"""
def _mm(x, w, *, block_m=128, block_n=256):
    m, k = x.shape
    n = w.shape[1]
    return {call("block_m", "k", "block_n")}

def matmul(x, w):
    return _mm(x, w)
""",
    "a tuple default, unpacked": f"""
def matmul(x, w, block_shape=(128, 256)):
    l, r = block_shape
    m, k = x.shape
    n = w.shape[1]
    return {call("l", "k", "r")}
""",
    "module constants of any name": f"""
TM = 128
TN = 256

def matmul(x, w):
    m, k = x.shape
    n = w.shape[1]
    return {call("TM", "k", "TN")}
""",
    "functools.partial arguments": f"""
def _mm(x, w, bm, bn):
    m, k = x.shape
    n = w.shape[1]
    return {call("bm", "k", "bn")}

_tiled = functools.partial(_mm, bm=128, bn=256)

def matmul(x, w):
    return _tiled(x, w)
""",
    "an entry's keyword defaults handed on to a helper by name": f"""
def _mm(x, w, bm, bn):
    m, k = x.shape
    n = w.shape[1]
    return {call("bm", "k", "bn")}

def matmul(x, w, block_m=128, *, block_n=256):
    return _mm(x, w, block_m, bn=block_n)
""",
    # the helper's own defaults are never used (the entry always passes its own): moved together
    "a helper's defaults overridden by the entry's": f"""
def _mm(x, w, bm=128, bn=256):
    m, k = x.shape
    n = w.shape[1]
    return {call("bm", "k", "bn")}

def matmul(x, w, block_m=128, block_n=256):
    return _mm(x, w, bm=block_m, bn=block_n)
""",
    "dataclass fields": f"""
@dataclasses.dataclass(frozen=True)
class Tiles:
    bm: int = 128
    bn: int = 256

def matmul(x, w, tiles=Tiles()):
    m, k = x.shape
    n = w.shape[1]
    return {call("tiles.bm", "k", "tiles.bn")}
""",
    # megablox.gmm's style: a tiling that may be a lookup (rebound from itself when it is), specs
    # bound to names, and the pallas_call named before it is applied.
    "specs and the call bound to names, a parameter rebound from itself": """
def matmul(x, w, tiling=(128, 256)):
    if callable(tiling):
        tiling = tiling(x.shape[0], w.shape[1])
    tm, tn = tiling
    m, k = x.shape
    n = w.shape[1]
    x_spec = pl.BlockSpec((tm, k), lambda i, j: (i, 0))
    w_spec = pl.BlockSpec((k, tn), lambda i, j: (0, j))
    out_spec = pl.BlockSpec((tm, tn), lambda i, j: (i, j))
    call = pl.pallas_call(_kernel, grid=(m // tm, n // tn), in_specs=[x_spec, w_spec], out_specs=out_spec,
                          out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))
    return call(x, w)
""",
    "literals in the BlockSpec": f"""
def matmul(x, w):
    m, k = x.shape
    n = w.shape[1]
    return {call("128", "k", "256")}
""",
}


@pytest.mark.parametrize("style", list(STYLES))
def test_each_style_is_found_and_moved(style):
    source = HEADER + textwrap.dedent(STYLES[style])
    task = Matmul()
    found = discover(parse(source), task)
    assert sorted(t.value for t in found.values()) == [128, 256], found
    rows = next(t for t in found.values() if t.value == 128)      # tiles M (second-to-last, bf16)
    cols = next(t for t in found.values() if t.value == 256)      # tiles N (last)
    assert list(rows.legal) == [d for d in range(16, 513) if 512 % d == 0 and d % 16 == 0]
    assert list(cols.legal) == [128, 256, 384, 768]
    op = get_operator("block_sizes")
    assert op.check(source, task), op.check(source, task).reason
    result = op.apply_params(source, task, {"shape": {rows.name: 64, cols.name: 384}})
    assert result.applied, result.reason
    moved = discover(parse(result.source), task)
    assert {t.value for t in moved.values()} == {64, 384}
    assert "128" not in result.source.split("def matmul")[-1].split("_kernel")[0] or style == "dataclass fields"
    drawn = op.apply(source, task, random.Random(0))
    assert drawn.applied and drawn.source != source


def test_a_literal_takes_the_same_number_in_the_grid_with_it():
    source = HEADER + textwrap.dedent(STYLES["literals in the BlockSpec"]).replace("m // 128", "m // 128")
    source = source.replace("grid=(m // 128, n // 256)", "grid=(512 // 128, n // 256)")
    task = Matmul()
    (rows,) = [t for t in discover(parse(source), task).values() if t.value == 128]
    assert len(rows.literals) == 3            # in_specs, out_specs and the grid
    moved = get_operator("block_sizes").apply_params(source, task, {"shape": {rows.name: 256}})
    assert "grid=(512 // 256," in moved.source


def test_a_declared_space_wins_over_discovery():
    source = HEADER + 'TUNE = {"block_m": [64, 128], "block_n": [256, 768]}\n' + \
        textwrap.dedent(STYLES["keyword defaults, through a wrapper"])
    found = discover(parse(source), Matmul())
    assert found["block_m"].legal == (64, 128) and found["block_m"].declared
    assert found["block_n"].legal == (256, 768)


def test_a_declared_constant_that_no_block_shape_reads_is_a_tunable_that_block_sizes_moves():
    # Mamba-2's CHUNK: the tokens a kernel walks inside its block, named in TUNE
    source = HEADER + 'CHUNK = 256\nTUNE = {"CHUNK": [128, 256, 512], "ABSENT": [1, 2]}\n' + \
        textwrap.dedent(STYLES["keyword defaults, through a wrapper"])
    found = discover(parse(source), Matmul())
    assert found["CHUNK"].legal == (128, 256, 512) and found["CHUNK"].declared and found["CHUNK"].value == 256
    assert "ABSENT" not in found and "block_m" in found        # a name with no constant is not one
    moved = get_operator("block_sizes").apply_params(source, Matmul(), {"shape": {"CHUNK": 512}})
    assert moved.status == "applied" and "CHUNK = 512\n" in moved.source


def test_no_tunable_where_nothing_flows_into_a_block_shape():
    source = HEADER + textwrap.dedent(f"""
    def matmul(x, w):
        m, k = x.shape
        n = w.shape[1]
        return {call("m", "k", "n", grid="(1, 1)")}
    """)
    assert discover(parse(source), Matmul()) == {}
    check = get_operator("block_sizes").check(source, Matmul())
    assert not check and "BlockSpec" in check.reason


def test_mosaic_tiling_rules():
    assert sublanes("float32") == 8 and sublanes("bfloat16") == 16 and sublanes("int8") == 32
    assert legal_tiles(1024, 1, "float32") == [128, 256, 512, 1024]
    assert legal_tiles(100, 1, "float32") == [100]                  # only the whole dimension
    assert legal_tiles(64, 2, "bfloat16") == [16, 32, 64]
    assert legal_tiles(6, 3, "float32") == [1, 2, 3, 6]


def test_a_block_parameter_with_no_default_is_given_one_legal_for_the_task():
    from mutations.tuning.defaults import required_defaults

    source = HEADER + textwrap.dedent("""
        def _kernel(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...])

        def matmul(x, y, *, block_shape, block_k=256, interpret=False):
            bm, bn = block_shape
            return pl.pallas_call(
                _kernel,
                grid=(x.shape[0] // bm, y.shape[1] // bn),
                in_specs=[pl.BlockSpec((bm, x.shape[1]), lambda i, j: (i, 0)),
                          pl.BlockSpec((y.shape[0], bn), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype),
                interpret=interpret,
            )(x, y)
    """)
    task = Matmul(m=64, n=768)
    module, given = required_defaults(parse(source), task)
    # Each element the legal value nearest 256: rows of 64 allow at most 64; 768 lanes allow 256.
    assert given == {"block_shape": (64, 256)}
    assert "block_shape=(64, 256)" in module.code and "interpret=False" in module.code
    found = discover(module, task)
    assert {t.name: t.value for t in found.values()} == {"block_shape[0]": 64, "block_shape[1]": 256}
    # Nothing missing: the module unchanged. A keyword-only parameter no block shape reads keeps none.
    again, none = required_defaults(module, task)
    assert none == {} and again.code == module.code
    plain = source.replace("interpret=False", "interpret")
    assert "interpret=" not in required_defaults(parse(plain), task)[0].code.split("def matmul")[1].split(":")[0]


def test_jax_s_matmul_starts_with_a_block_shape_it_leaves_to_its_caller():
    """JAX's installed matmul (read at test time) takes ``block_shape`` with no default: a run
    from it gives it one, says so in the start's label, and keeps the source's sha256."""
    from evolve.config import TaskConfig
    from evolve.start.resolve import resolve_start

    config = TaskConfig(seed="matmul", shape="M=128,K=256,N=512")
    read = resolve_start("jax.experimental.pallas.ops.tpu.matmul", config.load_seed())
    start = read.for_task(config.task())
    assert dict(start.defaults) == {"block_shape": (128, 256)}
    assert "block_shape=(128, 256)" in start.source and "block_shape=" not in read.source.split("def matmul")[1][:200]
    assert start.sha256 == read.sha256 and "with block_shape=(128, 256) (no default in the source)" in start.label
    assert start.record()["defaults"] == {"block_shape": (128, 256)}
    names = {t.name for t in discover(parse(start.source), config.task()).values()}
    assert {"block_shape[0]", "block_shape[1]", "block_k"} <= names
