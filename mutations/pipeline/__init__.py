"""Operators for the structure of any Pallas kernel's pipeline, whatever it computes: what work its
stores absorb (a fused epilogue)."""
