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


def register_champion(source: str, name: str, provenance: dict[str, Any], *,
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
    tags = {str(k): str(v)[:5000] for k, v in provenance.items() if v is not None}
    with tempfile.TemporaryDirectory() as tmp, _uris(uri):
        kernel = Path(tmp) / "kernel.py"
        kernel.write_text(source, encoding="utf-8")
        run = client.create_run(experiment_id, run_name=f"champion-{name}",
                                tags={"pallas_evolve.kind": "champion", **tags})
        with mlflow.start_run(run_id=run.info.run_id):
            info = mlflow.pyfunc.log_model(name="champion", python_model=str(MODEL_CODE),
                                           artifacts={"kernel": str(kernel)},
                                           pip_requirements=_requirements(),
                                           registered_model_name=name)
    version = str(info.registered_model_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.set_registered_model_alias(name, ALIAS, version)
    return client.get_model_version(name, version)
