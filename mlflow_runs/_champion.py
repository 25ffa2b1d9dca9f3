"""The champion registry: the best kernel source as a registered pyfunc model, alias ``champion``."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import Any

from ._store import DEFAULT_DATA_DIR, ensure_store, get_or_create_experiment

MODEL_CODE = Path(__file__).with_name("champion_model.py")
CHAMPION_EXPERIMENT = "pallas_evolve-champions"
ALIAS = "champion"


def _requirements() -> list[str]:
    out = []
    for package in ("mlflow", "jax", "jaxlib", "numpy"):
        try:
            out.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(package)
    return out


@contextlib.contextmanager
def _uris(uri: str):
    """Point MLflow's fluent API at ``uri`` for the block; put the previous URIs back after."""
    import mlflow

    previous = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])


_PARAM_TYPES = {bool: "boolean", int: "long", float: "double", str: "string"}


def call_spec(task) -> dict[str, Any]:
    """How the registered model calls a seed's kernel: its entry point, its inputs (name, rank,
    dtype) and its keyword arguments with the values the kernel was judged with."""
    return {"entry": task.entry, "inputs": [[name, len(shape), dtype]
                                            for name, (shape, dtype) in zip(task.input_names, task.input_specs(),
                                                                            strict=True)],
            "params": dict(task.kernel_kwargs())}


def example_inputs(task, tunables: dict[str, int]) -> dict[str, Any] | None:
    """The input example: the seed's small float32 problem for these tunables, if it has one."""
    small = task.example_task(tunables)
    if small is None:
        return None
    arrays = small.make_inputs(0, small.distributions[0])
    return dict(zip(small.input_names, arrays, strict=True))


def _signature(call: dict[str, Any]):
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec, Schema, TensorSpec

    def dtype(name: str):
        return np.dtype(np.float32) if name in ("bfloat16", "float16") else np.dtype(name)

    inputs = [TensorSpec(dtype(dt), (-1,) * rank, name) for name, rank, dt in call["inputs"]]
    first = call["inputs"][0]
    params = [ParamSpec(k, _PARAM_TYPES[type(v)], v) for k, v in call["params"].items() if type(v) in _PARAM_TYPES]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([TensorSpec(dtype(first[2]), (-1,) * first[1])]),
                          params=ParamSchema(params) if params else None)


