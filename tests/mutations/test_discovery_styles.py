"""Discovery on the styles kernels are written in beyond the ones tests/mutations/test_discovery.py
covers (issue 57): a block tuple bound to a name, blocks tiling a reshaped or transposed input,
blocks the wrapper computes (``min``, a ``while`` loop that recomputes them), blocks in the methods
of a model class; names taken from the code and kept across edits; and what is left out, said."""

from __future__ import annotations

import dataclasses
import textwrap

import libcst as cst
import pytest

from mutations import Edit, get_operator, replay, unfollowed
from mutations._base import parse
from mutations.tuning.discovery import discover, legal_tiles
from mutations.tuning.evaluate import Scope, inputs
from mutations.tuning.names import tables

OP = get_operator("block_sizes")


@dataclasses.dataclass(frozen=True)
class Task:
    """A task as the operators see it: an entry, its inputs' and output's shapes and dtypes."""

    entry: str
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    output: tuple[tuple[int, ...], str]
    input_names: tuple[str, ...] = ()
    key: str = "test/styles"

    def input_specs(self):
        return list(self.inputs)

    @property
    def output_shape(self):
        return self.output[0]

    @property
    def output_dtype(self):
        return self.output[1]

    def legal_values(self, name):
        return None


HEADER = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _mm_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)
"""

ADD = Task("add", (((512, 1024), "float32"), ((512, 1024), "float32")), ((512, 1024), "float32"))
ROWS_512 = [d for d in range(8, 513, 8) if 512 % d == 0]          # f32 rows of 512: 8 sublanes
LANES_1024 = [128, 256, 512, 1024]


def source(body: str) -> str:
    return HEADER + textwrap.dedent(body)


def found(text: str, task) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {t.name: (t.value, t.legal) for t in discover(parse(text), task).values()}


def moved(text: str, task, values: dict[str, int]) -> str:
    """``text`` with block_sizes setting ``values`` (one edit, the whole shape); the result parses
    and discovery reads the new values back under the same names."""
    result = OP.apply_params(text, task, {"shape": values})
    assert result.applied, result.reason
    cst.parse_module(result.source)
    again = found(result.source, task)
    assert {n: again[n][0] for n in values} == values, again
    return result.source


def block_at(text: str, task, fn: str, var: str) -> object:
    """What ``var`` holds in ``fn`` at the task's shapes, loops and all (the evaluator's reading)."""
    t = tables(parse(text))
    known = inputs(t, task.entry, tuple(task.inputs), task.input_names)
    return Scope(t, fn, known.get(fn, {})).value(cst.Name(var))


# ---- 1. a block tuple bound to a name ------------------------------------------------------------
ADD_CALL = """pl.pallas_call(
        _add_kernel, grid=(m // {b}[0], n // {b}[1]),
        in_specs=[pl.BlockSpec({b}, lambda i, j: (i, j)), pl.BlockSpec({b}, lambda i, j: (i, j))],
        out_specs=pl.BlockSpec({b}, lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)"""

NAMED_TUPLES = {
    "local": ("""
        def add(x, y):
            block = (128, 256)
            m, n = x.shape
            return """ + ADD_CALL.format(b="block"), "block[0]", "block[1]"),
    "module-level": ("""
        BLOCK = (128, 256)

        def add(x, y):
            m, n = x.shape
            return """ + ADD_CALL.format(b="BLOCK"), "BLOCK[0]", "BLOCK[1]"),
    "a tuple of names": ("""
        def add(x, y):
            bm, bn = 128, 256
            block_shape = (bm, bn)
            m, n = x.shape
            return """ + ADD_CALL.format(b="block_shape"), "bm", "bn"),
}


@pytest.mark.parametrize("style", sorted(NAMED_TUPLES))
def test_a_block_tuple_bound_to_a_name(style):
    body, rows, cols = NAMED_TUPLES[style]
    text = source(body)
    assert found(text, ADD) == {rows: (128, tuple(ROWS_512)), cols: (256, tuple(LANES_1024))}
    assert OP.check(text, ADD), OP.check(text, ADD).reason
    after = moved(text, ADD, {rows: 64, cols: 512})
    assert "128" not in after.split("def add")[1] and "256" not in after.split("def add")[1]


# ---- 2. blocks tiling a reshaped or transposed input ------------------------------------------------
RESHAPED = """
def bmm(a, w):
    n, m, k = a.shape
    a2 = a.reshape(n * m, k)          # (N*M, K): the rows block_m tiles
    wt = w.T                          # (K, L): the columns block_n tiles
    l = wt.shape[1]
    block_m = 128
    block_n = 256
    out = pl.pallas_call(
        _mm_kernel, grid=(n * m // block_m, l // block_n),
        in_specs=[pl.BlockSpec((block_m, k), lambda i, j: (i, 0)), pl.BlockSpec((k, block_n), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n * m, l), a.dtype))(a2, wt)
    return out.reshape(n, m, l)
"""
BMM = Task("bmm", (((4, 96, 128), "float32"), ((512, 128), "float32")), ((4, 96, 512), "float32"))


@pytest.mark.parametrize("reshape", ["a.reshape(n * m, k)", "a.reshape(-1, k)", "jnp.reshape(a, (n * m, k))"])
@pytest.mark.parametrize("transpose", ["w.T", "jnp.transpose(w)", "jnp.transpose(w, (1, 0))", "w.transpose(1, 0)"])
def test_blocks_tiling_a_reshaped_or_transposed_input(reshape, transpose):
    text = source(RESHAPED.replace("a.reshape(n * m, k)", reshape).replace("w.T ", transpose + " "))
    got = found(text, BMM)
    # rows of the reshaped (384, 128), not of the input's 96; lanes of the transposed (128, 512)
    assert got["block_m"] == (128, tuple(d for d in legal_tiles(384, 2, "float32")))
    assert 384 in got["block_m"][1] and 192 in got["block_m"][1]
    assert got["block_n"] == (256, (128, 256, 512))
    moved(text, BMM, {"block_m": 384, "block_n": 512})
    assert any("`k` is `a.shape[2]`, a whole dimension of `a`, not tuned" in s for s in unfollowed(text, BMM))


# ---- 3. blocks the wrapper computes ----------------------------------------------------------------
MM_RETURN = """
    return pl.pallas_call(
        _mm_kernel, grid=(m // bm, n // 256),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 256), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, 256), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
"""


def _matmul(prelude: str) -> str:
    """A matmul whose wrapper sets ``bm`` with ``prelude`` (its columns: a literal 256)."""
    body = textwrap.indent(textwrap.dedent(prelude).strip("\n"), "    ")
    return HEADER + "\ndef matmul(x, w):\n    m, k = x.shape\n    n = w.shape[1]\n" + body + MM_RETURN


def mm_task(m: int, k: int = 512, n: int = 1024) -> Task:
    return Task("matmul", (((m, k), "float32"), ((k, n), "float32")), ((m, n), "float32"))


def test_a_block_capped_by_min_is_named_for_its_variable_and_keeps_the_name():
    text = _matmul("bm = min(x.shape[0], 256)")
    task = mm_task(512)
    got = found(text, task)
    assert got["bm"] == (256, tuple(ROWS_512)) and got["matmul.block[1]"] == (256, tuple(LANES_1024))
    after = moved(text, task, {"bm": 128})
    assert "min(x.shape[0], 128)" in after
    assert set(found(after, task)) == set(got)        # the same names after the edit
    # two edits in a row, by name: what replay of an archived history does
    twice = replay(text, [Edit("block_sizes", {"tunable": "bm", "value": 64}),
                          Edit("block_sizes", {"tunable": "bm", "value": 32}),
                          Edit("block_sizes", {"tunable": "matmul.block[1]", "value": 512})], task)
    assert twice.applied, twice.reason
    assert "min(x.shape[0], 32)" in twice.source and "grid=(m // bm, n // 512)" in twice.source


def test_a_block_a_while_loop_recomputes_takes_only_values_the_loop_leaves():
    # shrink until the block fits a budget: with k = 512, bm * k <= 65536 leaves bm <= 128
    text = _matmul("""
        bm = 512
        while bm * k > 64 * 1024:
            bm //= 2
    """)
    task = mm_task(1024)
    got = found(text, task)
    assert got["bm"] == (512, (8, 16, 32, 64, 128))
    assert block_at(text, task, "matmul", "bm") == 128         # what runs as written: the loop's
    after = moved(text, task, {"bm": 64})
    assert "bm = 64" in after and "while bm * k > 64 * 1024" in after       # the loop stays
    assert block_at(after, task, "matmul", "bm") == 64          # and leaves the edit alone


def test_a_block_rounded_down_to_a_divisor_moves_through_the_divisors():
    text = _matmul("""
        bm = 512
        while m % bm: bm //= 2
    """)
    task = mm_task(768)
    got = found(text, task)
    assert got["bm"][1] == tuple(legal_tiles(768, 2, "float32"))        # every tile divides 768
    assert block_at(text, task, "matmul", "bm") == 256
    after = moved(text, task, {"bm": 384})
    assert block_at(after, task, "matmul", "bm") == 384


def test_a_block_an_if_caps_takes_values_under_the_cap():
    text = _matmul("""
        bm = 256
        if bm > m // 2:
            bm = m // 2
    """)
    assert found(text, mm_task(256))["bm"] == (256, (8, 16, 32, 64, 128))


def test_a_block_chosen_by_branches_on_the_shape_is_the_branch_this_shape_takes():
    text = _matmul("""
        if m >= 1024:
            bm = 512
        elif m >= 256:
            bm = 128
        else:
            bm = m
    """)
    assert found(text, mm_task(768))["bm"] == (128, tuple(legal_tiles(768, 2, "float32")))
    after = moved(text, mm_task(768), {"bm": 384})
    assert "bm = 512" in after and "bm = 384" in after          # the branch taken at 768, alone
    assert found(text, mm_task(2048))["bm"][0] == 512
    assert "bm" not in found(text, mm_task(64))
    assert any("`bm` is `x.shape[0]`, a whole dimension of `x`, not tuned" in s for s in unfollowed(text, mm_task(64)))


def test_a_loop_discovery_cannot_evaluate_is_said():
    text = source("""
        def _fits(b):
            return b <= 128

        def matmul(x, w):
            m, k = x.shape
            n = w.shape[1]
            bm = 512
            while not _fits(bm):
                bm //= 2
            return pl.pallas_call(
                _mm_kernel, grid=(m // bm, n // 256),
                in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 256), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((bm, 256), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
    """)
    task = mm_task(1024)
    assert "bm" not in found(text, task)
    line = text.splitlines().index("    while not _fits(bm):") + 1
    spec_line = next(i for i, s in enumerate(text.splitlines(), 1) if "in_specs=[pl.BlockSpec((bm, k)" in s)
    said = unfollowed(text, task)
    assert (f"block of `pl.BlockSpec((bm, k), ...)` in matmul() line {spec_line} (and 1 more BlockSpec there, "
            f"line {spec_line + 1}): `bm` is recomputed by the `while` loop at line {line}, whose test "
            "`not _fits(bm)` discovery cannot evaluate at this shape") in said, said


def test_a_block_picked_by_a_helper_and_a_conditional_expression():
    """``bm = _pick(m)`` (a helper returning once, called once: followed into, its loop and all) and
    ``bn = n if n <= 256 else 256`` (the branch this shape takes)."""
    text = source("""
        def _pick(m):
            b = 512
            while m % b:
                b //= 2
            return b

        def matmul(x, w):
            m, k = x.shape
            n = w.shape[1]
            bm = _pick(m)
            bn = n if n <= 256 else 256
            return pl.pallas_call(
                _mm_kernel, grid=(m // bm, n // bn),
                in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
    """)
    task = mm_task(768)
    got = found(text, task)
    assert got == {"b": (512, tuple(legal_tiles(768, 2, "float32"))), "bn": (256, tuple(LANES_1024))}
    after = moved(text, task, {"b": 384, "bn": 512})
    assert "b = 384" in after and "else 512" in after and block_at(after, task, "_pick", "b") == 384
    # at a shape that takes the other branch, bn is the whole dimension: said, not tuned
    assert "bn" not in found(text, mm_task(768, n=128))
    assert any("`bn` is `w.shape[1]`, a whole dimension of `w`, not tuned" in s
               for s in unfollowed(text, mm_task(768, n=128)))


# ---- 4. blocks in the methods of a model class -------------------------------------------------------
MODEL_CALL = """pl.pallas_call(
            _mm_kernel, grid=(m // {bm}, n // {bn}),
            in_specs=[pl.BlockSpec(({bm}, k), lambda i, j: (i, 0)), pl.BlockSpec((k, {bn}), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, {w})"""

MODELS = {
    "inline in forward": ("""
        class Model:
            def __init__(self, in_features, out_features):
                self.weight = jnp.zeros((in_features, out_features), jnp.float32)

            def forward(self, x):
                m, k = x.shape
                n = self.weight.shape[1]
                block_0 = 128
                block_1 = 512
                return """ + MODEL_CALL.format(bm="block_0", bn="block_1", w="self.weight"), "block_0", "block_1"),
    "attributes set in __init__": ("""
        class ModelNew:
            def __init__(self, in_features, out_features, block_m=128):
                self.weight = jnp.zeros((in_features, out_features), jnp.float32)
                self.block_m = block_m
                self.block_n = 512

            def forward(self, x):
                m, k = x.shape
                n = self.weight.shape[1]
                return """ + MODEL_CALL.format(bm="self.block_m", bn="self.block_n", w="self.weight"),
                                   "block_m", "self.block_n"),
    "a module-level wrapper forward calls": ("""
        def linear(x, w, block_m=128, block_n=512):
            m, k = x.shape
            n = w.shape[1]
            return """ + MODEL_CALL.format(bm="block_m", bn="block_n", w="w").replace("\n    ", "\n") + """

        class Model:
            def __init__(self, in_features, out_features):
                self.weight = jnp.zeros((in_features, out_features), jnp.float32)

            def forward(self, x):
                return linear(x, self.weight)
    """, "block_m", "block_n"),
}


@pytest.mark.parametrize("style", sorted(MODELS))
def test_blocks_in_the_methods_of_a_model_class(style):
    body, rows, cols = MODELS[style]
    text = source(body)
    cls = "ModelNew" if "class ModelNew" in text else "Model"
    task = Task(f"{cls}.forward", (((256, 384), "float32"), ((384, 1024), "float32")), ((256, 1024), "float32"),
                input_names=("x", "weight"))
    rows_256 = tuple(d for d in range(8, 257, 8) if 256 % d == 0)
    assert found(text, task) == {rows: (128, rows_256), cols: (512, tuple(LANES_1024))}
    # the entry given on its own, as a dotted method name
    plain = dataclasses.replace(task, entry="elsewhere")
    assert {t.name for t in discover(parse(text), plain, entry=f"{cls}.forward").values()} == {rows, cols}
    assert OP.check(text, task), OP.check(text, task).reason
    moved(text, task, {rows: 64, cols: 256})
    said = unfollowed(text, entry=f"{cls}.forward")
    assert any("`k` is `x.shape[1]`, a whole dimension of `x`, not tuned" in s for s in said), said


# ---- 5. what is left out, said ---------------------------------------------------------------------
def test_blocks_left_out_are_named_with_their_blockspec_and_why():
    text = source("""
        def _pick(m):
            for b in (512, 256, 128):
                if m % b == 0:
                    return b
            return m

        def matmul(x, w, bn):
            m, k = x.shape
            n = w.shape[1]
            bm = _pick(m)
            return pl.pallas_call(
                _mm_kernel, grid=(m // bm, n // bn),
                in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
    """)
    task = mm_task(512)
    assert found(text, task) == {}
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "in_specs=[pl.BlockSpec((bm, k)" in s)
    said = unfollowed(text, task)
    assert said == (
        f"block of `pl.BlockSpec((bm, k), ...)` in matmul() line {line} (and 1 more BlockSpec there, line {line + 1}): "
        "`bm` is `_pick(m)`, a call discovery does not follow",
        f"block of `pl.BlockSpec((bm, k), ...)` in matmul() line {line} (and 1 more BlockSpec there, line {line}): "
        "`k` is `x.shape[1]`, a whole dimension of `x`, not tuned",
        f"block of `pl.BlockSpec((k, bn), ...)` in matmul() line {line} (and 1 more BlockSpec there, line {line + 1}): "
        "`bn` is a parameter of matmul() with no default, which no call in the module sets",
    ), said
    assert unfollowed(text, entry="matmul") == said          # no task: the same, the shapes aside
    check = OP.check(text, task)
    assert not check and check.reason.startswith("no block size to move: block of `pl.BlockSpec((bm, k), ...)`")
    assert "`bm` is `_pick(m)`, a call discovery does not follow" in check.reason
    assert unfollowed("def broken(:\n") == ()


def test_literals_in_the_blockspec_are_named_by_their_place_whatever_their_value():
    text = source("""
        def matmul(x, w):
            m, k = x.shape
            n = w.shape[1]
            return pl.pallas_call(
                _mm_kernel, grid=(m // 128, n // 256),
                in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 256), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((128, 256), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
    """)
    task = mm_task(512)
    assert set(found(text, task)) == {"matmul.block[0]", "matmul.block[1]"}
    after = moved(text, task, {"matmul.block[0]": 256, "matmul.block[1]": 512})
    assert "grid=(m // 256, n // 512)" in after
    assert set(found(after, task)) == {"matmul.block[0]", "matmul.block[1]"}
    # an archived edit under the name the literal went by before (its value in it) still replays
    old = replay(text, [Edit("block_sizes", {"tunable": "matmul.block-2=128", "value": 64})], task)
    assert old.applied and "grid=(m // 64, n // 256)" in old.source, old.reason
