"""Operators for attention kernels: the softmax (compact statistics, deferred normalisation, exp2,
an approximate reciprocal), the causal mask (block skipping, diagonal strips) and head coarsening.
Elsewhere they answer "not applicable"."""
