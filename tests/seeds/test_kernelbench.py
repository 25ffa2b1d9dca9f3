"""KernelBench's convention, both ways (seeds/kernelbench.py): a task file as a reference file, a
kernel file whose ``Model.forward`` reaches ``pallas_call`` as a kernel, their weights handed over
as the task's model holds them; and the one-line refusals."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from seeds import kernelbench
from seeds.reference import ReferenceError, Task, kernel_entry

TASK = """
import jax
import jax.numpy as jnp


class Model:
    def __init__(self, in_features, out_features):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros((out_features,))

    def set_weights(self, weights):
        for name, value in weights.items():
            setattr(self, name.replace(".", "_"), jnp.asarray(value))

    def forward(self, x):
        return jax.nn.gelu(x @ self.weight + self.bias)


batch_size = 128
in_features = 256
out_features = 128
bias_shape = (out_features,)


def get_inputs():
    return [jax.random.uniform(jax.random.PRNGKey(0), (batch_size, in_features))]


def get_init_inputs():
    return [in_features, out_features]
"""

# A kernel in the same convention: the tiles in a wrapper the model's forward calls.
KERNEL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _linear_kernel(x_ref, w_ref, b_ref, o_ref):
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = jax.nn.gelu(acc + b_ref[...]).astype(o_ref.dtype)


def linear_gelu(x, w, b):
    bm, bn = 64, 128
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        _linear_kernel,
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, w, b)


class Model:
    def __init__(self, in_features, out_features):
        self.weight = jnp.zeros((in_features, out_features))
        self.bias = jnp.zeros((out_features,))

    def set_weights(self, weights):
        for name, value in weights.items():
            setattr(self, name.replace(".", "_"), jnp.asarray(value))

    def forward(self, x):
        return linear_gelu(x, self.weight, self.bias.reshape(1, -1))


batch_size = 128
in_features = 256
out_features = 128


def get_inputs():
    return [jax.random.uniform(jax.random.PRNGKey(0), (batch_size, in_features))]


def get_init_inputs():
    return [in_features, out_features]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Task:
    root = tmp_path_factory.mktemp("kb")
    return Task.read(write(root, "task.py", TASK), KERNEL)


def test_a_task_file_in_the_convention_is_a_reference_file(task):
    """Inputs: forward's, then the model's weights by attribute; the sizes are the shape grammar;
    weights left at zeros are drawn at a fresh layer's scale."""
    assert task.entry == "Model.forward"
    assert task.input_names == ("x", "weight", "bias")
    assert task.input_specs() == [((128, 256), "float32"), ((256, 128), "float32"), ((128,), "float32")]
    assert task.grammar == "batch_size=128,in_features=256,out_features=128"
    assert task.output_shape == (128, 128)
    x, w, b = task.make_inputs(3)
    assert float(w.std()) == pytest.approx(1 / np.sqrt(256), rel=0.1)
    assert float(b.std()) == pytest.approx(1 / np.sqrt(128), rel=0.3)
    assert float(x.mean()) == pytest.approx(0.5, abs=0.05)     # the example's moments, as any input


def test_the_truth_builds_the_model_with_the_drawn_weights(task):
    import jax

    x, w, b = task.make_inputs(5)
    expected = np.asarray(jax.nn.gelu(x.astype(np.float64) @ w.astype(np.float64) + b), np.float32)
    np.testing.assert_allclose(task.reference(x, w, b), expected, rtol=1e-4, atol=1e-4)


def test_module_level_sizes_are_the_shape_and_derived_sizes_follow(tmp_path):
    path = write(tmp_path, "task.py", TASK)
    small = Task.read(path, KERNEL, shape="batch_size=64,out_features=256")
    assert small.input_specs() == [((64, 256), "float32"), ((256, 256), "float32"), ((256,), "float32")]
    assert small.shape == "batch_size=64,in_features=256,out_features=256"
    with pytest.raises(ReferenceError, match="sets no module-level integer 'batch'; its shape is batch_size=128"):
        Task.read(path, KERNEL, shape="batch=64")


def test_the_kernel_is_called_through_an_appended_function(task):
    """The judge's call: the kernel's Model built with the task's init literals, each weight
    assigned to its attribute, forward called; the kernel's own copy of the sizes set to the task's."""
    source, entry = task.kernel_call(KERNEL)
    assert entry == kernelbench.ADAPTER
    tail = source[len(KERNEL):]
    assert "def pallas_evolve_forward(x, weight, bias):" in tail
    assert "model = Model(*(256, 128))" in tail and "model.weight = weight" in tail
    assert "return model.forward(x)" in tail
    ast.parse(source)
    resized = Task.read(Path(task.path), KERNEL, shape="batch_size=64").kernel_call(KERNEL)[0]
    assert "\nbatch_size = 64\n" in resized and "\nbatch_size = 128\n" not in resized


