"""The static screen: what it refuses, naming the construct and its line, and what it lets through."""

from __future__ import annotations

import pytest

from evaluator.containment.screen import screen_source


def screen(source: str):
    """The screen for the flash-attention seed's interface."""
    return screen_source(source, entry="flash_attention", params=("q", "k", "v"), keywords=("causal", "sm_scale"))


OK_TAIL = "\n\ndef flash_attention(q, k, v, *, causal=True, sm_scale=1.0):\n    return q\n"


@pytest.mark.parametrize("snippet, named", [
    ("import os", "'os'"),
    ("import sys", "'sys'"),
    ("import subprocess", "'subprocess'"),
    ("import ctypes", "'ctypes'"),
    ("import builtins", "'builtins'"),
    ("from os import path", "'os'"),
    ("from jax import config", "'jax.config'"),
    ("x = open('/etc/passwd')", "open()"),
    ("exec('1')", "exec()"),
    ("eval('1')", "eval()"),
    ("m = __import__('os')", "__import__"),
    ("x = ().__class__", "__class__"),
    ("import jax.numpy as jnp\njnp.dot = None", "jnp.dot"),
    ("import numpy as np\nnp.save('x', 1)", ".save"),
    ("import jax\njax.config.update = None", "jax.config.update"),
    ("from . import x", "relative"),
    ("global g", "global"),
])
def test_forbidden_constructs_are_named_with_their_line(snippet, named):
    result = screen(snippet + OK_TAIL)
    assert not result.ok
    assert named in result.error
    assert result.error.startswith(f"line {snippet.count(chr(10)) + 1}:")


def test_the_seed_and_jax_kernels_pass(seed_source):
    assert screen(seed_source).ok
    src = ("from jax.experimental.pallas.ops.tpu import flash_attention as fa\n" + OK_TAIL)
    assert screen(src).ok
    # the one private module JAX's production kernels import (ragged paged attention: dtype sizes)
    assert screen("from jax._src import dtypes\nn = dtypes.itemsize_bits\n" + OK_TAIL).ok
    assert not screen("from jax._src import dtypes\nn = dtypes._x\n" + OK_TAIL).ok


@pytest.mark.parametrize("source, message", [
    ("def other(q, k, v): pass", "no top-level function 'flash_attention'"),
    ("def flash_attention(a, b, c, *, causal, sm_scale): pass", "must take (q, k, v)"),
    ("def flash_attention(q, k, v): pass", "causal, sm_scale"),
    ("def flash_attention(q, k, v:\n", "syntax error"),
])
def test_the_kernel_interface_is_checked(source, message):
    result = screen(source)
    assert not result.ok and message in result.error


@pytest.mark.parametrize("snippet, named", [
    ("_o = open", "'open'"),
    ("from typing import sys", "'sys'"),
    ("import jax._src.path", "private module 'jax._src.path'"),
    ("from jax._src import path", "private module 'jax._src'"),
    ("from jax._src import config", "private module 'jax._src'"),
    ("import jax._src.config", "private module 'jax._src.config'"),
    ("import numpy as np\nx = np._core", "private attribute '._core'"),
    ("import numpy as np\nnp.zeros(3).dump('/tmp/x')", ".dump"),
    ("import numpy as np\nnp.zeros(3).tofile('/tmp/x')", ".tofile"),
    ("import numpy as np\nnp.load('/etc/passwd')", ".load"),
    ("import jax\ncb = jax.pure_callback", ".pure_callback"),
    ("import jax\nb = jax.lax.platform_dependent", ".platform_dependent"),
])
def test_the_routes_an_outside_review_found_past_the_old_screen_are_named(snippet, named):
    result = screen(snippet + OK_TAIL)
    assert not result.ok
    assert named in result.error and "line" in result.error


def test_attribute_and_keyword_names_that_shadow_builtins_are_not_references():
    src = "import jax\n\ndef flash_attention(q, k, v, *, causal=True, sm_scale=1.0, compile=None):\n" \
          "    f = jax.jit(lambda x: x).lower(q).compile\n    return dict(open=q)['open']\n"
    assert screen(src).ok, screen(src).error


@pytest.mark.parametrize("params, named", [
    ('flags={"xla_tpu_enable_log_recorder": True}', "compiler parameter 'flags'"),
    ("disable_bounds_checks=True", "compiler parameter 'disable_bounds_checks'"),
    ("internal_scratch_in_bytes=4096", "compiler parameter 'internal_scratch_in_bytes'"),
    ('**{"flags": {}}', "CompilerParams(**...)"),
    ('("parallel",), None, None, 7', "CompilerParams takes only"),
])
def test_compiler_parameters_outside_the_allow_list_are_named(seed_source, params, named):
    old = "compiler_params=pltpu.CompilerParams("
    result = screen(seed_source.replace(old, f"{old}{params}, "))
    assert not result.ok and named in result.error, result.error


def test_the_allowed_compiler_parameters_pass(seed_source):
    old = "compiler_params=pltpu.CompilerParams("
    allowed = "vmem_limit_bytes=96 * 2**20, allow_input_fusion=[False, False, False], "
    assert screen(seed_source.replace(old, old + allowed)).ok
