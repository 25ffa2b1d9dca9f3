"""KernelBench's convention, both ways: a task file, and a kernel file, written as a ``Model``.

JAXBench, KernelBench and most benchmarks of LLM-written kernels write a task as::

    class Model:
        def __init__(self, in_features, out_features):
            self.weight = jnp.zeros((in_features, out_features))   # weights: array attributes
            self.bias = jnp.zeros((out_features,))
        def forward(self, x):
            return jax.nn.gelu(x @ self.weight + self.bias)

    batch_size = 1024          # module-level integer sizes: the task's --shape grammar
    in_features = 8192
    out_features = 8192

    def get_inputs():          # example inputs, as arrays
        return [jax.random.uniform(jax.random.PRNGKey(0), (batch_size, in_features))]

    def get_init_inputs():     # what Model is built with (sizes, not arrays)
        return [in_features, out_features]

and a kernel for it as the same file whose ``Model`` (or ``ModelNew``) has a ``forward`` that
reaches ``pallas_call``.

**As a reference file** (``--reference task.py``): the task's inputs are ``get_inputs()``'s arrays,
named as ``forward`` names them, then the model's weights: every array attribute of
``Model(*get_init_inputs())`` in the order its ``__init__`` sets them, named as the attribute. Each
is drawn in secret like any input (a weight the file leaves at zeros, as these files do, is drawn
at a fresh layer's scale: spread ``1/sqrt(fan_in)``, its first dimension; ``SPREAD_OF_ZEROS``).
The workload builds ``Model(*init)``, assigns the drawn weights to its attributes and calls
``forward``. Module-level integer constants are the ``--shape`` grammar
(``--shape batch_size=128,in_features=256``): the file runs with those assignments changed, so
sizes derived from them (``bias_shape = (out_features,)``) follow.

**As a kernel**: the judge calls it through a function appended to the kernel's text
(:func:`adapter`): it builds the kernel's ``Model(*init)`` with the task's init arguments written as
literals, assigns each weight to the attribute the task's model holds it in (the weights are
handed over as the task's model holds them; a ``set_weights`` of the kernel is not called) and
returns ``forward(*inputs)``. The operators edit the kernel's own text; the appended call is the
judge's, rebuilt for every judgement.
"""

from __future__ import annotations

import ast
import math
from typing import Any

MODEL_CLASSES = ("ModelNew", "Model")     # a kernel's class, in the order looked for
ADAPTER = "pallas_evolve_forward"         # the function the judge appends and calls


def is_task(tree: ast.Module) -> bool:
    """Whether a file is a task in the convention: a class ``Model`` and ``get_inputs`` (and not
    a reference file of our own convention, ``create_inputs`` and ``workload``)."""
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return "Model" in names and "get_inputs" in names and not {"create_inputs", "workload"} <= names


def sizes(tree: ast.Module) -> dict[str, int]:
    """The module-level integer constants (``batch_size = 1024``): the task's shape grammar."""
    found: dict[str, int] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int
                and not node.targets[0].id.startswith("_")):
            found[node.targets[0].id] = node.value.value
    return found


def with_sizes(source: str, given: dict[str, int]) -> str:
    """``source`` with the module-level assignments of ``given``'s names set to its values (the
    text spliced, so line numbers hold)."""
    if not given:
        return source
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in given and isinstance(node.value, ast.Constant)):
            v = node.value
            edits.append((v.lineno - 1, v.col_offset, v.end_col_offset, str(given[node.targets[0].id])))
    for line, start, end, text in sorted(edits, reverse=True):   # later edits first: offsets hold
        raw = lines[line].encode()
        lines[line] = (raw[:start] + text.encode() + raw[end:]).decode()
    return "".join(lines)


SPREAD_OF_ZEROS = "1/sqrt(fan_in)"


def spread_of_zeros(shape: tuple[int, ...]) -> float:
    """The spread a weight left at zeros is drawn with: a fresh layer's, ``1/sqrt(fan_in)`` with
    the first dimension as fan-in (JAXBench holds a linear layer's weight as (in, out)); a bias or
    scale (one dimension) by its own size."""
    return 1.0 / math.sqrt(max(1, shape[0])) if shape else 1.0


def literal(value: Any, what: str) -> str:
    """``value`` as Python literal text that evaluates back to it; ValueError naming ``what``."""
    text = repr(value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value)
    try:
        ok = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"{what} is a {type(value).__name__}; the judge builds the kernel's Model with "
                         "literals: return ints, floats, bools, strings, None or tuples of them")
    return text


def model_methods(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The ``forward`` of each of the module's model classes (``ModelNew``, ``Model``)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in MODEL_CLASSES:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    found[node.name] = item
    return found


def referred(fn: ast.FunctionDef) -> set[str]:
    """Every name and attribute name a function's body refers to."""
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(fn)
            if isinstance(n, (ast.Attribute, ast.Name))}


def kernel_model(tree: ast.Module, reaches: set[str], given: str | None = None) -> str | None:
    """The kernel's entry in the convention, ``"<Class>.forward"``: ``given`` if it names one, else
    the first of ``ModelNew``, ``Model`` whose ``forward`` reaches ``pallas_call`` (itself, or
    through ``reaches``, the module's functions that do); None where there is none."""
    methods = model_methods(tree)
    if given is not None:
        cls, _, method = given.partition(".")
        return given if method == "forward" and cls in methods else None
    for cls in MODEL_CLASSES:
        fn = methods.get(cls)
        if fn is None:
            continue
        names = referred(fn)
        if "pallas_call" in names or names & reaches:
            return f"{cls}.forward"
    return None


def adapter(entry: str, model: dict[str, Any], names: list[str]) -> str:
    """The function the judge appends to a kernel in the convention and calls: ``names`` are the
    task's input names (forward's inputs, then the weights' parameter names); ``model`` what the
    task's child read: its init literal, the count of forward's inputs, the weights' attributes."""
    cls = entry.partition(".")[0]
    inputs, weights = names[:model["inputs"]], names[model["inputs"]:]
    body = [f"def {ADAPTER}({', '.join(names)}):",
            f"    model = {cls}(*{model['init']})"]
    body += [f"    model.{attr} = {param}" for attr, param in zip(model["weights"], weights, strict=True)]
    body.append(f"    return model.forward({', '.join(inputs)})")
    return "\n\n\n" + "\n".join(body) + "\n"
