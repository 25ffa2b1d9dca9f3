"""A sparse mixture-of-experts layer, bf16 in, f32 out (Mixtral 8x7B: batch 2, 4096 tokens, 4096
wide, 8 experts of 14336, each token routed to its top 2; JAXBench's 10p_Sparse_MoE, from MaxText).
The router's logits x @ W_r pick each token's two experts, a softmax over those two logits weighs
them; the program computes EVERY expert's SwiGLU (SiLU(x Wg_e) * (x Wu_e)) Wd_e densely and sums
the experts' outputs weighted by the routing probabilities (zero for the six unrouted ones).

Useful work (``flops``): only the routed experts, 2 of 8, a quarter of the program's expert
matmuls (XLA's count is of all 8: 23.1 TFLOP at the default shape, against 5.8 TFLOP routed),
plus the router. Bytes: the experts' weights alone are 2.8 GB (8 x 3 x 4096 x 14336 bf16)."""

import jax
import jax.numpy as jnp
import numpy as np

SMALL = "B=1,S=64,D=256,F=512,E=8"     # the shape the tests run it at
SIGNATURE = ("x: bf16[B,S,D], router_weights: bf16[D,E], expert_gate_kernels: bf16[E,D,F], "
             "expert_up_kernels: bf16[E,D,F], expert_down_kernels: bf16[E,F,D] -> f32[B,S,D]")
UNITS = "B,S"   # every token is routed and computed alone (seeds/units.py: model-sized checks)
TOP_K = 2                              # experts per token (Mixtral's num_experts_per_tok)
# The output is f32 but the work is bf16 (the program rounds its hidden activations to bf16, as any
# kernel that feeds them to the MXU does): an element's error follows the size of the terms it
# sums (up to 0.06 with rtol 0.02 on outlier draws of SMALL for a kernel with one rounding of h,
# whose outputs are about 1.5; the program's is 2 to 4 times that). The precision rule (99th
# percentile and mean error against the program's) is what holds a kernel's precision.
TOLERANCE = (0.15, 0.02)


def create_inputs(B=2, S=4096, D=4096, F=14336, E=8):
    """x ~ N(0, 1), every weight normal with JAXBench's spread, 0.02, at its widths (D = 4096,
    F = 14336), scaled with 1/sqrt(fan-in) at others so that a small shape's output is as large
    as the model's (about 1.5), not a hundred times smaller. numpy: 2.8 GB of expert weights in
    seconds, one expert at a time, where jax.random takes minutes."""
    rng = np.random.default_rng(0)
    std_d, std_f = 0.02 * (4096 / D) ** 0.5, 0.02 * (14336 / F) ** 0.5
    x = rng.standard_normal((B, S, D), np.float32).astype(jnp.bfloat16)
    router = (rng.standard_normal((D, E), np.float32) * std_d).astype(jnp.bfloat16)
    experts = []
    for shape, std in (((D, F), std_d), ((D, F), std_d), ((F, D), std_f)):
        w = np.empty((E, *shape), jnp.bfloat16)
        for e in range(E):
            w[e] = (rng.standard_normal(shape, np.float32) * np.float32(std)).astype(jnp.bfloat16)
        experts.append(w)
    return (x, router, *experts)


def workload(x, router_weights, expert_gate_kernels, expert_up_kernels, expert_down_kernels):
    n = router_weights.shape[-1]
    logits = jnp.dot(x, router_weights)
    top_k_logits, top_k_indices = jax.lax.top_k(logits, TOP_K)
    router_probs = jax.nn.softmax(top_k_logits, axis=-1)
    gate_out = jax.nn.silu(jnp.einsum("bse,nem->bsnm", x, expert_gate_kernels))
    up_out = jnp.einsum("bse,nem->bsnm", x, expert_up_kernels)
    hidden = gate_out * up_out
    expert_outputs = jnp.einsum("bsnm,nme->bsne", hidden, expert_down_kernels)
    weighted = jax.nn.one_hot(top_k_indices, n) * router_probs[..., None]
    expert_weights = weighted.sum(axis=2)
    return jnp.einsum("bsne,bsn->bse", expert_outputs, expert_weights)


def flops(x, router_weights, expert_gate_kernels, expert_up_kernels, expert_down_kernels):
    """The router and the routed experts only: each token meets TOP_K experts' three matmuls (the
    program's dense einsums, which XLA counts, do all of them: four times the expert work)."""
    b, s, d = x.shape
    e, _, f = expert_gate_kernels.shape
    return 2 * b * s * d * e + 2 * b * s * TOP_K * 3 * d * f
