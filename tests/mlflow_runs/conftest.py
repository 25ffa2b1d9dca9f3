"""Make the repository importable, keep MLflow and JAX off the network and off a TPU, and share
one freshly migrated sqlite store (creating the schema takes ~2 s) by copying it per test."""

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def template_store(tmp_path_factory):
    from mlflow_runs import ensure_store

    root = tmp_path_factory.mktemp("template")
    ensure_store(root)
    return root / "mlflow.db"


@pytest.fixture
def data_dir(tmp_path, template_store):
    """A data directory whose MLflow store already has its schema."""
    import sqlite3

    data = tmp_path / "data"
    data.mkdir()
    src = sqlite3.connect(template_store)
    dst = sqlite3.connect(data / "mlflow.db")
    src.backup(dst)
    src.close()
    dst.close()
    shutil.copystat(template_store, data / "mlflow.db")
    return data