def register_champion(source: str, name: str, provenance: dict[str, Any], *, call: dict[str, Any],
                      description: str | None = None, example: dict[str, Any] | None = None,
                      data_dir: str | os.PathLike = DEFAULT_DATA_DIR, tracking_uri: str | None = None):
    """Log ``source`` as a pyfunc model, register it as ``name`` and point alias ``champion`` at it.

    ``call`` (see :func:`call_spec`) says how the model calls the kernel; ``example`` is an input
    example. ``provenance`` (individual id, speedup, timing source, chip, libtpu version...)
    becomes tags of the model version. Load it with
    ``mlflow.pyfunc.load_model(f"models:/{name}@champion")``. Returns the ``ModelVersion``. Not
    best-effort: raises what MLflow raises (``name`` may not contain '/' or ':').
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or ensure_store(data_dir)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment_id = get_or_create_experiment(client, CHAMPION_EXPERIMENT, data_dir)
    tags = {str(k): str(v)[:5000] for k, v in provenance.items() if v is not None and str(v) != ""}
    if example is not None:     # the signature's dtypes: floats as float32
        import numpy as np

        example = {k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" or "bfloat16" in str(
            np.asarray(v).dtype) else np.asarray(v) for k, v in example.items()}
    with tempfile.TemporaryDirectory() as tmp, _uris(uri):
        kernel = Path(tmp) / "kernel.py"
        kernel.write_text(source, encoding="utf-8")
        run = client.create_run(experiment_id, run_name=f"champion-{name}",
                                tags={"pallas_evolve.kind": "champion", **tags})
        with mlflow.start_run(run_id=run.info.run_id):
            info = mlflow.pyfunc.log_model(name="champion", python_model=str(MODEL_CODE),
                                           artifacts={"kernel": str(kernel)}, model_config=call,
                                           pip_requirements=_requirements(),
                                           signature=_signature(call), input_example=example,
                                           registered_model_name=name)
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if description:
        client.update_model_version(name, version, description=description)
        client.update_registered_model(name, description="Pallas kernels promoted by pallas-evolve; "
                                       "the alias 'champion' points at the latest. Each version's "
                                       "description says what it is and how to call it.")
    client.set_registered_model_alias(name, ALIAS, version)
    return client.get_model_version(name, version)


def _task_flags(task) -> str:
    """The flags that name ``task`` on the command line: a reference file's path, or a seed's name."""
    if task.name == "reference" and getattr(task, "path", None):
        return f"--reference {task.path} --entry {task.entry}"
    return f"--seed {task.name}"


def champion_header(*, name: str, run_id: str, individual_id: str, lineage: list[str], task, result,
                    tunables: dict[str, int], run_link: str | None) -> str:
    """The promoted kernel's module docstring: what it is, its figures, the inputs it was judged
    on, and how to call it on a TPU, on a CPU and from the registry. Replaces the seed's docstring."""
    m, p = result.metrics, result.provenance
    figures = [f"latency {m.latency_s * 1e6:.1f} us" if m.latency_s else None,
               f"{m.speedup_vs_reference:.3f}x the XLA reference" if m.speedup_vs_reference else None,
               f"{m.estimated_cycles:,} estimated cycles" if m.estimated_cycles else None,
               f"HBM bandwidth utilisation {m.hbm_util:.0%}" if m.hbm_util and m.regime == "memory-bound" else None]
    inputs = ", ".join(task.input_names)
    kwargs = ", ".join(f"{k}={v!r}" for k, v in task.kernel_kwargs().items())
    call = f"{task.entry}({inputs}{', ' + kwargs if kwargs else ''})"
    specs = [f"    {n}: {tuple(shape)} {dtype}" for n, (shape, dtype) in zip(task.input_names, task.input_specs(),
                                                                            strict=True)]
    lines = [
        f"{name}: {task.name} evolved by pallas-evolve, promoted from run {run_id}.",
        "",
        "What it is",
        f"    {task.description}",
        f"    individual: {individual_id} ('evolve lineage {individual_id}' shows how it was made)",
        *([f"    MLflow run: {run_link}"] if run_link else []),
        "    lineage: " + " -> ".join(["seed", *lineage]),
        f"    evolved and verified for: {task.key}",
        "    figures: " + ", ".join(f for f in figures if f),
        f"    timing source: {p.timing_source} (chip {p.chip}, libtpu {p.libtpu_version}, jax {p.jax_version})",
        "    tunables: " + (", ".join(f"{k}={v}" for k, v in sorted(tunables.items())) or "none"),
        "",
        "The inputs it was judged on",
        *specs,
        "    Other shapes and dtypes may compile but were not judged: check them with",
        f"    'evolve eval THIS_FILE {_task_flags(task)} --shape ...' before relying on them.",
        "",
        "How to call it",
        "    On a TPU:",
        f"        from champion import {task.entry}",
        f"        out = {call}",
        "    On a CPU (Pallas' TPU interpreter: slow, for checking, not for speed):",
        "        from jax.experimental.pallas import tpu as pltpu",
        "        with pltpu.force_tpu_interpret_mode():",
        f"            out = {call}",
        "    From the MLflow model registry (either backend; keywords default to the judged values):",
        f"        model = mlflow.pyfunc.load_model('models:/{name}@champion')",
        "        out = model.predict({" + ", ".join(f"'{n}': {n}" for n in task.input_names) + "})",
    ]
    return "\n".join(lines)


def with_docstring(source: str, docstring: str) -> str:
    """``source`` with its module docstring replaced by (or, if it has none, given) ``docstring``."""
    import ast

    text = '"""' + docstring.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""\n'
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        lines = source.splitlines(keepends=True)
        return text + "".join(lines[body[0].end_lineno:])
    return text + "\n" + source
