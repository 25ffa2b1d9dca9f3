"""The local MLflow store of a data directory: sqlite tracking + registry, file artifacts."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import sqlite3
from pathlib import Path

from archive import DEFAULT_DATA_DIR  # re-exported: the data directory has one home, the archive

DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def tracking_uri_for(data_dir: str | os.PathLike) -> str:
    """``sqlite:///<abs data_dir>/mlflow.db`` (does not create anything)."""
    return f"sqlite:///{Path(data_dir).resolve() / DB_NAME}"


def artifact_location(data_dir: str | os.PathLike, experiment_name: str) -> str:
    """A ``file://`` location under ``<data_dir>/mlartifacts`` for one experiment."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment_name).strip("_")[:80]
    digest = hashlib.sha256(experiment_name.encode()).hexdigest()[:8]
    return (Path(data_dir).resolve() / ARTIFACTS_DIR / f"{slug}-{digest}").as_uri()


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_store(data_dir: str | os.PathLike = DEFAULT_DATA_DIR) -> str:
    """Create the sqlite store's schema (tracking and registry) once; return the tracking URI.

    Call it in the parent process before any worker starts: MLflow's first use of a new sqlite
    file races when several processes do it at once. A file lock makes a concurrent call wait
    rather than race, and the database is switched to WAL so readers do not block the writer.
    Raises whatever MLflow or the file system raises (the Tracker turns that into a warning).
    """
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    root = Path(data_dir).resolve()
    (root / ARTIFACTS_DIR).mkdir(parents=True, exist_ok=True)
    uri = tracking_uri_for(root)
    with _file_lock(root / f".{DB_NAME}.lock"):
        with contextlib.closing(sqlite3.connect(root / DB_NAME, timeout=30)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        SqlAlchemyStore(uri, (root / ARTIFACTS_DIR).as_uri())
        RegistryStore(uri)
    return uri


def get_or_create_experiment(client, name: str, data_dir: str | os.PathLike) -> str:
    """The id of experiment ``name``, created with its artifacts inside the data directory."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(data_dir, name),
                                        tags={"pallas_evolve.task_key": name})
    except MlflowException:   # another process created it in between
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
