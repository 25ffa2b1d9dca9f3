"""The champion as an MLflow pyfunc model (a models-from-code file: MLflow copies and runs it).

Self-contained on purpose: it imports nothing from pallas-evolve, so ``mlflow.pyfunc.load_model``
works in a fresh process where the project is not installed. The kernel source is the model's
artifact ``kernel``; it must define ``flash_attention(q, k, v, *, causal, sm_scale)``.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid

import mlflow
from mlflow.pyfunc import PythonModel


class KernelModel(PythonModel):
    """``predict({"q": q, "k": k, "v": v}, params={"causal": True, "sm_scale": s})`` -> the
    attention output as numpy (``sm_scale`` 0 or absent: 1/sqrt(D)). ``causal`` and ``sm_scale``
    may also be keys of the input itself."""

    def load_context(self, context):
        path = context.artifacts["kernel"]
        name = f"_pallas_evolve_champion_{uuid.uuid4().hex}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        self._kernel = module.flash_attention

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would validate
        import contextlib

        import jax
        import jax.numpy as jnp
        import numpy as np

        q, k, v = (jnp.asarray(model_input[name]) for name in ("q", "k", "v"))
        params = {**{key: model_input[key] for key in ("causal", "sm_scale") if key in model_input},
                  **(params or {})}
        causal = bool(params.get("causal", True))
        sm_scale = float(params.get("sm_scale") or 0.0) or 1.0 / float(np.sqrt(q.shape[-1]))
        interpret = contextlib.nullcontext()
        if jax.default_backend() != "tpu":
            from jax.experimental.pallas import tpu as pltpu

            interpret = pltpu.force_tpu_interpret_mode()
        with interpret:
            out = self._kernel(q, k, v, causal=causal, sm_scale=sm_scale)
            return np.asarray(jax.block_until_ready(out))


mlflow.models.set_model(KernelModel())
