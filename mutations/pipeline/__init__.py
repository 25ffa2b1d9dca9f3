"""Operators for the structure of any Pallas kernel's pipeline, whatever it computes: the order its
grid walks (grid_order), where a reduction accumulates (accumulator) and what work its stores
absorb (fuse_epilogue)."""