def test_the_kernel_entry_prefers_the_model_and_says_what_is_missing():
    assert kernel_entry(KERNEL, 3, model=True) == "Model.forward"
    assert kernel_entry(KERNEL.replace("class Model:", "class ModelNew:"), 3, model=True) == "ModelNew.forward"
    assert kernel_entry(KERNEL, 3, given="Model.forward", model=True) == "Model.forward"
    assert kernel_entry(KERNEL, 3) == "linear_gelu"         # a plain reference file: its functions
    with pytest.raises(ReferenceError, match="defines no 'Model.backward'"):
        kernel_entry(KERNEL, 3, given="Model.backward", model=True)
    plain = KERNEL.replace("linear_gelu(x, self.weight", "jax.nn.gelu(x @ self.weight").replace(
        "def linear_gelu(x, w, b):", "def _unused(x, w, b):")
    with pytest.raises(ReferenceError, match="nor a class Model or ModelNew whose forward calls it"):
        kernel_entry(plain, 3, model=True)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("return [in_features, out_features]", "return [object()]"),
     "get_init_inputs\\(\\) is a tuple; the judge builds the kernel's Model with literals"),
    (lambda t: t.replace("def get_init_inputs():", "def _gone():"), "defines Model but no function get_init_inputs"),
    (lambda t: t.replace("return [jax.random", "return [1, jax.random"), "get_inputs\\(\\) returns 2 arrays; "
     "Model.forward takes 1 \\(x\\)"),
    (lambda t: t.replace("self.bias = jnp.zeros((out_features,))", "self.bias = jnp.zeros((out_features,)) + x"),
     "Model\\(\\*get_init_inputs\\(\\)\\) raises NameError"),
])
def test_a_task_file_that_breaks_the_convention_is_one_line(tmp_path, edit, message):
    with pytest.raises(ReferenceError, match=message) as caught:
        Task.read(write(tmp_path, "task.py", edit(textwrap.dedent(TASK))), KERNEL)
    assert "\n" not in str(caught.value)


def test_sizes_are_spliced_where_they_stand():
    source = "a = 1\nb = (a,)  # derived\nc: int = 3\n_private = 4\nd = True\n"
    assert kernelbench.sizes(ast.parse(source)) == {"a": 1}
    assert kernelbench.with_sizes(source, {"a": 4096}) == source.replace("a = 1", "a = 4096")


def test_the_screen_lets_an_object_set_its_own_attributes_only():
    from evaluator.containment.screen import screen_source

    def screened(body: str):
        return screen_source("import jax\n" + textwrap.dedent(body), entry="f", params=("x",), keywords=())

    method = """
    class Model:
        def set_weights(self, weights):
            for name, value in weights.items():
                setattr(self, name, value)
    def f(x):
        return x
    """
    assert screened(method).ok
    for body in ("def f(x):\n    setattr(jax, 'jit', None)\n    return x\n",
                 "class M:\n    def g(self):\n        setattr(jax, 'jit', None)\ndef f(x):\n    return x\n",
                 "class M:\n    @staticmethod\n    def g(self):\n        setattr(self, 'a', 1)\n"
                 "def f(x):\n    return x\n",
                 "def f(x):\n    s = setattr\n    return x\n"):
        assert not screened(body).ok, body


def test_a_childs_file_limit_follows_the_tasks_largest_array():
    """No limit of the judge's own below what the task's arrays need (a GELU at 8192 x 8192 f32
    writes 256 MiB and a header), and the refusal says which limit it was."""
    import signal

    from evaluator import JudgeConfig
    from evaluator.containment.children import Children
    from evaluator.containment.sandbox import ChildOutcome
    from evaluator.correctness.verdicts import failure

    class Big:
        def input_specs(self):
            return [((8192, 8192), "float32")]
        output_shape = (8192, 8192)

    children = Children.__new__(Children)
    children.config = JudgeConfig()
    assert children.limits(Big()).file_bytes >= 8192 * 8192 * 4 + (1 << 20)
    killed = ChildOutcome(events=(), returncode=-signal.SIGXFSZ, timed_out_stage=None, output="",
                          output_dropped_bytes=0, wall_time_s=1.0)
    status, _, why = failure(killed, {}, 1.0)
    assert "past its size limit" in why and "RLIMIT_FSIZE" in why


@pytest.mark.judge
def test_eval_judges_a_kernel_in_the_convention_and_refuses_one_that_ignores_a_weight(judge, task):
    """As given: the wrapper-and-Model kernel PASSes against the task's model on the secret draws;
    the same kernel leaving out the bias is caught."""
    good = judge.evaluate(KERNEL, task)
    assert good.status.value == "PASS", good.error
    cheat = KERNEL.replace("acc + b_ref[...]", "acc")
    bad = judge.evaluate(cheat, task)
    assert bad.status.value == "FAIL_CORRECTNESS", (bad.status, bad.error)
    assert json.loads(task.profile)["model"]["weights"] == ["weight", "bias"]
