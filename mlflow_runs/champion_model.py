"""The champion as an MLflow pyfunc model (a models-from-code file: MLflow copies and runs it).

Self-contained on purpose: it imports nothing from pallas-evolve, so ``mlflow.pyfunc.load_model``
works in a fresh process where the project is not installed. The kernel source is the model's
artifact ``kernel``; the model's config (``model_config``) says how to call it:
``{"entry": name, "inputs": [[name, rank, dtype], ...] (positional), "params": {keyword: judged
value}}``.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid

import mlflow
from mlflow.pyfunc import PythonModel


class KernelModel(PythonModel):
    """``predict({name: array for each input}, params={keyword: value})`` -> the kernel's output
    as numpy. Keywords default to the values the kernel was judged with. Off a TPU the kernel runs
    in Pallas' TPU interpreter."""

    def load_context(self, context):
        config = dict(context.model_config or {})
        self._entry = config["entry"]
        self._inputs = [i[0] if isinstance(i, (list, tuple)) else i for i in config["inputs"]]
        self._params = dict(config.get("params") or {})
        path = context.artifacts["kernel"]
        name = f"_pallas_evolve_champion_{uuid.uuid4().hex}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        self._kernel = getattr(module, self._entry)

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would validate
        import contextlib

        import jax
        import jax.numpy as jnp
        import numpy as np

        arrays = [jnp.asarray(model_input[name]) for name in self._inputs]
        kwargs = {**self._params, **{k: v for k, v in (params or {}).items() if k in self._params}}
        kwargs = {k: type(self._params[k])(np.asarray(v).item()) for k, v in kwargs.items()}
        interpret = contextlib.nullcontext()
        if jax.default_backend() != "tpu":
            from jax.experimental.pallas import tpu as pltpu

            interpret = pltpu.force_tpu_interpret_mode()
        with interpret:
            out = self._kernel(*arrays, **kwargs)
            return np.asarray(jax.block_until_ready(out))


mlflow.models.set_model(KernelModel())
