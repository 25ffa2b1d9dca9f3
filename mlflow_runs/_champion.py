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


def _signature():
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec, Schema, TensorSpec

    tensor = (-1, -1, -1, -1)     # (B, H, N, D)
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), tensor, name) for name in ("q", "k", "v")]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), tensor)]),
        params=ParamSchema([ParamSpec("causal", "boolean", True),
                            ParamSpec("sm_scale", "double", 0.0)]))   # 0: 1/sqrt(D)


def register_champion(source: str, name: str, provenance: dict[str, Any], *,
                      description: str | None = None, example_shape: tuple[int, ...] | None = None,
                      data_dir: str | os.PathLike = DEFAULT_DATA_DIR, tracking_uri: str | None = None):
    """Log ``source`` as a pyfunc model, register it as ``name`` and point alias ``champion`` at it.

    ``provenance`` (individual id, speedup, timing source, chip, libtpu version...) becomes tags of
    the model version. Load it with ``mlflow.pyfunc.load_model(f"models:/{name}@champion")``.
    Returns the ``ModelVersion``. Not best-effort: raises what MLflow raises (``name`` may not
    contain '/' or ':').
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or ensure_store(data_dir)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment_id = get_or_create_experiment(client, CHAMPION_EXPERIMENT, data_dir)
    tags = {str(k): str(v)[:5000] for k, v in provenance.items() if v is not None and str(v) != ""}
    example = None
    if example_shape is not None:      # small random q, k, v of a shape the kernel accepts
        import numpy as np

        rng = np.random.default_rng(0)
        example = {key: rng.standard_normal(example_shape).astype(np.float32) for key in ("q", "k", "v")}
    with tempfile.TemporaryDirectory() as tmp, _uris(uri):
        kernel = Path(tmp) / "kernel.py"
        kernel.write_text(source, encoding="utf-8")
        run = client.create_run(experiment_id, run_name=f"champion-{name}",
                                tags={"pallas_evolve.kind": "champion", **tags})
        with mlflow.start_run(run_id=run.info.run_id):
            info = mlflow.pyfunc.log_model(name="champion", python_model=str(MODEL_CODE),
                                           artifacts={"kernel": str(kernel)},
                                           pip_requirements=_requirements(),
                                           signature=_signature(), input_example=example,
                                           registered_model_name=name)
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if description:
        client.update_model_version(name, version, description=description)
        client.update_registered_model(name, description="Flash attention kernels promoted by pallas-evolve; "
                                       "the alias 'champion' points at the latest. Each version's "
                                       "description says what it is and how to call it.")
    client.set_registered_model_alias(name, ALIAS, version)
    return client.get_model_version(name, version)


def champion_header(*, name: str, run_id: str, individual_id: str, lineage: list[str], task, result,
                    tunables: dict[str, int], run_link: str | None) -> str:
    """The promoted kernel's module docstring: what it is, its figures, the shapes it accepts, and
    how to call it on a TPU, on a CPU and from the registry. Replaces the seed's docstring."""
    m, p = result.metrics, result.provenance
    b, h, n, d = task.shape
    blocks = [f"{k}={v}" for k, v in sorted(tunables.items()) if k.startswith("BLOCK")]
    heads = tunables.get("HEADS_PER_PROGRAM", 1)
    figures = [f"latency {m.latency_s * 1e6:.1f} us" if m.latency_s else None,
               f"{m.speedup_vs_reference:.3f}x the XLA reference" if m.speedup_vs_reference else None,
               f"{m.estimated_cycles:,} estimated cycles" if m.estimated_cycles else None]
    lines = [
        f"{name}: flash attention evolved by pallas-evolve, promoted from run {run_id}.",
        "",
        "What it is",
        f"    individual: {individual_id} ('evolve lineage {individual_id}' shows how it was made)",
        *([f"    MLflow run: {run_link}"] if run_link else []),
        "    lineage: " + " -> ".join(["seed", *lineage]),
        f"    evolved and verified for: {task.key}",
        "    figures: " + ", ".join(f for f in figures if f),
        f"    timing source: {p.timing_source} (chip {p.chip}, libtpu {p.libtpu_version}, jax {p.jax_version})",
        "",
        "Shapes it accepts",
        f"    q, k, v: (B, H, N, D) arrays of one dtype; judged at B={b}, H={h}, N={n}, D={d}, {task.dtype}, "
        f"causal={task.causal}.",
        f"    N must be a multiple of the blocks ({', '.join(blocks) or 'none'}; a block larger than N "
        "is cut to N), and a multiple of 128 when above 128.",
        f"    H must be a multiple of HEADS_PER_PROGRAM={heads}." if heads > 1 else
        "    Any H (one head per program).",
        "    Other shapes, dtypes and causal settings compile but were not judged: check them with",
        "    'evolve eval THIS_FILE --shape B=..,H=..,N=..,D=..' before relying on them.",
        "",
        "How to call it",
        "    On a TPU:",
        "        from champion import flash_attention",
        f"        out = flash_attention(q, k, v, causal={task.causal}, sm_scale=q.shape[-1] ** -0.5)",
        "    On a CPU (Pallas' TPU interpreter: slow, for checking, not for speed):",
        "        from jax.experimental.pallas import tpu as pltpu",
        "        with pltpu.force_tpu_interpret_mode():",
        f"            out = flash_attention(q, k, v, causal={task.causal}, sm_scale=q.shape[-1] ** -0.5)",
        "    From the MLflow model registry (either backend):",
        f"        model = mlflow.pyfunc.load_model('models:/{name}@champion')",
        f"        out = model.predict({{'q': q, 'k': k, 'v': v}}, params={{'causal': {task.causal}}})",
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
