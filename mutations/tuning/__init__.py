"""Operators for the tunables any Pallas kernel has, whatever it computes: its block sizes (as
module constants or as a production module's block fields), its VMEM limit and the semantics of
its grid's dimensions."""
