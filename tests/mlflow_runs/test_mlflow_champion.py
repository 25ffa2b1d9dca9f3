"""The champion registry: register a kernel source, load it back by alias, predict."""

from __future__ import annotations

import mlflow
import numpy as np

from mlflow_runs import register_champion, tracking_uri_for

CALL = {"entry": "flash_attention", "inputs": [["q", 4, "float32"], ["k", 4, "float32"], ["v", 4, "float32"]],
        "params": {"causal": True, "sm_scale": 1.0}}

KERNEL = '''
import jax
import jax.numpy as jnp


def flash_attention(q, k, v, *, causal, sm_scale):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * sm_scale
    if causal:
        n = q.shape[2]
        s = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
'''


def reference(q, k, v, sm_scale):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * sm_scale
    n = q.shape[2]
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def test_register_champion_round_trips_through_the_registry(data_dir):
    version = register_champion(KERNEL, "attn-champion", {"individual_id": "abc123", "speedup": 1.7,
                                                           "timing_source": "compiler_estimate"},
                                call=CALL, data_dir=data_dir)
    assert str(version.version) == "1" and version.tags["speedup"] == "1.7"
    second = register_champion(KERNEL.replace("sm_scale\n", "sm_scale  # v2\n"), "attn-champion",
                               {"speedup": 1.8}, call=CALL, data_dir=data_dir)
    assert str(second.version) == "2"
    uri = tracking_uri_for(data_dir)
    previous = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        client = mlflow.MlflowClient()
        assert str(client.get_model_version_by_alias("attn-champion", "champion").version) == "2"
        model = mlflow.pyfunc.load_model("models:/attn-champion@champion")
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 128, 128), dtype=np.float32) for _ in range(3))
    out = model.predict({"q": q, "k": k, "v": v}, params={"sm_scale": 128 ** -0.5})
    assert isinstance(out, np.ndarray) and out.shape == (1, 1, 128, 128)
    np.testing.assert_allclose(out, reference(q, k, v, 128 ** -0.5), atol=1e-4, rtol=1e-4)
    assert not list(data_dir.parent.glob("mlruns")) and (data_dir / "mlartifacts").is_dir()


def test_the_registered_decode_champion_calls_the_decode_kernel(data_dir):
    """Any seed: the model calls the seed's entry point with its inputs and judged keywords."""
    from mlflow_runs import call_spec, example_inputs
    from seeds import load_seed

    seed = load_seed("flash_decoding")
    task = seed.task("B=2,H=4,HKV=2,N=512,D=128,T=1")
    example = example_inputs(task, {})
    assert set(example) == {"q", "k", "v", "lengths"} and example["lengths"].dtype == np.int32
    register_champion(seed.kernel_source, "decode-champion", {"task_key": task.key}, call=call_spec(task),
                      example=example, data_dir=data_dir)
    uri = tracking_uri_for(data_dir)
    previous = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        model = mlflow.pyfunc.load_model("models:/decode-champion@champion")
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])
    small = task.example_task({})
    q, k, v, lengths = small.make_inputs(1, "ragged")
    out = model.predict({"q": q, "k": k, "v": v, "lengths": lengths})
    assert out.shape == q.shape
    np.testing.assert_allclose(out, small.reference(q, k, v, lengths), atol=1e-4, rtol=1e-4)
