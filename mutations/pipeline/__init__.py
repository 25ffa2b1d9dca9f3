"""Operators for the structure of any Pallas kernel's pipeline, whatever it computes: the order its
grid walks (grid_order), where a reduction accumulates (accumulator), what work its stores absorb
(fuse_epilogue) or what sum of its output it writes as partial sums (fuse_reduction), what its MXU is fed
(mxu_operands) and how deep an input's pipeline is (buffering)."""
