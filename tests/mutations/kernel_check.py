"""Shared helpers for the mutation tests: load a kernel source, run it in interpret mode."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = Path(__file__).resolve().parents[2]
SEED_PATH = REPO / "seeds" / "flash_attention" / "kernel.py"
_counter = itertools.count()


def seed_source() -> str:
    return SEED_PATH.read_text()


def load_kernel(source: str, directory: str | None = None):
    """Import a kernel module from source text (written to a temporary file)."""
    directory = directory or tempfile.mkdtemp(prefix="mutated_kernel_")
    name = f"_mutated_kernel_{os.getpid()}_{next(_counter)}"
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module
