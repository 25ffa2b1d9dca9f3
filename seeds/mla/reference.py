"""DeepSeek-V3's multi-head latent attention (MLA) for prefill, bf16, as JAXBench's baseline (from
MaxText) computes it: x (B, S, E) through a query LoRA (E -> q_lora_rank -> H * (nope + rope)), a
key/value LoRA (E -> kv_lora_rank latent + one rope key shared by all heads; the latent up to H
heads' nope keys and values), rotary embedding on the rope parts (interleaved pairs, theta 10000),
causal softmax attention over nope + rope = 192 wide heads, and the output projection. No norms on
the latents. DeepSeek-V3 671B: B=4, S=2048, E=7168, 128 heads, q_lora 1536, kv_lora 512, nope 128,
rope 64, v 128. Compute-bound: 3.75 TFLOP of useful work (4.44 as written, the masked half of the
scores included) against 0.61 GB of inputs and output."""

import jax
import jax.numpy as jnp
import numpy as np

SMALL = "B=1,S=128,E=256,H=4,QL=128,KVL=128,NOPE=64,ROPE=64,VD=64"     # the shape the tests run it at
SIGNATURE = ("x: bf16[B,S,E], q_down_proj: bf16[E,Q], q_up_proj: bf16[Q,HQ], kv_down_proj: bf16[E,CR], "
             "k_up_proj: bf16[C,HN], v_up_proj: bf16[C,HV], o_proj: bf16[HV,E] -> bf16[B,S,E]")
UNITS = "B"     # batch rows are independent (seeds/units.py: model-sized checks)
ROPE_THETA = 10000.0
# The workload rounds to bf16 at every step (latents, queries, keys, scores, probabilities, values):
# its own XLA program misses bf16's 2e-2 by up to 0.041 on normal draws at SMALL (kernel: 0.022).
TOLERANCE = (6e-2, 2e-2)


def create_inputs(B=4, S=2048, E=7168, H=128, QL=1536, KVL=512, NOPE=128, ROPE=64, VD=128):
    """JAXBench's inputs: x ~ N(0, 1) and each weight N(0, 0.02^2) at DeepSeek-V3's sizes; at other
    sizes a weight's spread follows its fan-in, so the activations keep the model's scale."""
    rng = np.random.default_rng(42)       # numpy: 1.4 GB of weights in seconds, not jax.random's minute

    def weight(fan_in, fan_out, model_fan_in):
        w = rng.standard_normal((fan_in, fan_out), np.float32)
        w *= 0.02 * (model_fan_in / fan_in) ** 0.5
        return w.astype(jnp.bfloat16)

    x = rng.standard_normal((B, S, E), np.float32).astype(jnp.bfloat16)
    q_down_proj = weight(E, QL, 7168)
    q_up_proj = weight(QL, H * (NOPE + ROPE), 1536)
    kv_down_proj = weight(E, KVL + ROPE, 7168)
    k_up_proj = weight(KVL, H * NOPE, 512)
    v_up_proj = weight(KVL, H * VD, 512)
    o_proj = weight(H * VD, E, 16384)
    return x, q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj


def sizes(q_up_proj, kv_down_proj, k_up_proj, v_up_proj):
    """(heads, nope, rope, v, kv_lora) as the weights' shapes give them."""
    kvl = k_up_proj.shape[0]
    rope = kv_down_proj.shape[1] - kvl
    heads = (q_up_proj.shape[1] - k_up_proj.shape[1]) // rope
    return heads, k_up_proj.shape[1] // heads, rope, v_up_proj.shape[1] // heads, kvl


def _compute_rope(head_dim, seq_len, theta, dtype):
    freqs = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.outer(jnp.arange(seq_len, dtype=jnp.float32), freqs)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def _apply_rope(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def workload(x, q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj):
    B, S, _ = x.shape
    H, nope, rope, vd, kvl = sizes(q_up_proj, kv_down_proj, k_up_proj, v_up_proj)
    q = jnp.dot(jnp.dot(x, q_down_proj), q_up_proj).reshape(B, S, H, nope + rope)
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    kv = jnp.dot(x, kv_down_proj)
    k_latent, k_rope_raw = kv[..., :kvl], kv[..., kvl:]
    k_nope = jnp.dot(k_latent, k_up_proj).reshape(B, S, H, nope)
    cos, sin = _compute_rope(rope, S, ROPE_THETA, x.dtype)
    k_rope = jnp.broadcast_to(k_rope_raw[:, :, None, :], (B, S, H, rope))
    q_rope = _apply_rope(q_rope, cos, sin)
    k_rope = _apply_rope(k_rope, cos, sin)
    v = jnp.dot(k_latent, v_up_proj).reshape(B, S, H, vd)
    q_full = jnp.concatenate([q_nope, q_rope], axis=-1).transpose(0, 2, 1, 3)
    k_full = jnp.concatenate([k_nope, k_rope], axis=-1).transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    attn = jnp.einsum("bhqd,bhkd->bhqk", q_full, k_full) * ((nope + rope) ** -0.5)
    attn = jnp.where(jnp.tril(jnp.ones((S, S))), attn, -1e9)
    attn = jax.nn.softmax(attn, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", attn, v)
    out = out.transpose(0, 2, 1, 3).reshape(B, S, H * vd)
    return jnp.dot(out, o_proj)


def flops(x, q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj):
    """The useful work as the model writes it: the six projections, and the attention's two
    matmuls over the causal pairs only (XLA's count includes the masked half)."""
    B, S, _ = x.shape
    H, nope, rope, vd, _ = sizes(q_up_proj, kv_down_proj, k_up_proj, v_up_proj)
    tokens, pairs = B * S, B * S * (S + 1) // 2
    weights = (q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj)
    projections = 2 * tokens * sum(w.size for w in weights)
    return projections + 2 * pairs * H * (nope + rope + vd)
