"""A 3-D tensor times a matrix, in KernelBench's convention: (N, M, K) x (K, L) -> (N, M, L)."""

import jax
import jax.numpy as jnp


class Model:
    def __init__(self):
        pass

    def forward(self, A, B):
        return jnp.matmul(A, B)


N = 16
M = 1024
K = 2048
L = 768

# The shape the project's tests run it at (not part of KernelBench's convention; --shape's grammar).
SMALL = "N=2,M=128,K=256,L=256"


def get_inputs():
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    return [jax.random.normal(ka, (N, M, K)), jax.random.normal(kb, (K, L))]


def get_init_inputs():
    return []
